"""The records of a text caption-pair table (`--captions-from` a .tsv or .jsonl file), read line by
line within bounds (builders/counterfactuals/METHOD.md §2, "Caption pairs from elsewhere").

- Text is UTF-8; a byte-order mark before the first line is dropped (`utf-8-sig`: Windows editors
  write one, and it would otherwise glue itself to the header's first column name or make the
  first JSON line unparsable). A file that is not UTF-8 is one line naming the line.
- One line is held at a time, never the file. A line longer than `MAX_LINE_BYTES` is skipped
  without being kept (`row_too_long`): no caption pair is that long.
- A line that is no row of the format is `bad_row` (wrong field count, not a JSON object, JSON
  nested deeper than the parser can go); a file none of whose lines is a row is one line saying
  so, since it is not a table of this format at all.
- JSON integers of more than `MAX_ID_CHARS` digits stay unconverted (`LongInteger`; Python refuses
  to convert more than 4,300 digits), so such an id is a counted `bad_id`, not a failed line.

`row_id` is the one rule for ids, whatever the format (module `pair_tables` applies it).
"""

from __future__ import annotations

import itertools
import json
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from builders.engine.errors import InputFileError, InputProblem

#: A line longer than this (1 MiB) is no caption pair: skipped unread (`row_too_long`). Far above
#: any real row (two captions of at most `pair_tables.MAX_CAPTION_CHARS`, JSON-escaped, and an id).
MAX_LINE_BYTES = 1 << 20
#: Ids are names: longer ones (stripped) are `bad_id`. COCO ids are under 20 characters.
MAX_ID_CHARS = 256

#: (where, a record {id, caption_0, caption_1} or why the line is no row).
Record = tuple[str, "dict[str, Any] | InputProblem"]


@dataclass(frozen=True)
class LongInteger:
    """A JSON integer of more digits than `MAX_ID_CHARS`, never converted."""

    digits: int

    def __repr__(self) -> str:
        return f"an integer of {self.digits:,} digits"


