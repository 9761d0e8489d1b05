"""Issue 14: output that breaks its consumers.

Text that reaches a report comes from the nodes (a job names its own process, and the name lands
in an Xid line of the kernel log) or from a results.json someone else wrote. Every report stays
well-formed for its reader: JUnit XML parses, HTML carries no raw control character, the
Prometheus textfile follows the exposition grammar line by line, a drain reason is one line, and
`gpuctl report` refuses a results.json gpuctl would not write with exit 2 and one line, never a
traceback. Report files are replaced through gpuctl.fileio.write_atomic, never through a link.
"""

from __future__ import annotations

import io
import json
import math
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import junitparser
import pytest
from helpers import require_tool
from rich.console import Console
from typer.testing import CliRunner, Result

from gpuctl.cli import report_cmd, validate_cmd
from gpuctl.cli.app import app
from gpuctl.validation import slurm
from gpuctl.validation.reports.drain import REASON_MAX, drain_reasons
from gpuctl.validation.reports.html import render_html
from gpuctl.validation.reports.junit import render_junit
from gpuctl.validation.reports.prom import render_prometheus
from gpuctl.validation.results import CheckResult, NodeReport, ValidationReport, Verdict

runner = CliRunner()

# every C0 control, then the ones a kernel log line can carry in practice
C0 = "".join(chr(i) for i in range(0x20))
HOSTILE = C0 + "\x1b[31mred\x1b[0m \x07bell \x7fdel \x85nel \ud800lone \u2028\u2029 \u202eevil"
# nothing of this may reach a report raw: C0 but tab and newline, DEL, C1, surrogates, the
# Unicode line and paragraph separators, bidi embeddings, overrides and isolates
RAW_BAD = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
# ... and in a one-line field (drain reason, label value) no tab or newline either
LINE_BAD = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _check(node: str, check: str, verdict: Verdict, **kw: Any) -> CheckResult:
    return CheckResult(check=check, node=node, verdict=verdict, **kw)


def _hostile(node_names: bool = True) -> ValidationReport:
    """Hostile text everywhere a report shows text: messages, evidence, measured strings,
    subjects, units, node names (unless ``node_names`` is false), chart labels."""
    bad_node = f"gpu{HOSTILE}001" if node_names else "gpu001"
    checks = (
        _check(
            bad_node,
            "xid",
            Verdict.FAIL,
            message=f"Xid 79 by process {HOSTILE}",
            subject=f"GPU{HOSTILE}0",
            measured=f"proc{HOSTILE}",
            expected=f"none{HOSTILE}",
            unit=f"u{HOSTILE}",
            source=f"src{HOSTILE}",
            evidence=(f"NVRM: Xid (PCI:0000:19:00): 79, pid=1, name={HOSTILE}",),
        ),
        _check(
            bad_node,
            "ib.port.state",
            Verdict.UNKNOWN,
            message=f"ibstat {HOSTILE}",
            subject='mlx5_"0\\1',
            measured=12.5,
            unit="Gb/s",
            evidence=(HOSTILE,),
        ),
        _check(bad_node, "nccl.busbw", Verdict.WARN, message=f"slow {HOSTILE}", measured=300.0),
        _check(bad_node, "gpu.count", Verdict.OK, message="8 GPUs", measured=8, expected=8),
    )
    ok_node = NodeReport("gpu002", (_check("gpu002", "gpu.count", Verdict.OK, message="ok"),))
    return ValidationReport(
        cluster=f"c{HOSTILE}",
        level="quick",
        nodes=(NodeReport(bad_node, checks), ok_node),
        generated_at=f"2026{HOSTILE}",
        extra={
            "topology": {
                bad_node: {
                    "devices": [f"GPU{HOSTILE}", "NIC0"],
                    "links": {f"GPU{HOSTILE}": {"NIC0": f"PIX{HOSTILE}"}},
                }
            },
            "nccl": {bad_node: [[1024.0, 1.0], [8589934592.0, 300.0]]},
            "nccl_threshold": 400.0,
            "ib_write_bw": {bad_node: {f"mlx5{HOSTILE}": 12.5}},
            "ib_write_bw_threshold": 375.0,
        },
    )


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


