"""Assistant Markdown -> the HTML subset QTextDocument renders (code blocks, lists, tables).

Raw HTML in a reply is shown as text, never interpreted: a model's output must not load
images or restyle the window. A code fence still open while a reply streams is closed
for display, so the block does not flip between text and code as tokens arrive.
"""

from __future__ import annotations

import html
import re

import markdown

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})", re.MULTILINE)


def clean_text(text: str) -> str:
    """Drop control characters a model may emit (they render as boxes or break layout)."""
    return _CONTROL.sub("", text)


def _close_open_fence(text: str) -> str:
    fences = _FENCE.findall(text)
    if len(fences) % 2 == 1:
        return text + ("\n" if not text.endswith("\n") else "") + fences[-1]
    return text


class MarkdownRenderer:
    def __init__(self):
        self._md = markdown.Markdown(extensions=["fenced_code", "tables", "sane_lists"])
        # No raw HTML: escape it like any other text.
        self._md.preprocessors.deregister("html_block")
        self._md.inlinePatterns.deregister("html")

    def to_html(self, text: str, streaming: bool = False) -> str:
        text = clean_text(text)
        if streaming:
            text = _close_open_fence(text)
        self._md.reset()
        try:
            return self._md.convert(text)
        except Exception:  # malformed input must never take the chat view down
            return "<p>" + html.escape(text).replace("\n", "<br>") + "</p>"


def plain_html(text: str) -> str:
    """User messages: shown as typed, line breaks kept."""
    return "<p style='white-space: pre-wrap'>" + html.escape(clean_text(text)) + "</p>"


def document_css(code_bg: str, code_fg: str, link: str, border: str) -> str:
    return f"""
    p, li {{ margin-top: 0px; margin-bottom: 6px; }}
    pre {{ background-color: {code_bg}; color: {code_fg}; font-family: monospace;
          margin-top: 4px; margin-bottom: 8px; padding: 6px; white-space: pre-wrap; }}
    code {{ background-color: {code_bg}; color: {code_fg}; font-family: monospace; }}
    a {{ color: {link}; }}
    table {{ border-collapse: collapse; margin-bottom: 6px; }}
    th, td {{ border: 1px solid {border}; padding: 3px 6px; }}
    h1 {{ font-size: x-large; }} h2 {{ font-size: large; }} h3 {{ font-size: medium; }}
    """