def row_id(value: Any, where: str) -> str | InputProblem | None:
    """The id of a row: a string without its surrounding whitespace (so `7` and `7 ` are one id,
    and collide), an integer's decimal digits; None for no id (missing, null or blank). Any
    other value is `bad_id`: booleans, objects and arrays (their Python repr is not the table's
    text), and numbers with a fraction or exponent (`7.0`, `1e3`: parsed, their spelling is lost,
    so `7.0` and `7.00` would be one id)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = value.strip()
        if len(value) > MAX_ID_CHARS:
            return InputProblem(
                "bad_id", f"{where}: the id has {len(value):,} characters (ids have at most {MAX_ID_CHARS})"
            )
        return value or None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        what = "a number with a fraction or exponent"
    elif isinstance(value, LongInteger):
        what = f"{value!r} (ids have at most {MAX_ID_CHARS})"
    else:
        what = {bool: "a boolean", dict: "an object", list: "an array"}.get(type(value), type(value).__name__)
    return InputProblem("bad_id", f"{where}: the id is {what}; write ids as strings or integers")


def tsv_records(path: Path, columns: tuple[str, str, str], explicit: bool) -> Iterator[Record]:
    """(where, record or problem) per data line. A first line holding the three column names is
    the header; without one the columns are id, caption_0, caption_1 in that order."""
    lines = _text_lines(path)
    first = next(lines, None)
    header = first[1].split("\t") if first and isinstance(first[1], str) else []
    if all(c in header for c in columns):
        index, width, data = tuple(header.index(c) for c in columns), len(header), lines
    elif explicit:
        raise InputFileError(
            path,
            f"has no header row naming the columns {list(columns)} (first row: {reprlib.repr(header)})",
            "add the header, or leave out the column options for a headerless id<TAB>caption_0<TAB>caption_1 file",
        )
    else:
        index, width, data = (0, 1, 2), 3, itertools.chain([first] if first else [], lines)
    rows = _Rows(path, f"{width} tab-separated fields", "write one row per line, its fields separated by tabs")
    for n, line in data:
        where = f"{path.name} line {n}"
        if isinstance(line, str) and len(fields := line.split("\t")) != width:
            line = InputProblem("bad_row", f"{where} has {len(fields)} tab-separated fields, not {width}")
        if rows.bad(line):
            yield where, line
            continue
        yield where, dict(zip(("id", "caption_0", "caption_1"), (fields[k] for k in index), strict=True))
    rows.check()


def jsonl_records(path: Path, columns: tuple[str, str, str]) -> Iterator[Record]:
    """(where, record or problem) per line: one JSON object per line, the columns its keys. A
    key on no line at all is one line naming it (the column options rename the keys)."""
    found: set[str] = set()
    keys: list[str] = []  # of the first object, for the message
    rows = _Rows(path, "a JSON object", "write one JSON object per line")
    for n, line in _text_lines(path):
        where = f"{path.name} line {n}"
        obj = line if isinstance(line, InputProblem) else _json_object(line, where)
        if rows.bad(obj):
            yield where, obj
            continue
        keys = keys or sorted(obj)[:20]
        found.update(c for c in columns if c in obj)
        yield where, dict(zip(("id", "caption_0", "caption_1"), (obj.get(c) for c in columns), strict=True))
    rows.check()
    missing = [c for c in columns if c not in found]
    if keys and missing:
        raise InputFileError(
            path,
            f"has no key(s) {missing} on any line (keys of its first object: {keys})",
            "name them with --id-column / --caption-0-column / --caption-1-column",
        )


class _Rows:
    """Whether any line of a file was a row of its format: a file none of whose lines is one is
    not such a table at all, which is one line (`check`), not a count of bad rows."""

    def __init__(self, path: Path, row: str, fix: str) -> None:
        self.path, self.row, self.fix = path, row, fix
        self.lines = self.rows = 0
        self.first: InputProblem | None = None

    def bad(self, line: object) -> bool:
        """Count `line` (a parsed line, or the problem that makes it no row); True for a problem."""
        self.lines += 1
        if isinstance(line, InputProblem):
            self.first = self.first or line
            return True
        self.rows += 1
        return False

    def check(self) -> None:
        if self.lines and not self.rows:
            raise InputFileError(
                self.path,
                f"has no line holding {self.row} (of {self.lines:,} line(s); the first: {self.first.detail})",
                self.fix,
            )


def _json_object(line: str, where: str) -> dict[str, Any] | InputProblem:
    try:
        obj = json.loads(line, parse_int=_integer)
    except ValueError as err:
        return InputProblem("bad_row", f"{where} is not JSON ({err})")
    except RecursionError:  # the C parser recurses once per level: `[[[[...` 200,000 deep
        return InputProblem("bad_row", f"{where} nests JSON deeper than the parser can go")
    if not isinstance(obj, dict):
        return InputProblem("bad_row", f"{where} is not a JSON object")
    return obj


def _integer(digits: str) -> int | LongInteger:
    n = len(digits.lstrip("-"))
    return LongInteger(n) if n > MAX_ID_CHARS else int(digits)


def _text_lines(path: Path) -> Iterator[tuple[int, str | InputProblem]]:
    """(line number, text without its line ending) per line, or `row_too_long` for a line over
    `MAX_LINE_BYTES` (read past in chunks, never kept)."""
    with open(path, "rb") as f:
        n = 0
        while raw := f.readline(MAX_LINE_BYTES + 1):
            n += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):
                    raw = f.readline(1 << 16)
                yield (
                    n,
                    InputProblem(
                        "row_too_long",
                        f"{path.name} line {n} is longer than "
                        f"{MAX_LINE_BYTES:,} bytes, more than any caption pair: "
                        "skipped without being kept",
                    ),
                )
                continue
            try:
                text = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise InputFileError(
                    path, f"is not UTF-8 text (line {n}: {err.reason} at byte {err.start})", "save the table as UTF-8"
                ) from None
            yield n, text.removesuffix("\n").removesuffix("\r")
