"""Every class of bad cluster.yml through `gpuctl check`: exit 2, located problems, no traceback.

Each problem is one line on stderr, ``error: FILE:LINE:COL: PATH: MESSAGE`` (no PATH for YAML
syntax errors, no LINE:COL for a file that cannot be read at all), then ``N problems found``.
Expected lines and columns are counted from the text each test writes.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpuctl.cli.app import app
from gpuctl.config.loader import MAX_ALIAS_VALUES, MAX_BYTES

Doc = dict[str, Any]

_PATH = r"[A-Za-z_][\w-]*(?:\[\d+\]|\.[\w-]+)*"
_LINE = re.compile(
    rf"^error: (?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?:(?P<path>{_PATH}): )?(?P<msg>.+)$"
)


@dataclass(frozen=True)
class Reported:
    line: int
    column: int
    path: str | None
    message: str


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _dump(doc: Doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def _write(tmp_path: Path, content: str | bytes, name: str = "cluster.yml") -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def _errors(runner: CliRunner, target: Path) -> list[str]:
    """Run `check`; assert exit 2 and the shape of stderr; return the `error:` lines."""
    result = runner.invoke(app, ["check", str(target)])
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stdout == ""  # problems go to stderr, stdout stays for machine output
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors, result.stderr
    n = len(errors)
    assert lines == [*errors, f"{n} problem{'s' if n != 1 else ''} found"]
    for line in errors:
        assert line.startswith(f"error: {target}:"), line
    return errors


def _located(runner: CliRunner, target: Path) -> list[Reported]:
    """Like `_errors`, and every line carries FILE:LINE:COL."""
    found = []
    for line in _errors(runner, target):
        m = _LINE.match(line)
        assert m is not None, f"not FILE:LINE:COL: [PATH: ]MESSAGE: {line!r}"
        assert m["file"] == str(target)
        found.append(Reported(int(m["line"]), int(m["col"]), m["path"], m["msg"]))
    return found


def _only(runner: CliRunner, target: Path) -> Reported:
    found = _located(runner, target)
    assert len(found) == 1, found
    return found[0]


def _line_of(text: str, needle: str) -> tuple[int, str]:
    """1-based number and text of the one line containing ``needle``."""
    hits = [(i, line) for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


# --------------------------------------------------------------------------------------------
# YAML syntax


@pytest.mark.parametrize(
    ("text", "line", "at", "fragment"),
    [
        pytest.param(
            "name: demo\nsoftware:\n  cuda: 12.8: x\n",
            3,
            ": x",
            "mapping values are not allowed",
            id="second-colon",
        ),
        pytest.param(
            "name: demo\nsoftware:\n\tcuda: x\n",
            3,
            "\t",
            "found character that cannot start any token",
            id="tab-indent",
        ),
        pytest.param(
            "name: demo\nroles: [a, b\nslurm: x\n",
            3,
            ": x",
            "did not find expected ',' or ']'",
            id="unclosed-flow-sequence",
        ),
        pytest.param(
            "name: demo\nsoftware:\n    cuda: x\n  nccl: y\n",
            4,
            "nccl",
            "did not find expected key",
            id="bad-indentation",
        ),
    ],
)
def test_yaml_syntax_error_is_located(
    runner: CliRunner, tmp_path: Path, text: str, line: int, at: str, fragment: str
) -> None:
    target = _write(tmp_path, text)
    problem = _only(runner, target)
    expected_col = text.splitlines()[line - 1].index(at) + 1
    assert (problem.line, problem.column) == (line, expected_col)
    assert problem.path is None
    assert problem.message.startswith("YAML syntax error: ")
    assert fragment in problem.message


def test_unclosed_quote_points_at_the_end_of_the_file(runner: CliRunner, tmp_path: Path) -> None:
    text = 'name: demo\nsoftware:\n  cuda: "12.8\n  nccl: x\n'
    problem = _only(runner, _write(tmp_path, text))
    assert (problem.line, problem.column) == (text.count("\n") + 1, 1)
    assert "found unexpected end of stream" in problem.message


def test_several_documents_in_one_file(runner: CliRunner, tmp_path: Path) -> None:
    problem = _only(runner, _write(tmp_path, "name: a\n---\nname: b\n"))
    assert problem.line == 2
    assert "expected a single document" in problem.message


# --------------------------------------------------------------------------------------------
# nothing, or not a mapping


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("# only a comment\n\n   # and another\n", id="only-comments"),
    ],
)
def test_empty_file(runner: CliRunner, tmp_path: Path, text: str) -> None:
    problem = _only(runner, _write(tmp_path, text))
    assert (problem.line, problem.column) == (1, 1)
    assert problem.message == "the file is empty; expected a mapping (name:, node_groups:, ...)"


@pytest.mark.parametrize(
    ("text", "line", "found"),
    [
        pytest.param("- name: a\n- name: b\n", 1, "found a list", id="list"),
        pytest.param("# a comment first\nhello\n", 2, "found the text 'hello'", id="text"),
        pytest.param("42\n", 1, "found int 42", id="number"),
        pytest.param("~\n", 1, "found nothing (null)", id="null"),
        pytest.param("---\n...\n", 2, "found nothing (null)", id="empty-document"),
        pytest.param("true\n", 1, "found the boolean True", id="boolean"),
    ],
)
def test_top_level_is_not_a_mapping(
    runner: CliRunner, tmp_path: Path, text: str, line: int, found: str
) -> None:
    problem = _only(runner, _write(tmp_path, text))
    assert (problem.line, problem.column) == (line, 1)
    assert problem.message.startswith("expected a mapping at the top level")
    assert problem.message.endswith(found)


# --------------------------------------------------------------------------------------------
# structure: unknown keys, wrong types, missing keys, duplicates


def test_unknown_key_suggests_the_close_one(
    runner: CliRunner, tmp_path: Path, valid_doc: Doc
) -> None:
    group = valid_doc["node_groups"][1]
    group["memory_gb"] = group.pop("memory_mb")
    text = _dump(valid_doc)
    line, line_text = _line_of(text, "memory_gb:")
    problem = _only(runner, _write(tmp_path, text))
    assert (problem.line, problem.column) == (line, line_text.index("memory_gb") + 1)
    assert problem.path == "node_groups[1].memory_gb"
    assert problem.message == "unknown key 'memory_gb'; did you mean 'memory_mb'?"


def test_unknown_key_with_no_close_match_lists_the_allowed_keys(
    runner: CliRunner, tmp_path: Path, valid_doc: Doc
) -> None:
    valid_doc["ssh"]["zzz"] = 1
    text = _dump(valid_doc)
    line, line_text = _line_of(text, "zzz:")
    problem = _only(runner, _write(tmp_path, text))
    assert (problem.line, problem.column) == (line, line_text.index("zzz") + 1)
    assert problem.path == "ssh.zzz"
    assert problem.message.startswith(
        "unknown key 'zzz'; allowed here: user, private_key, known_hosts, port"
    )


def test_string_where_a_count_belongs(runner: CliRunner, tmp_path: Path, valid_doc: Doc) -> None:
    valid_doc["node_groups"][1]["gpus"]["count"] = "eight"
    text = _dump(valid_doc)
    line, line_text = _line_of(text, "count: eight")
    problem = _only(runner, _write(tmp_path, text))
    assert (problem.line, problem.column) == (line, line_text.index("eight") + 1)
    assert problem.path == "node_groups[1].gpus.count"
    assert "valid integer" in problem.message
    assert "(found the text 'eight')" in problem.message


def test_list_where_a_mapping_belongs(runner: CliRunner, tmp_path: Path, valid_doc: Doc) -> None:
    valid_doc["ssh"] = ["root"]
    text = _dump(valid_doc)
    line, _ = _line_of(text, "- root")
    problem = _only(runner, _write(tmp_path, text))
    assert (problem.line, problem.column) == (line, 1)  # PyYAML writes the list unindented
    assert problem.path == "ssh"
    assert problem.message == "expected a mapping, found a list"


def test_null_where_a_mapping_belongs(runner: CliRunner, tmp_path: Path, valid_doc: Doc) -> None:
    valid_doc["software"] = None
    text = _dump(valid_doc)
    line, line_text = _line_of(text, "software: null")
    problem = _only(runner, _write(tmp_path, text))
    assert (problem.line, problem.column) == (line, line_text.index("null") + 1)
    assert problem.path == "software"
    assert problem.message == "expected a mapping, found nothing (null)"


def test_value_outside_the_choices(runner: CliRunner, tmp_path: Path, valid_doc: Doc) -> None:
    valid_doc["node_groups"][1]["gpus"]["model"] = "h100"
    text = _dump(valid_doc)
    line, line_text = _line_of(text, "model: h100")
    problem = _only(runner, _write(tmp_path, text))
    assert (problem.line, problem.column) == (line, line_text.index("h100") + 1)
    assert problem.path == "node_groups[1].gpus.model"
    assert problem.message.startswith("'h100' is not allowed; expected ")
    assert "'h100-sxm'" in problem.message


def test_missing_required_key_points_at_its_parent(
    runner: CliRunner, tmp_path: Path, valid_doc: Doc
) -> None:
    del valid_doc["slurm"]["controller"]
    text = _dump(valid_doc)
    slurm_line, _ = _line_of(text, "slurm:")
    problem = _only(runner, _write(tmp_path, text))
    # the slurm mapping starts with its first key, on the line below `slurm:`
    assert (problem.line, problem.column) == (slurm_line + 1, 3)
    assert problem.path == "slurm.controller"
    assert problem.message == "required key is missing"


def test_missing_top_level_keys_are_each_reported(runner: CliRunner, tmp_path: Path) -> None:
    found = _located(runner, _write(tmp_path, "schema_version: 1\n"))
    assert {p.path for p in found} == {"name", "software", "node_groups", "slurm"}
    assert all((p.line, p.column) == (1, 1) for p in found)
    assert all(p.message == "required key is missing" for p in found)


def test_duplicate_key(runner: CliRunner, tmp_path: Path, valid_doc: Doc) -> None:
    lines = _dump(valid_doc).splitlines()
    software = lines.index("software:")
    first = next(i for i, line in enumerate(lines) if i > software and line.startswith("  cuda: "))
    lines.insert(first + 1, "  cuda: '12.9'")
    problem = _only(runner, _write(tmp_path, "\n".join(lines) + "\n"))
    assert (problem.line, problem.column) == (first + 2, 3)
    assert problem.path == "software.cuda"
    assert problem.message == f"duplicate key 'cuda' (first at line {first + 1})"


def test_version_written_as_a_number(runner: CliRunner, tmp_path: Path, valid_doc: Doc) -> None:
    text = _dump(valid_doc).replace("cuda: '12.8'", "cuda: 12.10")
    line, line_text = _line_of(text, "cuda: 12.10")
    problem = _only(runner, _write(tmp_path, text))
    assert (problem.line, problem.column) == (line, line_text.index("12.10") + 1)
    assert problem.path == "software.cuda"
    assert problem.message.startswith('write versions as quoted strings ("12.1")')


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("25.10.0-0.128", None),  # linux-rdma/perftest's tag form from 23.04 on
        ("v4.5-0.20", None),  # and before
        ("25.10.0-0.128; rm -rf /", "'25.10.0-0.128; rm -rf /' does not match ^[0-9A-Za-z]"),
        ("../25.10", "'../25.10' does not match ^[0-9A-Za-z]"),
        (25.1, 'write versions as quoted strings ("25.1")'),
    ],
)
def test_perftest_is_a_version_and_a_bad_one_is_one_line(
    runner: CliRunner, tmp_path: Path, valid_doc: Doc, value: Any, expected: str | None
) -> None:
    valid_doc["software"]["perftest"] = value
    valid_doc["package_sources"]["perftest"] = "http://git.example.com/mirror/perftest.git"
    target = _write(tmp_path, _dump(valid_doc))
    if expected is None:
        result = runner.invoke(app, ["check", str(target)])
        assert result.exit_code == 0, result.stderr
        return
    problem = _only(runner, target)
    assert problem.path == "software.perftest"
    assert problem.message.startswith(expected)


def test_non_string_keys(runner: CliRunner, tmp_path: Path, valid_doc: Doc) -> None:
    text = _dump(valid_doc) + "1: one\n"
    messages = [p.message for p in _located(runner, _write(tmp_path, text))]
    assert any("Keys should be strings" in m for m in messages), messages


def test_windows_line_endings_keep_line_numbers(
    runner: CliRunner, tmp_path: Path, valid_doc: Doc
) -> None:
    valid_doc["rollout"]["canary"] = 99
    text = _dump(valid_doc)
    line, _ = _line_of(text, "canary: 99")
    problem = _only(runner, _write(tmp_path, text.replace("\n", "\r\n").encode()))
    assert (problem.line, problem.path) == (line, "rollout.canary")


# --------------------------------------------------------------------------------------------
# values YAML itself cannot read (regressions: these used to crash with exit 70)


@pytest.mark.parametrize(
    ("value", "kind", "fragment"),
    [
        pytest.param("2001-13-45", "timestamp", "month must be in 1..12", id="impossible-date"),
        pytest.param("1" * 5000, "int", "Exceeds the limit", id="5000-digit-int"),
        pytest.param("!!int abc", "int", "invalid literal", id="int-tag"),
        pytest.param("!!float abc", "float", "could not convert", id="float-tag"),
        pytest.param("!!bool maybe", "bool", "", id="bool-tag"),
        pytest.param("!!timestamp soon", "timestamp", "", id="timestamp-tag"),
        pytest.param("!!int", "int", "", id="empty-int"),
    ],
)
def test_value_yaml_cannot_construct(
    runner: CliRunner, tmp_path: Path, value: str, kind: str, fragment: str
) -> None:
    text = f"schema_version: 1\nsoftware:\n  cuda: {value}\n"
    problem = _only(runner, _write(tmp_path, text))
    # the value, or its tag, starts after "  cuda: "
    assert (problem.line, problem.column) == (3, len("  cuda: ") + 1)
    assert problem.path == "software.cuda"
    assert problem.message.startswith("cannot read ")
    assert f"as a YAML {kind}" in problem.message
    assert fragment in problem.message
    assert len(problem.message) < 300  # the 5000 digits are not echoed


def test_key_yaml_cannot_construct(runner: CliRunner, tmp_path: Path) -> None:
    problem = _only(runner, _write(tmp_path, "schema_version: 1\nssh:\n  !!int port: 22\n"))
    assert (problem.line, problem.column, problem.path) == (3, 3, "ssh.port")
    assert problem.message.startswith("cannot read 'port' as a YAML int: invalid literal")


def test_huge_hexadecimal_integer(runner: CliRunner, tmp_path: Path) -> None:
    """Hex integers have no digit limit; the message must not print (or fail to print) it."""
    text = "name: 0x" + "f" * 5000 + "\nschema_version: 0x" + "f" * 5000 + "\n"
    found = {p.path: p for p in _located(runner, _write(tmp_path, text))}
    assert found["name"].message.endswith("(found int <a very large integer>)")
    assert (found["schema_version"].line, found["schema_version"].column) == (2, 17)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("name: !vault |\n  $ANSIBLE_VAULT;1.1\n", "tag '!vault'", id="ansible-vault"),
        pytest.param(
            "name: !!python/object/apply:os.system [echo hi]\n",
            "python/object/apply:os.system",
            id="python-object",
        ),
        pytest.param("? [a, b]\n: c\n", "unhashable key", id="list-as-key"),
        pytest.param("<<: 5\nname: x\n", "expected a mapping or list of mappings", id="merge"),
    ],
)
def test_tags_and_keys_safe_yaml_refuses(
    runner: CliRunner, tmp_path: Path, text: str, fragment: str
) -> None:
    problem = _only(runner, _write(tmp_path, text))
    assert problem.message.startswith("YAML syntax error: ")
    assert fragment in problem.message


@pytest.mark.parametrize(
    ("text", "line", "col", "code"),
    [
        pytest.param("name: demo\x01\n", 1, 11, "0001", id="control-character"),
        pytest.param("name: démo\nssh:\n  user: \x1b[31mroot\n", 3, 9, "001b", id="escape"),
        pytest.param("name: 😀\n\x7f\n", 2, 1, "007f", id="after-wide-characters"),
    ],
)
def test_character_yaml_does_not_allow(
    runner: CliRunner, tmp_path: Path, text: str, line: int, col: int, code: str
) -> None:
    """One line per problem (PyYAML's own message has two), at the character."""
    problem = _only(runner, _write(tmp_path, text))
    assert (problem.line, problem.column) == (line, col)
    assert problem.message == (
        f"YAML error: unacceptable character #x{code}: control characters are not allowed"
    )


# --------------------------------------------------------------------------------------------
# files that cannot be read


def test_non_utf8_file(runner: CliRunner, tmp_path: Path) -> None:
    raw = "name: démo\nsoftware:\n  cuda: ".encode() + b"\xff\xfe\n"
    target = _write(tmp_path, raw)
    (line,) = _errors(runner, target)
    bad = raw.index(b"\xff")
    assert line == f"error: {target}:3:9: not UTF-8 text (byte {bad})"


def test_utf8_with_byte_order_mark_is_fine(
    runner: CliRunner, tmp_path: Path, valid_doc: Doc
) -> None:
    target = _write(tmp_path, b"\xef\xbb\xbf" + _dump(valid_doc).encode())
    result = runner.invoke(app, ["check", str(target)])
    assert result.exit_code == 0, result.stderr
    assert "valid" in result.stdout


def test_missing_file(runner: CliRunner, tmp_path: Path) -> None:
    target = tmp_path / "nope.yml"
    assert _errors(runner, target) == [f"error: {target}: no such file"]


def test_directory(runner: CliRunner, tmp_path: Path) -> None:
    assert _errors(runner, tmp_path) == [f"error: {tmp_path}: is a directory, not a cluster.yml"]


def test_file_too_large(runner: CliRunner, tmp_path: Path) -> None:
    target = _write(tmp_path, b"#" * (MAX_BYTES + 1))
    assert _errors(runner, target) == [f"error: {target}: file is larger than 16 MiB"]


# --------------------------------------------------------------------------------------------
# hostile documents: must end quickly with exit 2, not hang, crash or eat the memory


def _laughs(levels: int, prefix: str = "") -> str:
    lines = [f"{prefix}a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"{prefix}a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(_laughs(10), id="billion-laughs"),
        pytest.param("software:\n" + _laughs(10, "  "), id="billion-laughs-nested"),
        pytest.param(
            _laughs(10) + "node_groups: *a9\nname: *a9\nschema_version: *a9\n",
            id="billion-laughs-used-as-values",
        ),
    ],
)
def test_alias_bomb(runner: CliRunner, tmp_path: Path, text: str) -> None:
    target = _write(tmp_path, text)
    start = time.monotonic()
    (line,) = _errors(runner, target)
    assert time.monotonic() - start < 3
    assert f"aliases expand to more than {MAX_ALIAS_VALUES} values" in line


