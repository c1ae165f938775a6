"""docs/architecture.md stays true to the tree: its Parts table lists every package and every
module (and nothing else), and every module its "Where is X decided?" table names exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "tfservo"
DOC = (REPO / "docs" / "architecture.md").read_text()


def _section(title: str) -> str:
    start = DOC.index(f"## {title}")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end != -1 else None]


def _table_rows(section: str) -> list[list[str]]:
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]


def test_the_parts_table_lists_every_package_and_module_of_the_tree() -> None:
    listed: dict[str, set[str]] = {}
    for package, modules, _ in _table_rows(_section("Parts")):
        listed[package.strip("`")] = set(re.findall(r"`([\w/]+)`", modules))
    actual: dict[str, set[str]] = {}
    for init in PACKAGE.rglob("__init__.py"):
        folder = init.parent
        if folder == PACKAGE:
            continue  # the top level: the public adapters, in the tree's first lines
        name = folder.relative_to(PACKAGE).as_posix()
        modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
        modules |= {f"{d.name}/" for d in folder.iterdir() if (d / "__init__.py").exists()}
        actual[name] = modules
    assert listed == actual


def test_the_tree_names_every_top_level_package() -> None:
    tree = DOC[DOC.index("```\ntfservo/") : DOC.index("## A request's path")]
    named = set(re.findall(r"^  ([a-z_]+)/", tree, re.M)) | set(re.findall(r" ([a-z_]+)/ ", tree))
    packages = {d.name for d in PACKAGE.iterdir() if (d / "__init__.py").exists()}
    assert packages <= named, sorted(packages - named)


def test_every_module_the_where_table_names_exists_one_a_row() -> None:
    rows = _table_rows(_section("Where is X decided?"))
    assert rows
    for behaviour, owner in rows:
        modules = set(re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.py)`", owner))
        assert len(modules) == 1, f"{behaviour}: {owner}"
    named = re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.py)`", _section("Where is X decided?"))
    missing = [path for path in named if not (PACKAGE / path).exists() and not (REPO / path).exists()]
    assert not missing, missing
