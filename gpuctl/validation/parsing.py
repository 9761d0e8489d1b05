"""The parser registry and the result every parser returns.

A parser is a pure function ``text -> ParseResult``: no I/O, no exceptions for odd input. It
never invents a value: what the output does not say is ``None`` (never ``0`` or ``0.0``), and
anything it could not understand is named in ``problems``. ``recognised`` is False when the input
is not output of that kind at all (empty, another tool's output, an error banner instead of the
table); the CLI then exits 1. A parser never returns NaN, an infinity or a number past
``gpuctl.validation.numbers.LIMIT``: every number it reads goes through that module.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

SCHEMA_VERSION = 1

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


@dataclass(frozen=True, slots=True)
class ParseResult:
    kind: str
    recognised: bool
    data: dict[str, Any] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The documented envelope of ``gpuctl parse`` (docs/parse.md)."""
        return {
            "kind": self.kind,
            "schema_version": SCHEMA_VERSION,
            "recognised": self.recognised,
            "data": self.data,
            "problems": list(self.problems),
        }


ParseFunc = Callable[..., ParseResult]


@dataclass(frozen=True, slots=True)
class ParserSpec:
    """One kind of output and its parser. The commands that produce it are declared where they
    are run (``gpuctl.validation.probes.PROBES`` and the few runners outside it), never here."""

    kind: str
    func: ParseFunc
    description: str
    options: tuple[str, ...] = ()  # keyword options the parser accepts (e.g. "fields")


_REGISTRY: dict[str, ParserSpec] = {}


def parser(
    kind: str,
    *,
    description: str,
    options: tuple[str, ...] = (),
) -> Callable[[ParseFunc], ParseFunc]:
    """Register a parser for ``kind`` (used as a decorator in ``gpuctl.validation.parsers``)."""

    def register(func: ParseFunc) -> ParseFunc:
        if kind in _REGISTRY and _REGISTRY[kind].func is not func:
            raise RuntimeError(f"two parsers registered for {kind!r}")  # a bug, at import time
        _REGISTRY[kind] = ParserSpec(kind, func, description, options)
        return func

    return register


@cache
def _load_all() -> None:
    from gpuctl.validation import parsers

    for info in pkgutil.iter_modules(parsers.__path__):
        importlib.import_module(f"{parsers.__name__}.{info.name}")


def registry() -> Mapping[str, ParserSpec]:
    """Every registered parser, by kind (imports every module of the parsers package once)."""
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def parse(kind: str, text: str, **options: Any) -> ParseResult:
    """Parse ``text`` as ``kind``. Raises KeyError for an unknown kind (a usage error)."""
    _load_all()
    spec = _REGISTRY[kind]
    unknown = set(options) - set(spec.options)
    if unknown:
        raise TypeError(f"{kind} takes no option {', '.join(sorted(unknown))}")
    return spec.func(text, **options)


# ------------------------------------------------------------------------------------------
# Helpers shared by parsers (numbers: gpuctl.validation.numbers, never int()/float() directly)


def clean(text: str) -> str:
    """Normalise what terminals and pastes add: ANSI escapes, CR/CRLF line ends, a BOM."""
    text = text.lstrip("\ufeff")
    # each step only where its character occurs: the search for "\r\n" is slow on text with
    # many "\n", and nearly no output has a CR or an ESC
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def unrecognised(kind: str, reason: str, **data: Any) -> ParseResult:
    return ParseResult(kind=kind, recognised=False, data=dict(data), problems=(reason,))


class LineProblems:
    """A parser's problems in order, with unrecognised lines capped: the first ``limit`` are
    named one by one, the rest counted (a mangled paste can have hundreds). ``ignored`` adds
    "ignored" to the messages (the infiniband parsers' wording)."""

    def __init__(self, *, ignored: bool = False, limit: int = 5) -> None:
        self.items: list[str] = []
        self._lines = 0
        self._ignored = ignored
        self._limit = limit

    def add(self, message: str) -> None:
        self.items.append(message)

    def line(self, where: str, line: str) -> None:
        self._lines += 1
        if self._lines <= self._limit:
            what = "unrecognised line ignored:" if self._ignored else "unrecognised line"
            self.items.append(f"{where}: {what} {line.strip()[:120]!r}")

    def result(self) -> tuple[str, ...]:
        extra = self._lines - self._limit
        if extra > 0:
            tail = " ignored" if self._ignored else ""
            return (*self.items, f"{extra} more unrecognised line(s){tail}")
        return tuple(self.items)