def test_aliases_used_modestly_are_fine(runner: CliRunner, tmp_path: Path, valid_doc: Doc) -> None:
    valid_doc["slurm"]["cluster_name"] = "ALIAS"
    valid_doc["node_groups"].append(
        {
            "name": "more",
            "nodes": "gpu[005-006]",
            "roles": ["compute"],
            "gpus": "ALIAS",
            "cpu": {"sockets": 2, "cores_per_socket": 56, "threads_per_core": 2},
            "memory_mb": 2000000,
        }
    )
    text = _dump(valid_doc).replace("name: hgx-h100", "name: &cn hgx-h100", 1)
    text = text.replace("gpus:\n", "gpus: &g\n", 1).replace("gpus: ALIAS", "gpus: *g")
    text = text.replace("cluster_name: ALIAS", "cluster_name: *cn")
    assert text.count("*") == 2
    result = runner.invoke(app, ["check", str(_write(tmp_path, text))])
    assert result.exit_code == 0, result.stderr
    assert "gpus      48 (48 x h100-sxm)" in result.stdout


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("a: " + "[" * 5000 + "]" * 5000 + "\n", id="deep-flow"),
        pytest.param(
            "".join("  " * i + f"k{i}:\n" for i in range(500)) + "  " * 500 + "v\n",
            id="deep-block",
        ),
        pytest.param(
            "schema_version: " + "[" * 200 + "]" * 200 + "\n", id="deep-where-a-value-belongs"
        ),
    ],
)
def test_deep_nesting(runner: CliRunner, tmp_path: Path, text: str) -> None:
    start = time.monotonic()
    _errors(runner, _write(tmp_path, text))
    assert time.monotonic() - start < 3


def test_node_set_expanding_to_millions_of_names(
    runner: CliRunner, tmp_path: Path, valid_doc: Doc
) -> None:
    valid_doc["node_groups"][1]["nodes"] = "gpu[1-100]-[1-100]-[1-1000]"
    text = _dump(valid_doc)
    line, _ = _line_of(text, "gpu[1-100]-[1-100]-[1-1000]")
    start = time.monotonic()
    problem = _only(runner, _write(tmp_path, text))
    assert time.monotonic() - start < 3
    assert (problem.line, problem.path) == (line, "node_groups[1].nodes")
    assert problem.message.startswith("expands to 10000000 names")


def test_node_set_naming_a_clustershell_group(
    runner: CliRunner, tmp_path: Path, valid_doc: Doc
) -> None:
    valid_doc["node_groups"][1]["nodes"] = "@foo:bar"
    problem = _only(runner, _write(tmp_path, _dump(valid_doc)))
    assert problem.path == "node_groups[1].nodes"
