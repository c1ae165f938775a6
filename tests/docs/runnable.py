"""The docs' code blocks and their test markers, read with markdown-it-py.

Every `sh`/`bash`/`python` block in README.md and docs/ is preceded by one HTML comment (invisible
on the site) saying what the test suite does with it:

    <!-- test: run -->            run it (sh: bash -eo pipefail; python: the .venv's python); exit 0
    <!-- test: serve -->          start it in the background and wait until its /ping answers
    <!-- test: output -->         (before any block) the previous run block's stdout must contain it
    <!-- test: skip (why) -->     not run, for the reason given (a cloud, a cluster, a placeholder)

Blocks run in order, per page, in a fresh folder that has the repository's `.venv` and
`examples/` (with `examples/models` built fresh), so paths read as they do in a clone. The well
known ports (8080, 8500, 8501, 9000) are replaced by free ones, so a page never meets another
server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

RUNNABLE_LANGS = ("sh", "bash", "python")
_MARKER = re.compile(r"<!--\s*test:\s*(run|serve|output|skip)\b\s*(.*?)\s*-->", re.S)


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text and its marker (None: unmarked)."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    marker: str | None
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file with the test marker just before each."""
    tokens = MarkdownIt("commonmark").parse(path.read_text())
    found: list[Block] = []
    pending: tuple[str, str] | None = None
    for token in tokens:
        if token.type == "html_block":
            m = _MARKER.search(token.content)
            pending = (m.group(1), m.group(2).strip("() ")) if m else None
            continue
        if token.type == "fence":
            lang = (token.info.split() or [""])[0]
            marker, reason = pending or (None, "")
            found.append(Block(path, token.map[0] + 1 if token.map else 0, lang, token.content, marker, reason))
        pending = None if token.type not in ("html_block",) else pending
    return found


def pages(repo: Path) -> list[Path]:
    """README.md and every page of the docs site."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]
