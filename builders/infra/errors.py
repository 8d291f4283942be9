"""Errors that are the user's to fix (bad input files, wrong options, existing tags).

The CLI prints them as one line (no traceback) and exits with status 2. The message must name the
file/row (or option) at fault and say how to fix it.
"""


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
