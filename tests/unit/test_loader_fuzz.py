"""Property tests: whatever the file holds, `gpuctl check` answers 0 or 2 with located errors.

Never a crash (exit 70, or an exception escaping the CLI), never a traceback, and an exit 2 always
comes with at least one ``error:`` line.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from gpuctl.cli.app import app
from gpuctl.starter import starter

VALID_TEXT = starter("hgx-h100", 4)
VALID_DOC: dict[str, Any] = yaml.safe_load(VALID_TEXT)

FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

RUNNER = CliRunner()

Loc = tuple[str | int, ...]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "cluster.yml"


def _check(target: Path, content: str | bytes) -> Result:
    if isinstance(content, bytes):
        target.write_bytes(content)
    else:
        target.write_text(content, encoding="utf-8")
    result = RUNNER.invoke(app, ["check", str(target)])
    assert result.exit_code in (0, 2), (result.exit_code, repr(result.exception), result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    if result.exit_code == 2:
        lines = result.stderr.splitlines()
        assert any(line.startswith(f"error: {target}") for line in lines), result.stderr
        assert lines[-1].endswith(" found"), result.stderr
    return result


# --------------------------------------------------------------------------------------------
# strategies


def _scalars() -> st.SearchStrategy[Any]:
    return (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats()
        | st.text(max_size=12)
        | st.sampled_from(_DOC_SCALARS)
    )


def _collect(node: Any, loc: Loc = ()) -> tuple[list[Loc], list[Any]]:
    """Every location below the root, and every scalar value of the document."""
    locs: list[Loc] = []
    scalars: list[Any] = []
    items: list[tuple[str | int, Any]] = []
    if isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, list):
        items = list(enumerate(node))
    else:
        scalars.append(node)
    for key, child in items:
        locs.append((*loc, key))
        sub_locs, sub_scalars = _collect(child, (*loc, key))
        locs += sub_locs
        scalars += sub_scalars
    return locs, scalars


# values of the document itself (names, node sets, versions) make the rules see plausible
# but wrong references; a few more cover the edges of the node set syntax
_DOC_SCALARS = [
    *sorted({repr(v): v for v in _collect(VALID_DOC)[1]}.values(), key=repr),
    *["gpu[001-008]", "head01", "gpu[3-1]", "a[1-2]b[1-2]", "", "-", "[", "0", "-1", "1.5", "%"],
]

json_like: st.SearchStrategy[Any] = st.recursive(
    _scalars(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)


def _other_type(old: type) -> Callable[[Any], bool]:
    return lambda value: type(value) is not old


def _parent(doc: Any, loc: Loc) -> Any:
    node = doc
    for part in loc[:-1]:
        node = node[part]
    return node


@st.composite
def mutated_documents(draw: Callable[..., Any]) -> Any:
    doc: Any = copy.deepcopy(VALID_DOC)
    for _ in range(draw(st.integers(1, 3))):
        locs = _collect(doc)[0]
        if not locs:
            break
        loc = draw(st.sampled_from(locs))
        parent, key = _parent(doc, loc), loc[-1]
        op = draw(st.sampled_from(["delete", "retype", "reuse", "unknown-key", "wrap", "root"]))
        if op == "delete":
            del parent[key]
        elif op == "retype":
            parent[key] = draw(json_like.filter(_other_type(type(parent[key]))))
        elif op == "reuse":
            parent[key] = draw(st.sampled_from(_DOC_SCALARS))
        elif op == "unknown-key":
            holder = parent[key] if isinstance(parent[key], dict) else parent
            if isinstance(holder, dict):
                holder[draw(st.text(min_size=1, max_size=10))] = draw(json_like)
        elif op == "wrap":
            parent[key] = [parent[key]]
        else:  # the whole document becomes something else
            doc = draw(st.sampled_from([[doc], None, "text", 1, {"cluster": doc}]))
            break
    return doc


_TOKENS = [
    "name:",
    "node_groups:",
    "software:",
    "slurm:",
    "fabrics:",
    "nodes:",
    "gpus:",
    "count:",
    " ",
    "  ",
    "\n",
    "\t",
    "- ",
    ": ",
    ":",
    ",",
    "[",
    "]",
    "{",
    "}",
    "'",
    '"',
    "#",
    "? ",
    "|",
    ">",
    "&a ",
    "*a",
    "&b ",
    "*b",
    "!!int ",
    "!!str ",
    "!!binary ",
    "!!timestamp ",
    "!!python/x ",
    "!tag ",
    "<<: ",
    "---\n",
    "...\n",
    "%YAML 1.1\n",
    "~",
    "null",
    "true",
    "no",
    "12.8",
    "0x1F",
    "1e999",
    ".nan",
    "2001-13-45",
    "gpu[001-004]",
    "head01",
    "\\x",
    "\ufeff",
    "é",
    "\x00",
    "\x85",
]
yamlish_text = st.lists(st.sampled_from(_TOKENS), max_size=40).map("".join)


@st.composite
def edited_valid_text(draw: Callable[..., Any]) -> str:
    """The valid file with a few text edits: cut a slice, insert a token, repeat or drop lines."""
    text = VALID_TEXT
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["cut", "insert", "repeat-line", "drop-line"]))
        i = draw(st.integers(0, len(text)))
        if op == "cut":
            text = text[:i] + text[i + draw(st.integers(1, 40)) :]
        elif op == "insert":
            text = text[:i] + draw(st.sampled_from(_TOKENS) | st.text(max_size=5)) + text[i:]
        else:
            lines = text.splitlines(keepends=True)
            if lines:
                n = draw(st.integers(0, len(lines) - 1))
                if op == "repeat-line":
                    lines.insert(n, lines[n])
                else:
                    del lines[n]
            text = "".join(lines)
    return text


# --------------------------------------------------------------------------------------------
# properties


def test_the_unmutated_document_passes(target: Path) -> None:
    assert _check(target, yaml.safe_dump(VALID_DOC, sort_keys=False)).exit_code == 0


@FUZZ
@given(doc=mutated_documents())
def test_mutated_documents(target: Path, doc: Any) -> None:
    _check(target, yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))


@FUZZ
@given(text=edited_valid_text())
def test_edited_valid_text(target: Path, text: str) -> None:
    _check(target, text)


@FUZZ
@given(text=st.one_of(yamlish_text, st.text(max_size=200)))
def test_arbitrary_text(target: Path, text: str) -> None:
    _check(target, text)


@settings(FUZZ, max_examples=50)
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes(target: Path, raw: bytes) -> None:
    _check(target, raw)


def test_the_property_catches_a_crash(target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above is not vacuous: an internal error (exit 70) fails it."""

    def crash(*_: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("gpuctl.cli.config_cmds.summarize", crash)
    with pytest.raises(AssertionError):
        _check(target, VALID_TEXT)
