"""Text from files trtflow reads (a lock, a run.json, a remote's reports, a model's names) made safe to show.

A terminal obeys escape sequences; a Markdown renderer obeys markup. Neither may be steered by a string an attacker
put in a file: `printable` shows control characters as `\\xNN` (a newline stays, so trtflow's own lines do),
`single_line` also folds newlines (a field never forges a table row), `markdown_text` escapes Markdown and HTML.
"""

from __future__ import annotations

import re

# C0 and C1 controls but tab and newline, DEL, and the bidirectional overrides that reorder what a reader sees
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROL_OR_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_MARKDOWN = re.compile(r"([\\`*_\[\]<>|~&!])")  # mid-line, only these start markup, a link, an element or an entity


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every control character but tab and newline shown as `\\xNN` (`\\uNNNN` for bidi overrides)."""
    return _CONTROL.sub(_escaped, text)


def single_line(text: str) -> str:
    """`text` on one line: newlines and tabs too shown as `\\xNN`."""
    return _CONTROL_OR_NEWLINE.sub(_escaped, text)


def markdown_text(text: object) -> str:
    """`text` as literal Markdown inside a line (never at its start): one line, each character that opens emphasis,
    code, a link, an image, an element, an entity or a table cell backslash-escaped (CommonMark lets any ASCII
    punctuation be), so `<script>`, `[x](javascript:...)` and `|` render as the text they are."""
    return _MARKDOWN.sub(r"\\\1", single_line(str(text)))


def clipped(text: str, limit: int) -> str:
    """`text` if it fits in `limit` characters, else cut at a word boundary and ended with ` ...` (a reason is never
    cut mid-word); a single word longer than the limit is cut where the limit falls."""
    if len(text) <= limit:
        return text
    head = text[: max(limit - 4, 1)]
    cut = head.rsplit(" ", 1)[0] if " " in head[limit // 2 :] else head
    return cut.rstrip(" ,;:") + " ..."
