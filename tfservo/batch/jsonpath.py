"""SageMaker's JSONPath subset for --input-filter and --output-filter.

Supported: `$`, `.name`, `.*`, `['a']`, `['a','b']` (an object with just those keys), `[i]`,
`[i,j]`, `[s:e]`, mixes such as `[0,5:]`, negative indexes, and `[*]`. After a step that
selects several values (`[i,j]`, a slice, `*`) later steps apply to each of them.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["JsonPath", "JsonPathError", "parse_jsonpath"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_INT = re.compile(r"-?\d+")


class JsonPathError(ValueError):
    """A filter expression that cannot be parsed, or a record it cannot be applied to."""


@dataclass(frozen=True)
class _Key:
    name: str
    many = False

    def apply(self, value: object, text: str) -> object:
        return _get(value, self.name, text)


@dataclass(frozen=True)
class _Keys:
    names: tuple[str, ...]
    many = False

    def apply(self, value: object, text: str) -> object:
        return {name: _get(value, name, text) for name in self.names}


@dataclass(frozen=True)
class _Index:
    index: int
    many = False

    def apply(self, value: object, text: str) -> object:
        return _at(value, self.index, text)


@dataclass(frozen=True)
class _Union:
    items: tuple[int | slice, ...]
    many = True

    def apply(self, value: object, text: str) -> object:
        out: list[object] = []
        for item in self.items:
            if isinstance(item, slice):
                if not isinstance(value, list):
                    raise JsonPathError(f"{text}: a slice needs an array, found {_kind(value)}")
                out.extend(value[item])
            else:
                out.append(_at(value, item, text))
        return out


@dataclass(frozen=True)
class _Wildcard:
    many = True

    def apply(self, value: object, text: str) -> object:
        if isinstance(value, dict):
            return list(value.values())
        if isinstance(value, list):
            return list(value)
        raise JsonPathError(f"{text}: '*' needs an object or array, found {_kind(value)}")


_Step = _Key | _Keys | _Index | _Union | _Wildcard


@dataclass(frozen=True)
class JsonPath:
    """A parsed expression; `select(value)` applies it to one record."""

    text: str
    steps: tuple[_Step, ...]

    @property
    def is_root(self) -> bool:
        return not self.steps

    def field_picker(self) -> Callable[[list[object]], list[object]] | None:
        """For a path of one index or index/slice list (`$[1:]`, `$[0,-1]`, `$[2]`): a function
        picking those fields from a list as a list (IndexError when one is missing), the fast
        form of `select` for CSV records; None for other paths."""
        if len(self.steps) != 1:
            return None
        step = self.steps[0]
        if isinstance(step, _Index):
            index = step.index
            return lambda fields: [fields[index]]
        if not isinstance(step, _Union):
            return None
        items = step.items
        if all(isinstance(item, int) for item in items):
            get = operator.itemgetter(*items)
            return (lambda fields: [get(fields)]) if len(items) == 1 else (lambda fields: list(get(fields)))
        only = items[0]
        if len(items) == 1 and isinstance(only, slice):
            return lambda fields: fields[only]

        def pick(fields: list[object]) -> list[object]:
            out: list[object] = []
            for item in items:
                if isinstance(item, slice):
                    out.extend(fields[item])
                else:
                    out.append(fields[item])
            return out

        return pick

    def select(self, value: object) -> object:
        """The part of `value` the path names; JsonPathError says which step found nothing."""
        many = False
        for step in self.steps:
            if many:
                assert isinstance(value, list)  # a step that gives many gives a list
                value = [step.apply(item, self.text) for item in value]
            else:
                value = step.apply(value, self.text)
                many = step.many
        return value


def _get(value: object, name: str, text: str) -> object:
    if not isinstance(value, dict):
        raise JsonPathError(f"{text}: key {name!r} needs an object, found {_kind(value)}")
    if name not in value:
        keys = ", ".join(repr(k) for k in list(value)[:10]) or "none"
        raise JsonPathError(f"{text}: the record has no key {name!r} (keys: {keys})")
    return value[name]


def _at(value: object, index: int, text: str) -> object:
    if not isinstance(value, list):
        raise JsonPathError(f"{text}: index {index} needs an array, found {_kind(value)}")
    if not -len(value) <= index < len(value):
        raise JsonPathError(
            f"{text}: index {index} is outside the record, which has {len(value)} "
            f"{'field' if len(value) == 1 else 'fields'}"
        )
    return value[index]


def _kind(value: object) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


def parse_jsonpath(text: str) -> JsonPath:
    """Parse an expression such as `$[1:]`, `$.features` or `$['id','SageMakerOutput']`."""
    source = text.strip()
    if not source.startswith("$"):
        raise JsonPathError(f"{text!r} is not a JSONPath: it must start with $ (e.g. $, $[1:], $.features)")
    pos = 1
    steps: list[_Step] = []
    while pos < len(source):
        char = source[pos]
        if char == ".":
            if source.startswith(".*", pos):
                steps.append(_Wildcard())
                pos += 2
                continue
            match = _NAME.match(source, pos + 1)
            if not match:
                raise _syntax(text, pos + 1, "a name after '.'")
            steps.append(_Key(match.group()))
            pos = match.end()
        elif char == "[":
            end = _closing_bracket(source, pos, text)
            steps.append(_bracket(source[pos + 1 : end].strip(), text))
            pos = end + 1
        elif char.isspace():
            pos += 1
        else:
            raise _syntax(text, pos, "'.' or '['")
    for step in steps[:-1]:
        if isinstance(step, _Keys):
            raise JsonPathError(f"{text!r}: a list of names ['a','b'] must be the last step")
    return JsonPath(text, tuple(steps))


def _closing_bracket(source: str, start: int, text: str) -> int:
    quote = None
    for i in range(start + 1, len(source)):
        char = source[i]
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "]":
            return i
    raise JsonPathError(f"{text!r}: '[' at position {start} is never closed with ']'")


def _bracket(inner: str, text: str) -> _Step:
    if inner == "*":
        return _Wildcard()
    parts = [p.strip() for p in _split_commas(inner)]
    if not parts or any(not p for p in parts):
        raise JsonPathError(f"{text!r}: empty item in [{inner}]")
    if all(p[0] in "'\"" for p in parts):
        names = []
        for p in parts:
            if len(p) < 2 or p[-1] != p[0]:
                raise JsonPathError(f"{text!r}: {p} is not a quoted name")
            names.append(p[1:-1])
        return _Key(names[0]) if len(names) == 1 else _Keys(tuple(names))
    items: list[int | slice] = []
    for p in parts:
        if _INT.fullmatch(p):
            items.append(int(p))
        elif ":" in p:
            items.append(_slice(p, text))
        else:
            raise JsonPathError(
                f"{text!r}: {p!r} in [{inner}] is not an index, a slice (start:end) or a quoted name"
            )
    if len(items) == 1 and isinstance(items[0], int):
        return _Index(items[0])
    return _Union(tuple(items))


def _slice(part: str, text: str) -> slice:
    pieces = [s.strip() for s in part.split(":")]
    if len(pieces) != 2 or any(s and not _INT.fullmatch(s) for s in pieces):
        raise JsonPathError(f"{text!r}: {part!r} is not a slice such as 1:, :3 or 1:-1")
    start, stop = (int(s) if s else None for s in pieces)
    return slice(start, stop)


def _split_commas(inner: str) -> list[str]:
    parts, quote, start = [], None, 0
    for i, char in enumerate(inner):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == ",":
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    return parts


def _syntax(text: str, pos: int, expected: str) -> JsonPathError:
    return JsonPathError(f"{text!r}: expected {expected} at position {pos}")
