"""Text from files trtflow reads, shown safely: control characters shown not obeyed, Markdown escaped, reasons clipped
at a word (util/text.py)."""

from __future__ import annotations

from markdown_it import MarkdownIt

from trtflow.util.text import clipped, markdown_text, printable, single_line


def test_control_characters_are_shown_not_obeyed() -> None:
    assert printable("a\x1b[2Jb\tc\nd\x07\r\x9b\u202e") == "a\\x1b[2Jb\tc\nd\\x07\\x0d\\x9b\\u202e"
    assert single_line("a\nb\tc") == "a\\x0ab\\x09c"
    assert printable("plain text, ünïcödé 日本") == "plain text, ünïcödé 日本"


def test_markdown_text_renders_as_the_text_it_is() -> None:
    for text in ("<script>alert(1)</script>", "[x](javascript:alert(1))", "![i](http://e/x.png)", "**b** _i_ `c`"):
        html = MarkdownIt("commonmark").render(f"reason: {markdown_text(text)}")
        assert html == f"<p>reason: {text.replace('&', '&amp;').replace('<', '&lt;').replace('>', '&gt;')}</p>\n"


def test_a_reason_is_clipped_at_a_word_never_inside_one() -> None:
    reason = "ONNX Runtime cannot load the model: Unsupported model IR version: 999, max supported IR version: 10"
    assert clipped(reason, 60) == "ONNX Runtime cannot load the model: Unsupported model ..."
    assert clipped(reason, 200) == reason
    assert clipped("x" * 100, 20) == "x" * 16 + " ..." and len(clipped("a " * 100, 50)) <= 50
