"""Errors that are the user's to fix (bad input files, wrong options, existing tags).

The CLI prints them as one line (no traceback) and exits with status 2. The message must name the
file/row (or option) at fault and say how to fix it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass


class UserFacingError(Exception):
    """A problem with the user's input or environment, reported as one clear line."""


class InputFileError(UserFacingError, ValueError):
    """A source file is missing, unreadable or malformed."""

    def __init__(self, path: object, problem: str, fix: str = "") -> None:
        self.path = str(path)
        msg = f"{self.path}: {problem}"
        if fix:
            msg += f" ({fix})"
        super().__init__(msg)


class OutputError(UserFacingError):
    """The output folder cannot be written (a file, no permission, disk full, locked)."""


class PublishError(UserFacingError):
    """Publishing failed (bad repo id, unreachable or failing Hub, concurrent publish)."""


@dataclass(frozen=True)
class InputProblem:
    """Why one source record (an image and its annotations, a caption) cannot be used.

    Readers attach it to the record instead of raising, so one malformed row is skipped and
    counted under `reason` (the runner reports it as an input error against
    `--max-error-fraction`) while the rest of the build goes on. `detail` names the file and row.
    """

    reason: str
    detail: str


def run_handled(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse, set up logging, run the handler; user errors become one line and exit code 2."""
    args = parser.parse_args(argv)
    if not hasattr(args, "verbose"):
        args.verbose = False
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # The Hub client logs every HTTP request at INFO: noise unless asked for with -v.
    logging.getLogger("httpx2").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except UserFacingError as err:
        # One clear line naming the file/row and the fix; no traceback for user mistakes.
        print(f"counterfactory: error: {err}", file=sys.stderr)
        return 2
