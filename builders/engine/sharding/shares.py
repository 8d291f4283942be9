"""One pass over a builder's work items that keeps only this process's share.

Parts are consecutive chunks of `part_size` items, so the items are read as a stream, cut into
parts as they pass, and only the parts this process owns are kept: every process still sees the
whole input once (to count it, check its ids and, on the main process, compare finished parts
with it), but holds only its own ~1/N of the item objects while it builds. A builder whose
`work_items()` is a generator never materialises the rest at all; one that returns a list frees
the other processes' items as soon as the pass ends.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from builders.engine.distributed import ProcessGroup
from builders.engine.errors import UserFacingError
from builders.engine.sharding.inputs import UniqueIds, shared_record

#: What the pass does with a part that is not kept: `check(part, start, items)` returns the
#: problems found (e.g. a finished part whose inputs changed), collected in order.
PartCheck = Callable[[int, int, list[Any]], list[str]]


@dataclass
class ItemShare:
    """The whole input's size and this process's parts (`(part, items)`, in part order)."""

    n_items: int = 0
    n_parts: int = 0
    mine: list[tuple[int, list[Any]]] = field(default_factory=list)
    #: What `check` reported over all parts.
    problems: list[str] = field(default_factory=list)
    #: sha256 of every item's `shared_record`, in order (when asked for: `digest=True`).
    digest: str | None = None


def share_items(
    items: Iterable[Any],
    part_size: int,
    owns: Callable[[int], bool],
    check: PartCheck | None = None,
    digest: bool = False,
) -> ItemShare:
    """Read `items` once, in order, keeping the parts `owns(part)` accepts; `digest`: also hash
    every item (`ItemShare.digest`), for `check_same_inputs`."""
    share, ids = ItemShare(), UniqueIds()
    hashed = hashlib.sha256() if digest else None
    stream = iter(items)
    for part in itertools.count():
        chunk = list(itertools.islice(stream, part_size))
        if not chunk:
            break
        start = part * part_size
        ids.add(start, chunk)
        if check is not None:
            share.problems += check(part, start, chunk)
        if hashed is not None:
            for item in chunk:
                hashed.update(shared_record(item))
        if owns(part):
            share.mine.append((part, chunk))
        share.n_items += len(chunk)
        share.n_parts = part + 1
        del chunk  # before the next part is read: at most one part not ours is alive
    share.digest = hashed.hexdigest() if hashed is not None else None
    return share


def check_same_inputs(group: ProcessGroup, share: ItemShare, source: str) -> None:
    """Refuse, on every process, inputs that differ between the processes of `group`.

    On several machines each process reads its own copy of the inputs (`source`, e.g.
    `--coco-root coco`); one edited copy would mix two sources in one build without a word.
    Every process sends its item count and digest to every other (one exchange, so none is left
    waiting: all learn of a difference at once), then each raises its own line."""
    seen = group.all_gather((share.n_items, share.digest))
    differ = [rank for rank, got in enumerate(seen) if got != seen[0]]
    if not differ:
        return
    main_items = seen[0][0]
    if group.rank in differ:
        where = (
            f"this process (rank {group.rank}) read {share.n_items} items from {source} that "
            f"differ from those rank 0 read ({main_items} items)"
        )
    else:
        where = (
            f"rank(s) {', '.join(map(str, differ))} read other inputs from {source} than "
            f"rank 0 ({', '.join(f'{seen[r][0]} items' for r in differ)}; rank 0: "
            f"{main_items} items)"
        )
    raise UserFacingError(
        f"{where}; every machine must read identical inputs at the same path "
        "(copy them again, or put them on the shared filesystem); nothing was "
        "written"
    )


def check_has_items(share: ItemShare, source: str) -> None:
    """A build with no input item is a mistake (an empty or header-only table, a folder without
    images, a split that does not exist): refused before anything is written."""
    if share.n_items == 0:
        raise UserFacingError(
            f"{source} gives no input items (an empty or header-only table, no "
            "images, or no split that matches?); check that option and its "
            "files; nothing was written"
        )
