"""Errors that are the user's to fix (bad input files, wrong options, existing tags).

The CLI prints them as one line (no traceback) and exits with status 2. The message must name the
file/row (or option) at fault and say how to fix it.
"""

from __future__ import annotations

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
