"""One pass over a builder's work items that keeps only this process's share.

Parts are consecutive chunks of `part_size` items, so the items are read as a stream, cut into
parts as they pass, and only the parts this process owns are kept: every process still sees the
whole input once (to count it, check its ids and, on the main process, compare finished parts
with it), but holds only its own ~1/N of the item objects while it builds. A builder whose
`work_items()` is a generator never materialises the rest at all; one that returns a list frees
the other processes' items as soon as the pass ends.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from builders.engine.sharding.inputs import UniqueIds

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


def share_items(items: Iterable[Any], part_size: int, owns: Callable[[int], bool],
                check: PartCheck | None = None) -> ItemShare:
    """Read `items` once, in order, keeping the parts `owns(part)` accepts."""
    share, ids = ItemShare(), UniqueIds()
    stream = iter(items)
    for part in itertools.count():
        chunk = list(itertools.islice(stream, part_size))
        if not chunk:
            break
        start = part * part_size
        ids.add(start, chunk)
        if check is not None:
            share.problems += check(part, start, chunk)
        if owns(part):
            share.mine.append((part, chunk))
        share.n_items += len(chunk)
        share.n_parts = part + 1
        del chunk  # before the next part is read: at most one part not ours is alive
    return share
