"""Live progress inside a part: items/s, ETA and the stage a builder is in.

The runner opens one tracker per process over the items of its unfinished parts (`track`).
Builders say where they are with one-line calls that do nothing outside a build:

    for rec in progress.items(records, "removing objects"):   # advances one item per loop turn
    progress.stage("captions")                                  # names the current step
    progress.stage("candidates", done=37, total=100)            # shown as "candidates 37/100"

On a terminal a tqdm bar per process shows them; otherwise (logs, CI, `accelerate launch` into a
file) a log line is written at most every `COUNTERFACTORY_PROGRESS_INTERVAL` seconds (default 30),
so a long part never looks hung.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from typing import Iterable, Iterator, TypeVar

log = logging.getLogger("counterfactory.progress")
T = TypeVar("T")

_DEFAULT_INTERVAL_S = 30.0


def format_eta(seconds: float) -> str:
    if seconds == float("inf"):
        return "unknown"
    return time.strftime("%H:%M:%S", time.gmtime(max(0.0, seconds)))


class Tracker:
    """Items done of this process's share, the current stage, and how to show them."""

    def __init__(self, total: int, label: str, position: int = 0, tty: bool | None = None) -> None:
        self.total, self.label = total, label
        self.done = self._in_part = 0
        self.stage_text = ""
        self.start = self._last_log = time.monotonic()
        self.interval = float(os.environ.get("COUNTERFACTORY_PROGRESS_INTERVAL", _DEFAULT_INTERVAL_S))
        self.bar = None
        if sys.stderr.isatty() if tty is None else tty:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=label, unit="item", position=position, dynamic_ncols=True, leave=True)

    def rate(self) -> float:
        elapsed = time.monotonic() - self.start
        return self.done / elapsed if elapsed > 0 else 0.0

    def eta(self) -> float:
        rate = self.rate()
        return (self.total - self.done) / rate if rate > 0 else float("inf")

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._in_part += n
        if self.bar is not None:
            self.bar.update(n)
        self._maybe_log()

    def set_stage(self, text: str) -> None:
        self.stage_text = text
        if self.bar is not None:
            self.bar.set_postfix_str(text)
        self._maybe_log()

    def part_done(self, items: int) -> None:
        """Count the rest of a finished part (builders that never call `items` advance here)."""
        self.advance(max(0, items - self._in_part))
        self._in_part = 0

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if self.bar is not None or now - self._last_log < self.interval:
            return
        self._last_log = now
        log.info(
            "%s: %s%d/%d items, %.2f items/s, ETA %s",
            self.label,
            f"{self.stage_text}; " if self.stage_text else "",
            self.done,
            self.total,
            self.rate(),
            format_eta(self.eta()),
        )


_current: Tracker | None = None


@contextlib.contextmanager
def track(total: int, label: str, position: int = 0) -> Iterator[Tracker]:
    """Make a tracker the one builders report to (the runner calls this once per process)."""
    global _current
    tracker = Tracker(total, label, position)
    previous, _current = _current, tracker
    try:
        if tracker.bar is not None:
            from tqdm.contrib.logging import logging_redirect_tqdm

            with logging_redirect_tqdm():  # log lines go above the bar instead of through it
                yield tracker
        else:
            yield tracker
    finally:
        _current = previous
        tracker.close()


def stage(name: str, done: int | None = None, total: int | None = None) -> None:
    """Name the step the builder is in (`candidates 37/100` with done/total)."""
    if _current is not None:
        _current.set_stage(f"{name} {done}/{total}" if total is not None else name)


def items(seq: Iterable[T], stage_name: str) -> Iterator[T]:
    """Iterate over a part's work items, counting one item done each time the loop comes back."""
    stage(stage_name)
    for item in seq:
        yield item
        if _current is not None:
            _current.advance(1)
