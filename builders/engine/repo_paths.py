"""The file paths a Hub repo refuses: a build's files must be publishable before anything is sent."""

from __future__ import annotations


def repo_path_problem(path: str) -> str | None:
    """Why the Hub would refuse `path` as a file path in a repo (None when it is fine)."""
    parts = path.split("/")
    if not path:
        return "empty"
    if path.startswith("/"):
        return "absolute"
    if "\\" in path:
        return "a backslash"
    if any(ord(c) < 32 or c == "\x7f" for c in path):
        return "a control character"
    if any(p in ("", ".", "..") for p in parts):
        return "an empty, '.' or '..' segment"
    if any(p in (".git", ".cache") for p in parts):
        return "a .git or .cache folder"
    return None