# --------------------------------------------------------------------------------------------
# 1. every renderer neutralises control characters


def test_junit_with_control_characters_is_well_formed(tmp_path: Path) -> None:
    text = render_junit(_hostile())
    assert not RAW_BAD.search(text)
    data = text.encode("utf-8")
    root = ET.fromstring(data)  # noqa: S314 - our own output
    assert root.tag == "testsuites"
    path = tmp_path / "r.xml"
    path.write_bytes(data)
    xml = junitparser.JUnitXml.fromfile(str(path))
    assert (xml.tests, xml.failures, xml.errors) == (5, 1, 1)
    # the text is shown, escaped, not dropped
    assert "x1b[31mred" in text


def test_html_carries_no_raw_control_character() -> None:
    html = render_html(_hostile())
    html.encode("utf-8")  # a lone surrogate cannot be written as UTF-8
    assert not RAW_BAD.search(html), RAW_BAD.findall(html)
    assert "x1b[31mred" in html


PROM_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
PROM_VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
PROM_SAMPLE = re.compile(
    rf"{PROM_NAME}\{{[a-zA-Z_][a-zA-Z0-9_]*={PROM_VALUE}(?:,[a-zA-Z_][a-zA-Z0-9_]*={PROM_VALUE})*\}}"
    r" [-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|NaN|[-+]Inf)"
)
PROM_COMMENT = re.compile(rf"# (?:HELP {PROM_NAME} [^\n]*|TYPE {PROM_NAME} (?:gauge|counter))")


def test_prometheus_textfile_follows_the_line_grammar() -> None:
    text = render_prometheus(_hostile())
    assert text.endswith("\n")
    lines = text[:-1].split("\n")
    for line in lines:
        assert PROM_SAMPLE.fullmatch(line) or PROM_COMMENT.fullmatch(line), repr(line)
        assert not LINE_BAD.search(line), repr(line)
    # label values escaped as the exposition format says: backslash, quote, newline
    assert 'subject="mlx5_\\"0\\\\1"' in text
    samples = [ln for ln in lines if ln.startswith("gpuctl_check_verdict{")]
    assert len(samples) == 5  # one per check, none split or lost
    promtool = require_tool("promtool", "apt install prometheus")
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text, text=True, capture_output=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_drain_reasons_carry_no_control_character() -> None:
    reasons = drain_reasons(_hostile())
    assert len(reasons) == 1
    (reason,) = reasons.values()
    assert reason.startswith("gpuctl: xid ")
    assert not LINE_BAD.search(reason), repr(reason)
    assert len(reason) <= REASON_MAX
    reason.encode("utf-8")


def test_json_results_carry_no_lone_surrogate_or_control() -> None:
    rep = _hostile(node_names=False)
    # with ensure_ascii=False (a consumer writing UTF-8) a lone surrogate cannot be encoded
    json.dumps(rep.to_json(), ensure_ascii=False).encode("utf-8")
    data = json.loads(rep.dumps())
    for s in _strings(data):
        assert not RAW_BAD.search(s), repr(s)
    again = ValidationReport.from_json(data)
    assert again.dumps() == rep.dumps()  # cleaning is idempotent: the file reads back the same


def test_the_validate_table_and_drain_lines_show_no_raw_control_character(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None, force_terminal=False)
    monkeypatch.setattr(validate_cmd, "err_console", lambda: console)
    console.print(validate_cmd._table(_hostile()))
    drained = slurm.DrainResult(
        "ctl01",
        (
            slurm.SlurmAction("gpu001", "drain", f"gpuctl: {HOSTILE}", "drain"),
            slurm.SlurmAction("gpu002", "none", None, f"left alone: {HOSTILE}"),
            slurm.SlurmAction("gpu003", "resume", f"r {HOSTILE}", "resume", error=HOSTILE),
        ),
    )
    validate_cmd._print_drain(drained)
    text = out.getvalue()
    assert not RAW_BAD.search(text), RAW_BAD.findall(text)
    assert "x1b[31mred" in text


