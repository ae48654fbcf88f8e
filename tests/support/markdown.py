"""Markdown as GitHub reads it, for the tests of README.md and docs/*.md: the prose outside
fenced code blocks, the anchors GitHub makes of headings, and the inline links."""

from __future__ import annotations

import re

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^ {0,3}#{1,6} +(.+?)(?: +#+)? *$")
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)


def prose(markdown: str) -> str:
    """The text outside fenced code blocks; the blocks' lines are blanked, so line numbers
    hold."""
    out: list[str] = []
    fence = ""
    for line in markdown.splitlines():
        if fence:
            if re.match(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}} *$", line):
                fence = ""
            out.append("")
        elif opened := _FENCE.match(line):
            fence = opened.group(1)
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def code_spans(text: str) -> list[str]:
    """The contents of its inline code spans (a line break inside one reads as a space)."""
    return [span.group(2).replace("\n", " ").strip() for span in _CODE_SPAN.finditer(text)]


def without_code_spans(text: str) -> str:
    return _CODE_SPAN.sub(lambda span: " " * len(span.group(0)), text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (a link's text, code without backticks),
    lowercased, punctuation dropped, spaces turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The anchors of the markdown's headings; a repeated one gets ``-1``, ``-2``, ... as on
    GitHub."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(markdown).splitlines():
        heading = _HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(markdown: str) -> list[str]:
    """The targets of its inline links and images, outside code."""
    return _LINK.findall(without_code_spans(prose(markdown)))
