"""One test per real tool output in tests/fixtures: parse it, compare with hand-written facts.

Each ``tests/fixtures/<category>/<name>.txt`` is a verbatim copy of ``shared/fixtures`` (three
provenance lines ending with ``# ---``, then the output). Beside it, ``<name>.expect.yml`` holds
what a person read off the output:

    kind: ibstat              # the parser to run
    options: {}               # keyword options for it (smi-csv: fields)
    recognised: true
    problems: 0               # how many problems, or a list of substrings each must appear in one
    data: {...}               # expected data, matched as a subset (see ``matches``)

Matching: a mapping matches when each expected key matches the actual value; a list matches a
list of the same length element by element, or ``{$len: N, $items: {index: expected}}``; numbers
compare numerically (400 == 400.0); ``null`` matches only None.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT

from gpuctl.validation.capture import capture_output
from gpuctl.validation.parsing import ParseResult, parse, registry

FIXTURES = ROOT / "tests" / "fixtures"
SHARED = ROOT.parent / "shared" / "fixtures"
FIXTURE_FILES = sorted(FIXTURES.rglob("*.txt"))


def fixture_body(path: Path) -> str:
    """The output after the provenance header (which ends at the first ``# ---`` line)."""
    return capture_output(path)


def expectation(path: Path) -> dict[str, Any]:
    expect = path.with_suffix(".expect.yml")
    assert expect.is_file(), f"write {expect.relative_to(ROOT)} by reading the output"
    data: dict[str, Any] = yaml.safe_load(expect.read_text(encoding="utf-8"))
    return data


def matches(expected: Any, actual: Any, where: str = "data") -> list[str]:
    """Differences between ``expected`` (a subset spec) and ``actual``; empty when it matches."""
    if isinstance(expected, dict) and ("$len" in expected or "$items" in expected):
        if not isinstance(actual, list):
            return [f"{where}: expected a list, got {type(actual).__name__}"]
        out = []
        if "$len" in expected and len(actual) != expected["$len"]:
            out.append(f"{where}: expected {expected['$len']} items, got {len(actual)}")
        for index, item in expected.get("$items", {}).items():
            if int(index) >= len(actual):
                out.append(f"{where}[{index}]: missing")
            else:
                out += matches(item, actual[int(index)], f"{where}[{index}]")
        return out
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{where}: expected a mapping, got {actual!r}"[:200]]
        out = []
        for key, value in expected.items():
            if key not in actual:
                # YAML keys like 1 or "1": the parser's keys are strings
                if str(key) in actual:
                    out += matches(value, actual[str(key)], f"{where}.{key}")
                else:
                    out.append(f"{where}: missing key {key!r} (has {sorted(actual)[:12]})")
            else:
                out += matches(value, actual[key], f"{where}.{key}")
        return out
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return [f"{where}: expected a list, got {actual!r}"[:200]]
        if len(expected) != len(actual):
            return [f"{where}: expected {len(expected)} items, got {len(actual)}"]
        out = []
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            out += matches(e, a, f"{where}[{i}]")
        return out
    if expected is None:
        return [] if actual is None else [f"{where}: expected null, got {actual!r}"]
    if isinstance(expected, bool) or isinstance(actual, bool):
        return [] if expected is actual else [f"{where}: expected {expected!r}, got {actual!r}"]
    if isinstance(expected, int | float) and isinstance(actual, int | float):
        ok = math.isclose(float(expected), float(actual), rel_tol=1e-9, abs_tol=1e-12)
        return [] if ok else [f"{where}: expected {expected!r}, got {actual!r}"]
    return [] if expected == actual else [f"{where}: expected {expected!r}, got {actual!r}"]


def run_fixture(path: Path) -> tuple[dict[str, Any], ParseResult]:
    exp = expectation(path)
    result = parse(exp["kind"], fixture_body(path), **(exp.get("options") or {}))
    return exp, result


@pytest.mark.parametrize(
    "path", FIXTURE_FILES, ids=[str(p.relative_to(FIXTURES)) for p in FIXTURE_FILES]
)
def test_fixture(path: Path) -> None:
    exp, result = run_fixture(path)
    assert result.kind == exp["kind"]
    json.dumps(result.to_json())  # the envelope is JSON as it is
    assert result.recognised is exp["recognised"], result.problems
    want = exp.get("problems", 0)
    if isinstance(want, int):
        assert len(result.problems) == want, result.problems
    else:
        for fragment in want:
            assert any(fragment in p for p in result.problems), (fragment, result.problems)
    diffs = matches(exp.get("data", {}), result.data)
    assert not diffs, "\n".join(diffs[:30])


def test_every_shared_fixture_is_copied_verbatim() -> None:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is not beside this checkout")
    shared = {p.relative_to(SHARED) for p in SHARED.rglob("*.txt")}
    ours = {p.relative_to(FIXTURES) for p in FIXTURE_FILES}
    missing = sorted(str(p) for p in shared - ours)
    assert not missing, f"not yet in tests/fixtures: {missing}"
    for rel in shared:
        assert (FIXTURES / rel).read_bytes() == (SHARED / rel).read_bytes(), rel


def test_every_expectation_names_a_registered_kind() -> None:
    kinds = set(registry())
    for path in FIXTURE_FILES:
        assert expectation(path)["kind"] in kinds, path
