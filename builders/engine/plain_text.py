"""Text from data or the user (a model, file or metric name) kept on one line where it is shown:
in a Markdown table or list a line break ends the row or the item, so every renderer of cards and
reports (builders/publishing/card.py, training/report/markdown.py, the model card) turns them into
spaces here, with one rule (#49: `\\r` in a model name split report.md's table); `code_span` shows
such text as inline code in a card."""

from __future__ import annotations

import re

#: Every line break `str.splitlines()` splits on (`\n`, `\r`, `\v`, `\f`, `\x1c`-`\x1e`, `\x85`,
#: `\u2028`, `\u2029`) and the other control characters, which no name needs.
CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def one_line(text: object) -> str:
    """`text` with its line breaks and control characters as spaces."""
    return CONTROL.sub(" ", str(text))


#: ASCII punctuation: Markdown syntax, HTML, and `|`, on which a table splits cells.
_PUNCTUATION = re.compile(r"[!-/:-@\[-`{-~]")


def code_span(text: object) -> str:
    """`text` from data or the user (a file or model name, a command line) as inline code that it
    cannot break out of: the one rule for such text in a card (templates call `code(x)`).
    Control characters become spaces. Inside a backtick code span Markdown and HTML show as
    written; the fence is longer than any run of backticks in the text (padded with a space
    where the text starts or ends with one). A table splits cells on `|` even inside a code span,
    and an escape there would show outside tables, so text with a `|` is an HTML `<code>` element
    whose punctuation is written as character references (literal text in Markdown)."""
    body = one_line(text)
    if "|" in body:
        return "<code>" + _PUNCTUATION.sub(lambda m: f"&#{ord(m[0])};", body) + "</code>"
    fence = "`" * (1 + max((len(run) for run in re.findall(r"`+", body)), default=0))
    # CommonMark strips one space at each end when both ends have one (and not only spaces).
    ends = body[:1] + body[-1:]
    pad = " " if "`" in ends or (ends == "  " and body.strip(" ")) else ""
    return f"{fence}{pad}{body}{pad}{fence}"
