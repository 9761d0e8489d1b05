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
    """One kind of output: the command that produces it (where there is one) and its parser."""

    kind: str
    func: ParseFunc
    description: str
    command: tuple[str, ...] | None = None
    options: tuple[str, ...] = ()  # keyword options the parser accepts (e.g. "fields")


_REGISTRY: dict[str, ParserSpec] = {}


def parser(
    kind: str,
    *,
    description: str,
    command: tuple[str, ...] | None = None,
    options: tuple[str, ...] = (),
) -> Callable[[ParseFunc], ParseFunc]:
    """Register a parser for ``kind`` (used as a decorator in ``gpuctl.validation.parsers``)."""

    def register(func: ParseFunc) -> ParseFunc:
        if kind in _REGISTRY and _REGISTRY[kind].func is not func:
            raise RuntimeError(f"two parsers registered for {kind!r}")  # a bug, at import time
        _REGISTRY[kind] = ParserSpec(kind, func, description, command, options)
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
    spec = registry()[kind]
    unknown = set(options) - set(spec.options)
    if unknown:
        raise TypeError(f"{kind} takes no option {', '.join(sorted(unknown))}")
    return spec.func(text, **options)


# ------------------------------------------------------------------------------------------
# Helpers shared by parsers (numbers: gpuctl.validation.numbers, never int()/float() directly)


def clean(text: str) -> str:
    """Normalise what terminals and pastes add: ANSI escapes, CR/CRLF line ends, a BOM."""
    text = text.lstrip("\ufeff")
    text = _ANSI.sub("", text)
    return text.replace("\r\n", "\n").replace("\r", "\n")


def unrecognised(kind: str, reason: str, **data: Any) -> ParseResult:
    return ParseResult(kind=kind, recognised=False, data=dict(data), problems=(reason,))
