"""What a part was built from, so a resume never mixes old and new inputs.

Each finished part records one short digest per work item (`item_digests`) in its stats file:
the item's full record (ids, captions, boxes, paths: everything the reader parsed from the
annotation files) plus the size and modification time of the file it points at (`item.path`,
e.g. the source image). A resumed run re-reads the inputs and compares: a finished part whose
items differ was built from other inputs, and the resume is refused naming the first changed
items — unless that part is about to be redone anyway (`--retry-errors` on a part that recorded
input errors, the usual "fix the bad rows and re-run" loop). Parts not built yet need no check:
they will be built from the current inputs, so the output always equals a clean build of them.

Processes of one `accelerate launch` (possibly on several machines, each reading its own copy of
the inputs) must build from the same inputs: each hashes every item's `shared_record` as it reads
(`shares`), and the digests must agree.

A builder whose rows read more than one record (a query row with its positives' texts) makes
each item carry all of it, so the digest covers it; the item's `label` then names it in messages.

Items that carry ids must not repeat them (`UniqueIds`). Items a reader marked malformed
(`item.input_problem`, see `builders.engine.errors.InputProblem`) never reach the builder:
`split_problems` turns them into counted input-error skips.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from builders.engine.errors import UserFacingError
from builders.engine.sharding.base import Skip

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _item_id(item: Any) -> tuple[str, Any] | None:
    for attr in ("image_id", "id"):
        value = item.get(attr) if isinstance(item, dict) else getattr(item, attr, None)
        if value is not None:
            return attr.replace("_", " "), value
    return None


def item_label(item: Any, index: int) -> str:
    """How messages name an item: its own `label` (for items that are neither one image nor one
    id, e.g. `caption id 42`), else its image or item id when it has one."""
    label = getattr(item, "label", None)
    if isinstance(label, str):
        return label
    key = _item_id(item)
    return f"{key[0]} {key[1]}" if key else f"item #{index}"


class UniqueIds:
    """Items that carry an id (`image_id` or `id`) must not repeat it: two rows with one id would
    silently mix two sources' records (one image's captions with another's pixels). Fed the
    items part by part (a stream), it keeps their ids only."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, Any], int] = {}

    def add(self, start: int, items: Iterable[Any]) -> None:
        """Check the next items (the first one at index `start` of the whole input)."""
        for index, item in enumerate(items, start=start):
            key = _item_id(item)
            if key is None:
                continue
            first = self.seen.setdefault(key, index)
            if first != index:
                raise UserFacingError(
                    f"work items #{first} and #{index} of the source both have {key[0]} "
                    f"{key[1]!r}; ids must be unique — fix the source (or, with --dataset, choose "
                    "a unique --id-column)"
                )


def _record(item: Any, with_mtime: bool) -> str:
    """The item's record as text, and the size (and mtime) of the file it points at."""
    # Object addresses are not content (and differ per run): a builder whose items lack a
    # value repr still gets its paths checked.
    text = _ADDRESS.sub("", repr(item))
    path = getattr(item, "path", None)
    # A malformed item's file is never used, and may lie outside the root (`path_outside_root`):
    # it is not even stat'ed.
    if isinstance(path, Path) and getattr(item, "input_problem", None) is None:
        try:
            st = path.stat()
            text += f"|{st.st_size}" + (f"|{st.st_mtime_ns}" if with_mtime else "")
        except OSError:
            text += "|missing"
    return text


def item_digest(item: Any) -> str:
    """A digest of the item's record and of the file it points at (size, mtime)."""
    return hashlib.sha1(_record(item, True).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def shared_record(item: Any) -> bytes:
    """The item as another machine holding the same inputs reads it: its record and its file's
    size, without the mtime (identical copies on two machines have different mtimes)."""
    return _record(item, False).encode("utf-8", "surrogatepass") + b"\n"


def part_digests(items: Sequence[Any]) -> list[str]:
    return [item_digest(item) for item in items]


def changed_items(start: int, items: Sequence[Any], recorded: Sequence[str]) -> list[str]:
    """Labels of the items of a part (first item at global index `start`) whose digest differs
    from what the finished part recorded."""
    if len(recorded) != len(items):
        return [f"the part now has {len(items)} items, it was built from {len(recorded)}"]
    out = []
    for offset, (item, old) in enumerate(zip(items, recorded, strict=True)):
        if item_digest(item) != old:
            path = getattr(item, "path", None)
            out.append(item_label(item, start + offset) + (f" ({path})" if path else ""))
    return out


def split_problems(items: Iterable[Any]) -> tuple[list[Any], list[Skip]]:
    """Separate the usable items from those the reader marked malformed (as input-error skips)."""
    good, skips = [], []
    for item in items:
        problem = getattr(item, "input_problem", None)
        if problem is None:
            good.append(item)
        else:
            skips.append(Skip(problem.reason, kind="error", detail=problem.detail))
    return good, skips