# --------------------------------------------------------------------------------------------
# 4 (part). NaN and infinity never reach results.json, and never pass


@pytest.mark.parametrize("field", ["measured", "expected", "limit"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_become_null_and_never_pass(field: str, value: float) -> None:
    kw: dict[str, Any] = {"measured": 380.0, "expected": 375.0, "limit": 400.0, field: value}
    c = _check("gpu001", "ib.write_bw", Verdict.OK, message="ok", **kw)
    assert c.verdict is not Verdict.OK
    assert c.percent_of_limit is None or math.isfinite(c.percent_of_limit)
    rep = ValidationReport("c", "quick", (NodeReport("gpu001", (c,)),), extra={"x": [value]})
    data = json.loads(rep.dumps())  # allow_nan=False: no exception, no NaN token
    got = data["nodes"][0]["checks"][0]
    assert got[field] is None
    assert got["verdict"] != "ok"
    assert data["extra"] == {"x": [None]}
    assert data["nodes"][0]["failed"] is True


def test_percent_of_limit_that_overflows_is_null() -> None:
    c = _check("gpu001", "ib.write_bw", Verdict.OK, message="ok", measured=1e308, limit=1e-300)
    assert c.percent_of_limit is None
    json.loads(ValidationReport("c", "q", (NodeReport("gpu001", (c,)),)).dumps())


# --------------------------------------------------------------------------------------------
# 2. one node, one line: drain reasons of `gpuctl report` and the reason given to scontrol


def _results_file(tmp_path: Path, data: Any, name: str = "results.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _one_node(node: str = "gpu001", **check: Any) -> dict[str, Any]:
    c = {
        "check": "xid",
        "node": node,
        "verdict": "fail",
        "message": "Xid 79",
        "evidence": [],
        **check,
    }
    return {
        "schema_version": 1,
        "cluster": "c",
        "level": "quick",
        "nodes": [{"node": node, "checks": [c]}],
    }


def _no_traceback(res: Result) -> None:
    assert "Traceback" not in res.stdout + res.stderr
    assert res.exit_code != 70


@pytest.mark.parametrize(
    "name", ["gpu001\nhealthy01", "gpu001\thealthy01", "gpu001 x", "-gpu", "a..b", "", "g\x1b"]
)
def test_a_node_name_that_is_not_a_host_name_is_refused(tmp_path: Path, name: str) -> None:
    path = _results_file(tmp_path, _one_node(name))
    res = runner.invoke(app, ["report", str(path), "--drain-reasons"])
    _no_traceback(res)
    assert res.exit_code == 2
    assert res.stdout == ""
    assert res.stderr == (
        f"error: {path}: not gpuctl results: nodes[0].node: node name {name!r} is not a "
        "host name\n1 problem found\n"
    )


def test_drain_reasons_print_one_line_per_failed_node(tmp_path: Path) -> None:
    hostile = HOSTILE.replace("\ud800", "")  # results.json cannot carry one (see below)
    data = _one_node(message=f"Xid 79\thealthy01\tgpuctl: x\nhealthy02\tgpuctl: y\r{hostile}")
    data["nodes"][0]["checks"][0]["subject"] = "GPU0\nhealthy03\tz"
    data["nodes"].append(
        {
            "node": "gpu002",
            "checks": [{"check": "c", "node": "gpu002", "verdict": "ok", "message": "m"}],
        }
    )
    path = _results_file(tmp_path, data)
    res = runner.invoke(app, ["report", str(path), "--drain-reasons"])
    _no_traceback(res)
    assert res.exit_code == 1, res.output
    lines = res.stdout.split("\n")
    assert lines[-1] == ""
    assert len(lines) == 2, res.stdout
    node, reason = lines[0].split("\t")
    assert node == "gpu001"
    assert reason.startswith("gpuctl: xid GPU0 healthy03 z Xid 79 healthy01 gpuctl: x")
    assert not LINE_BAD.search(reason)


def test_the_reason_given_to_scontrol_is_one_clean_line() -> None:
    action = slurm.SlurmAction("gpu001", "drain", f"gpuctl: xid a\nb\tc {HOSTILE}", "drain")
    argv = slurm.update_argv(action)
    reason = next(a for a in argv if a.startswith("reason="))
    assert not LINE_BAD.search(reason), repr(reason)
    assert len(reason) <= len("reason=") + REASON_MAX
    assert argv[:4] == ("scontrol", "update", "nodename=gpu001", "state=drain")
    rep = _hostile(node_names=False)
    (planned,) = [a for a in slurm.plan(rep, {"gpu001": {"state": "IDLE"}}) if a.reason]
    assert planned.action == "drain"
    assert planned.reason is not None
    assert not LINE_BAD.search(planned.reason)


def test_scontrol_is_never_given_a_node_name_that_is_not_a_host_name() -> None:
    action = slurm.SlurmAction("gpu001 state=resume", "drain", "gpuctl: x", "drain")
    with pytest.raises(ValueError, match="not a host name"):
        slurm.update_argv(action)


# --------------------------------------------------------------------------------------------
# 3. report files are replaced, never written through a planted link


def test_report_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(_hostile(node_names=False).dumps(), encoding="utf-8")
    out = tmp_path / "out"
    (out / "prom").mkdir(parents=True)
    victims = {}
    for name in (
        "report.html",
        ".report.html.tmp",
        "r.xml",
        ".r.xml.tmp",
        "prom/gpuctl.prom",
        "prom/.gpuctl.prom.tmp",
    ):
        victim = tmp_path / f"victim-{name.replace('/', '-')}"
        victim.write_text("precious\n", encoding="utf-8")
        (out / name).symlink_to(victim)
        victims[victim] = out / name
    res = runner.invoke(
        app,
        [
            "report",
            str(results),
            "--html",
            str(out / "report.html"),
            "--junit",
            str(out / "r.xml"),
            "--prom",
            str(out / "prom"),
        ],
    )
    _no_traceback(res)
    assert res.exit_code == 1, res.output
    for victim in victims:
        assert victim.read_text(encoding="utf-8") == "precious\n", victim.name
    for target in (out / "report.html", out / "r.xml", out / "prom" / "gpuctl.prom"):
        assert not target.is_symlink()
        assert target.stat().st_size > 100
    assert (out / "report.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


# --------------------------------------------------------------------------------------------
# 4. a results.json gpuctl would not write: exit 2, one line, never a traceback


def _with(path: str, value: Any) -> dict[str, Any]:
    """A valid results document with the value at ``path`` (dotted, ints index lists) replaced."""
    doc: Any = _one_node()
    doc["extra"] = {}
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    target = doc
    for k in keys[:-1]:
        target = target[k]
    target[keys[-1]] = value
    return doc  # type: ignore[no-any-return]


MALFORMED: list[tuple[str, str | bytes | Any, str]] = [
    ("not-utf8", b'{"schema_version": 1, "cluster": "\xff"}', "not UTF-8 (byte 0xff at offset 34)"),
    (
        "not-json",
        "{",
        "not JSON: Expecting property name enclosed in double quotes (line 1, column 2)",
    ),
    ("nan", '{"schema_version": NaN}', "not JSON: NaN is not a number JSON allows"),
    ("deep", "[" * 10_000 + "]" * 10_000, "nested too deeply"),
    ("deep-object", '{"a":' * 10_000 + "1" + "}" * 10_000, "nested too deeply"),
    ("top-list", [1, 2], "the top level is a list, not an object"),
    (
        "extra-key-surrogate",
        '{"schema_version": 1, "cluster": "c", "level": "q", "nodes": [], "extra": {"\\ud800": 1}}',
        "extra: a key with a lone surrogate (not Unicode text)",
    ),
    ("top-null", None, "the top level is null, not an object"),
    (
        "version",
        _with("schema_version", 2),
        "results schema_version 2; this gpuctl reads 1",
    ),
    ("cluster-number", _with("cluster", 5), "cluster: a number, expected a string"),
    ("nodes-number", _with("nodes", 5), "nodes: a number, expected a list"),
    ("nodes-object", _with("nodes", {"gpu001": 1}), "nodes: an object, expected a list"),
    ("node-null", _with("nodes.0", None), "nodes[0]: null, expected an object"),
    ("node-name-null", _with("nodes.0.node", None), "nodes[0].node: null, expected a string"),
    ("checks-number", _with("nodes.0.checks", 5), "nodes[0].checks: a number, expected a list"),
    ("checks-missing", _with("nodes.0.checks", ...), "nodes[0].checks: missing"),
    (
        "check-string",
        _with("nodes.0.checks.0", "xid"),
        "nodes[0].checks[0]: a string, expected an object",
    ),
    (
        "verdict",
        _with("nodes.0.checks.0.verdict", "great"),
        "nodes[0].checks[0].verdict: 'great' is not a verdict (ok, warn, fail, unknown)",
    ),
    (
        "verdict-number",
        _with("nodes.0.checks.0.verdict", 2),
        "nodes[0].checks[0].verdict: 2 is not a verdict (ok, warn, fail, unknown)",
    ),
    (
        "check-node",
        _with("nodes.0.checks.0.node", "a\nb"),
        "nodes[0].checks[0].node: node name 'a\\nb' is not a host name",
    ),
    (
        "message-list",
        _with("nodes.0.checks.0.message", ["a"]),
        "nodes[0].checks[0].message: a list, expected a string",
    ),
    (
        "evidence-number",
        _with("nodes.0.checks.0.evidence", 5),
        "nodes[0].checks[0].evidence: a number, expected a list",
    ),
    (
        "evidence-line",
        _with("nodes.0.checks.0.evidence", [1]),
        "nodes[0].checks[0].evidence[0]: a number, expected a string",
    ),
    (
        "limit-string",
        _with("nodes.0.checks.0.limit", "400"),
        "nodes[0].checks[0].limit: a string, expected a number",
    ),
    (
        "limit-bool",
        _with("nodes.0.checks.0.limit", True),
        "nodes[0].checks[0].limit: a boolean, expected a number",
    ),
    (
        "measured-huge",
        _with("nodes.0.checks.0.measured", 10**400),
        "nodes[0].checks[0].measured: not a finite number",
    ),
    (
        "measured-infinite",
        json.dumps(_with("nodes.0.checks.0.measured", "INF")).replace('"INF"', "1e400"),
        "nodes[0].checks[0].measured: not a finite number",
    ),
    (
        "measured-long",
        json.dumps(_with("nodes.0.checks.0.measured", "INF")).replace('"INF"', "9" * 5000),
        "not JSON: Exceeds the limit (4300 digits) for integer string conversion",
    ),
    (
        "unknown-fails",
        _with("nodes.0.unknown_fails", "no"),
        "nodes[0].unknown_fails: a string, expected a boolean",
    ),
    ("extra-list", _with("extra", [1]), "extra: a list, expected an object"),
    (
        "extra-topology",
        _with("extra", {"topology": 5}),
        "extra.topology: a number, expected an object",
    ),
    (
        "extra-ib",
        _with("extra", {"ib_write_bw": {"gpu001": {"mlx5_0": "fast"}}}),
        "extra.ib_write_bw.gpu001.mlx5_0: a string, expected a number",
    ),
    (
        "extra-nccl",
        _with("extra", {"nccl": {"gpu001": [[1, 2, 3]]}}),
        "extra.nccl.gpu001[0]: a list of 3, expected [size, busbw]",
    ),
    (
        "extra-threshold",
        _with("extra", {"nccl_threshold": "fast"}),
        "extra.nccl_threshold: a string, expected a number",
    ),
    (
        "extra-deep",
        _with("extra", {"x": json.loads("[" * 100 + "]" * 100)}),
        "extra.x: nested deeper than 32 levels",
    ),
]


def _write_malformed(tmp_path: Path, content: str | bytes | Any) -> Path:
    path = tmp_path / "results.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_text(json.dumps(_drop_ellipsis(content)), encoding="utf-8")
    return path


def _drop_ellipsis(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_ellipsis(v) for k, v in value.items() if v is not ...}
    if isinstance(value, list):
        return [_drop_ellipsis(v) for v in value]
    return value


@pytest.mark.parametrize(
    ("content", "message"), [(c, m) for _, c, m in MALFORMED], ids=[i for i, _, _ in MALFORMED]
)
def test_results_gpuctl_would_not_write_exit_2_with_one_line(
    tmp_path: Path, content: Any, message: str
) -> None:
    path = _write_malformed(tmp_path, content)
    res = runner.invoke(
        app, ["report", str(path), "--html", str(tmp_path / "r.html"), "--drain-reasons"]
    )
    _no_traceback(res)
    assert res.exit_code == 2, res.output
    assert res.stderr == f"error: {path}: not gpuctl results: {message}\n1 problem found\n"
    assert not (tmp_path / "r.html").exists()


LONE = [
    ("message", "nodes.0.checks.0.message", "X", "nodes[0].checks[0].message"),
    ("subject", "nodes.0.checks.0.subject", "X", "nodes[0].checks[0].subject"),
    ("evidence", "nodes.0.checks.0.evidence", ["X"], "nodes[0].checks[0].evidence[0]"),
    ("measured", "nodes.0.checks.0.measured", ["X"], "nodes[0].checks[0].measured[0]"),
    ("cluster", "cluster", "X", "cluster"),
    ("extra", "extra", {"topology": {"gpu001": {"devices": ["X"]}}}, "extra.topology.gpu001"),
]


@pytest.mark.parametrize(
    ("where", "value", "shown"), [(w, v, s) for _, w, v, s in LONE], ids=[i for i, *_ in LONE]
)
def test_a_lone_surrogate_is_refused(tmp_path: Path, where: str, value: Any, shown: str) -> None:
    text = json.dumps(_with(where, value)).replace('"X"', '"a\\ud800b"')
    path = tmp_path / "results.json"
    path.write_text(text, encoding="utf-8")
    res = runner.invoke(app, ["report", str(path), "--html", str(tmp_path / "r.html")])
    _no_traceback(res)
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(f"error: {path}: not gpuctl results: {shown}")
    assert res.stderr.endswith(": a lone surrogate (not Unicode text)\n1 problem found\n")
    assert res.stderr.count("\n") == 2


def test_a_surrogate_pair_is_text_not_a_lone_surrogate(tmp_path: Path) -> None:
    doc = _one_node(message="X")
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc).replace('"X"', '"GPU \\ud83d\\ude00"'), encoding="utf-8")
    res = runner.invoke(app, ["report", str(path), "--drain-reasons"])
    assert res.exit_code == 1, res.output
    assert res.stdout == "gpu001\tgpuctl: xid GPU \U0001f600 [quick]\n"


def test_a_device_or_a_file_too_large_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = runner.invoke(app, ["report", "/dev/zero", "--drain-reasons"])
    _no_traceback(res)
    assert res.exit_code == 2
    assert res.stderr.startswith("error: cannot read /dev/zero: /dev/zero: not a regular file")
    path = _results_file(tmp_path, _one_node())
    monkeypatch.setattr(report_cmd, "MAX_RESULTS", 100)
    res = runner.invoke(app, ["report", str(path), "--drain-reasons"])
    assert res.exit_code == 2
    assert res.stderr == f"error: cannot read {path}: {path}: larger than 100 bytes\n"
