"""Hypothesis throws mutated real outputs at every parser: no exception may escape.

For each kind, the inputs are its fixtures' bodies, mutated (lines dropped, duplicated, cut
short, characters replaced, ANSI escapes, CR/LF and tabs inserted, a number replaced by one no
tool prints: 5,000 digits, 1e308, 1e400, nan, inf, -0), plus arbitrary text. No parsed result
may hold a NaN, an infinity or a number of more than 30 digits, anywhere in its structure.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuctl.validation.capture import capture_output
from gpuctl.validation.numbers import implausible_numbers
from gpuctl.validation.parsing import ParseResult, registry

FIXTURES = ROOT / "tests" / "fixtures"


def _body(path: Path) -> str:
    return capture_output(path)


def _corpus() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    out: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for path in sorted(FIXTURES.rglob("*.txt")):
        expect = path.with_suffix(".expect.yml")
        if expect.is_file():
            exp = yaml.safe_load(expect.read_text(encoding="utf-8"))
            out[exp["kind"]].append((_body(path), exp.get("options") or {}))
    return out


CORPUS = _corpus()
# GPUCTL_FUZZ_EXAMPLES raises the count for a long local run; CI runs the default, derandomized
# (the same examples every run, so a red CI always points at a reproducible input).
SCALE = int(os.environ.get("GPUCTL_FUZZ_EXAMPLES", "0"))
DERANDOMIZE = SCALE == 0
NOISE = st.sampled_from(
    [
        "\x1b[4m",
        "\x1b[0m",
        "\r\n",
        "\r",
        "\t",
        "  ",
        "N/A",
        "[N/A]",
        "-",
        ":",
        "|",
        "#",
        "0",
        "99999999999999999999",
        "nan",
        "\x00",
        "é",
        "\n\n",
    ]
)


# Numbers no tool prints: past int()'s 4,300-digit limit, at and past float's range, non-finite.
ABSURD = st.sampled_from(
    [
        "9" * 5000,
        "-" + "1" * 5000,
        "1" * 31,
        "1e300",
        "1e308",
        "1.8e308",
        "1e400",
        "-1e400",
        "1e-400",
        "nan",
        "NaN",
        "inf",
        "-inf",
        "Infinity",
        "-0",
        "-0.0",
    ]
)
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


bad_numbers = implausible_numbers  # the numbers module's contract, checked on every result


@st.composite
def mutated(draw: st.DrawFn, bodies: list[str]) -> str:
    text = draw(st.sampled_from(bodies))
    lines = text.splitlines(keepends=True)
    for _ in range(draw(st.integers(0, 6))):
        if not lines:
            break
        op = draw(st.sampled_from(["drop", "dup", "cut", "noise", "swap", "truncate", "number"]))
        i = draw(st.integers(0, len(lines) - 1))
        if op == "drop":
            del lines[i : i + draw(st.integers(1, 5))]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "cut":
            lines[i] = lines[i][: draw(st.integers(0, max(0, len(lines[i]) - 1)))]
        elif op == "noise":
            pos = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:pos] + draw(NOISE) + lines[i][pos:]
        elif op == "number":
            spots = list(_NUMBER.finditer(lines[i]))
            if spots:
                spot = spots[draw(st.integers(0, len(spots) - 1))]
                line = lines[i]
                lines[i] = line[: spot.start()] + draw(ABSURD) + line[spot.end() :]
            else:
                pos = draw(st.integers(0, len(lines[i])))
                lines[i] = lines[i][:pos] + draw(ABSURD) + lines[i][pos:]
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines = lines[:i]
    return "".join(lines)


def _check(kind: str, text: str, options: dict[str, Any]) -> None:
    result = registry()[kind].func(text, **options)
    assert isinstance(result, ParseResult)
    assert result.kind == kind
    bad = bad_numbers(result.data)
    assert not bad, bad[:5]
    json.dumps(result.to_json(), allow_nan=False)


@pytest.mark.parametrize("kind", sorted(CORPUS))
@settings(
    max_examples=SCALE or 60,
    deadline=None,
    derandomize=DERANDOMIZE,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_mutated_fixtures_never_raise(kind: str, data: st.DataObject) -> None:
    bodies = [b for b, _ in CORPUS[kind]]
    options = CORPUS[kind][0][1]
    _check(kind, data.draw(mutated(bodies)), options)


@pytest.mark.parametrize("kind", sorted(CORPUS))
@settings(
    max_examples=SCALE or 40,
    deadline=None,
    derandomize=DERANDOMIZE,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_absurd_numbers_in_fixtures_never_raise_nor_leak(kind: str, data: st.DataObject) -> None:
    """Every number of a line replaced by one no tool prints (a line of the real output)."""
    body, options = data.draw(st.sampled_from(CORPUS[kind]))
    lines = body.splitlines(keepends=True)
    if lines:
        i = data.draw(st.integers(0, len(lines) - 1))
        lines[i] = _NUMBER.sub(data.draw(ABSURD), lines[i])
    _check(kind, "".join(lines), options)


@pytest.mark.parametrize("kind", sorted(registry()))
@settings(max_examples=SCALE or 40, deadline=None, derandomize=DERANDOMIZE)
@given(text=st.text(max_size=400))
def test_arbitrary_text_never_raises(kind: str, text: str) -> None:
    options: dict[str, Any] = {"fields": ["name"]} if "fields" in registry()[kind].options else {}
    _check(kind, text, options)
    empty = registry()[kind].func("", **options)
    assert empty.recognised is False, f"{kind}: empty input must not be recognised"
