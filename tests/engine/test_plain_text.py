"""`plain_text.one_line` (#49): no character on which Python splits lines survives it, checked
against `str.splitlines()` itself over every code point, not against a list copied from the code,
nor out of a card's code span. (report.md and the results card: tests/training/test_report_safety.py.)"""

from __future__ import annotations

import sys

from builders.engine.plain_text import code_span, one_line


def _breaks() -> list[str]:
    return [chr(c) for c in range(sys.maxunicode + 1) if len(f"a{chr(c)}b".splitlines()) > 1]


def test_every_line_break_python_knows_becomes_a_space():
    breaks = _breaks()
    assert "\r" in breaks and "\u2028" in breaks and len(breaks) >= 10  # the scan found them
    for char in breaks:
        for shown in (one_line(f"a{char}b"), code_span(f"a{char}b")):
            assert len(shown.splitlines()) == 1, (hex(ord(char)), shown)
