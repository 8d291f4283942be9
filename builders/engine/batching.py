"""Batches that shrink when memory runs out: a batch that does not fit is halved and retried.

Every model stage runs its work through one `ShrinkingBatches` (per stage object, so a size that
did not fit is not tried again for the next row). When a batch raises an out-of-memory error
(`torch.OutOfMemoryError`, or a RuntimeError that accelerate's `should_reduce_batch_size`
recognises: CUDA/HIP/XPU/MPS/CPU allocator messages), the device cache is freed, the size is
halved and the *same* items are run again in smaller batches; items already done are kept. The
size never grows back. Below one item the stage stops with one clear error naming it.

Outputs do not depend on this: every stage draws per-item randomness from per-item seeds
(`builders.engine.seeding`), so an item's result is the same whatever batch it ran in. A failed
attempt's partial results are discarded, so each item appears exactly once in the output.

accelerate's `find_executable_batch_size` restarts a whole function at a smaller size (and
shrinks by 10%); a stage that streams rows needs the retry per batch instead, hence this module.

Example:
    >>> batches = ShrinkingBatches("demo", 4)
    >>> batches.map(list(range(6)), lambda chunk: [x * 10 for x in chunk])
    [0, 10, 20, 30, 40, 50]
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

from builders.engine.errors import UserFacingError

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: What to try when even one item does not fit (the stage may name its own resolution option).
DEFAULT_HINT = "try a smaller resolution, --dtype fp16, or a GPU with more memory"


class BatchTooLargeError(UserFacingError):
    """Even a batch of one item does not fit in memory."""


def is_out_of_memory(err: Exception) -> bool:
    """True for the errors accelerate treats as "reduce the batch size"."""
    # Imported here: stages that import this module stay importable without torch (--help).
    import torch
    from accelerate.utils.memory import should_reduce_batch_size

    return isinstance(err, torch.OutOfMemoryError) or should_reduce_batch_size(err)


def slices(items: Sequence[T], size: int) -> list[Sequence[T]]:
    """Consecutive slices of at most `size` items (works for lists and tensors)."""
    return [items[start : start + size] for start in range(0, len(items), size)]


class ShrinkingBatches:
    """The batch size of one stage, halved on out-of-memory and logged once it has worked.

    `size` is the configured batch size; `stage` names the stage in the log and the error;
    `hint` says what to change when one item does not fit.
    """

    def __init__(self, stage: str, size: int, hint: str = DEFAULT_HINT) -> None:
        self.stage, self.hint = stage, hint
        self.initial = self.size = max(1, int(size))
        self._logged: int | None = None

    def map(self, items: Sequence[T], fn: Callable[[Sequence[T]], list[R]]) -> list[R]:
        """`fn` over consecutive slices of `items`; its result lists concatenated in order."""
        out: list[R] = []
        for _, result in self.run(slices(items, self.size), fn):
            out += result
        return out

    def call(self, fn: Callable[..., R], *args) -> R:
        """`fn(*args)` as a batch of one (stages that run one item at a time): out of memory
        becomes the stage's one clear error instead of a traceback."""
        return self.map([args], lambda batch: [fn(*batch[0])])[0]

    def run(
        self,
        batches: Iterable[Sequence[T]],
        fn: Callable[[Sequence[T]], R],
        split: Callable[[Sequence[T], int], list[Sequence[T]]] = slices,
    ) -> Iterator[tuple[Sequence[T], R]]:
        """(batch, fn(batch)) for the planned `batches`, lazily (a caller may stop early).

        A planned batch runs as planned until memory runs out once; from then on a batch larger
        than the current size is first cut with `split(batch, size)` (which must return batches
        of at most `size` items, in order)."""
        for planned in batches:
            pending = [planned]
            while pending:
                batch = pending.pop(0)
                if self.size < self.initial and len(batch) > self.size:
                    pending[:0] = split(batch, self.size)
                    continue
                done, result = self._attempt(fn, batch)
                if not done:
                    pending.insert(0, batch)
                    continue
                if self._logged != self.size:
                    self._logged = self.size
                    log.info(
                        "%s: batch size %d%s",
                        self.stage,
                        self.size,
                        "" if self.size == self.initial else f" (halved from {self.initial} to fit in memory)",
                    )
                yield batch, result

    def _attempt(self, fn: Callable[[Sequence[T]], R], batch: Sequence[T]) -> tuple[bool, R | None]:
        """(True, result), or (False, None) after an out-of-memory error and halving the size."""
        try:
            return True, fn(batch)
        except Exception as err:  # noqa: BLE001 - anything but out-of-memory is re-raised
            if not is_out_of_memory(err):
                raise
            detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        from accelerate.utils.memory import clear_device_cache

        # Outside the `except`: the traceback (and the tensors its frames hold) is gone now.
        clear_device_cache(garbage_collection=True)
        if len(batch) <= 1:
            raise BatchTooLargeError(f"{self.stage}: out of memory with a batch of one item ({detail}); {self.hint}")
        self.size = max(1, min(self.size, len(batch)) // 2)
        log.warning(
            "%s: out of memory with %d items (%s); retrying them %d at a time",
            self.stage,
            len(batch),
            detail,
            self.size,
        )
        return False, None
