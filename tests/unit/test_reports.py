"""Report formats, each read back by a real consumer: junitparser, promtool, headless Chromium."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import junitparser
import pytest
from helpers import require_tool, write_lab_cluster
from typer.testing import CliRunner

from gpuctl.cli.app import app
from gpuctl.validation.reports.drain import REASON_MAX, drain_reasons
from gpuctl.validation.reports.html import render_html
from gpuctl.validation.reports.junit import render_junit
from gpuctl.validation.reports.prom import render_prometheus
from gpuctl.validation.results import CheckResult, NodeReport, ValidationReport, Verdict


def _report() -> ValidationReport:
    def c(node: str, check: str, verdict: Verdict, **kw: Any) -> CheckResult:
        return CheckResult(
            check=check,
            node=node,
            verdict=verdict,
            message=str(kw.pop("message", f"{check} {verdict.value}")),
            **kw,
        )

    nodes = (
        NodeReport(
            "gpu001",
            (
                c("gpu001", "nccl.busbw", Verdict.OK, measured=478.2, expected=460, unit="GB/s"),
                c(
                    "gpu001",
                    "ib.write_bw",
                    Verdict.OK,
                    subject="mlx5_0",
                    measured=385.1,
                    expected=375,
                    unit="Gb/s",
                    limit=400.0,
                ),
            ),
        ),
        NodeReport(
            "gpu002",
            (
                c(
                    "gpu002",
                    "nccl.busbw",
                    Verdict.FAIL,
                    measured=301.5,
                    expected=460,
                    unit="GB/s",
                    message='busbw 301.5 GB/s < 460 "slow" = bad\nsecond line',
                    evidence=("#  8589934592 ... 301.50",),
                ),
                c(
                    "gpu002",
                    "ib.port.state",
                    Verdict.UNKNOWN,
                    subject="mlx5_3/1",
                    message="ibstat timed out",
                ),
                c(
                    "gpu002",
                    "xid",
                    Verdict.WARN,
                    subject="0000:19:00",
                    measured=13,
                    message="Xid 13 x2: monitor",
                ),
            ),
        ),
        NodeReport(
            "gpu003",
            (c("gpu003", "topology.nvlink", Verdict.UNKNOWN, message="topo: not collected"),),
            unknown_fails=False,
        ),
    )
    return ValidationReport(
        cluster="hgx-h100",
        level="standard",
        nodes=nodes,
        generated_at="2026-12-01T00:00:00Z",
        extra={
            "topology": {
                "gpu001": {
                    "devices": ["GPU0", "GPU1", "NIC0"],
                    "links": {
                        "GPU0": {"GPU1": "NV18", "NIC0": "PIX"},
                        "GPU1": {"GPU0": "NV18", "NIC0": "SYS"},
                        "NIC0": {"GPU0": "PIX", "GPU1": "SYS"},
                    },
                }
            },
            "nccl": {
                "gpu001": [[1024.0, 1.5], [1048576.0, 120.0], [8589934592.0, 478.2]],
                "gpu002": [[1024.0, 1.2], [1048576.0, 100.0], [8589934592.0, 301.5]],
            },
            "nccl_threshold": 460,
            "ib_write_bw": {"gpu001": {"mlx5_0": 385.1, "mlx5_1": 342.0}},
            "ib_write_bw_threshold": 375,
        },
    )


def test_json_round_trip_and_summary() -> None:
    rep = _report()
    again = ValidationReport.from_json(json.loads(rep.dumps()))
    assert again.to_json() == rep.to_json()
    assert rep.summary() == {"nodes": 3, "failed": 1, "ok": 1, "warn": 0, "fail": 1, "unknown": 1}
    data = rep.to_json()
    assert data["schema_version"] == 1
    assert data["nodes"][0]["checks"][1]["percent_of_limit"] == 96.3
    with pytest.raises(ValueError, match="schema_version"):
        ValidationReport.from_json({**data, "schema_version": 2})


def test_unknown_fails_the_node_unless_the_user_says_otherwise() -> None:
    rep = _report()
    by = {n.node: n for n in rep.nodes}
    assert by["gpu002"].failed  # FAIL
    assert not by["gpu003"].failed  # UNKNOWN only, unknown_fails=False
    unknown_only = NodeReport("x", by["gpu003"].checks)
    assert unknown_only.failed  # the default fails closed
    assert NodeReport("y", ()).verdict is Verdict.UNKNOWN  # nothing checked is not OK


def test_junit_is_read_back_by_junitparser(tmp_path: Path) -> None:
    path = tmp_path / "r.xml"
    path.write_text(render_junit(_report()), encoding="utf-8")
    xml = junitparser.JUnitXml.fromfile(str(path))
    suites = {s.name: s for s in xml}
    assert set(suites) == {"gpu001", "gpu002", "gpu003"}
    assert (xml.tests, xml.failures, xml.errors) == (6, 1, 2)
    cases = {c.name: c for c in suites["gpu002"]}
    fail = cases["nccl.busbw"].result
    assert len(fail) == 1
    assert isinstance(fail[0], junitparser.Failure)
    assert "301.5" in (fail[0].text or "")
    err = cases["ib.port.state[mlx5_3/1]"].result
    assert isinstance(err[0], junitparser.Error)
    assert cases["xid[0000:19:00]"].is_passed
    assert all(c.is_passed for c in suites["gpu001"])


def test_prometheus_textfile_passes_promtool(tmp_path: Path) -> None:
    promtool = require_tool("promtool", "apt install prometheus")
    text = render_prometheus(_report())
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text, text=True, capture_output=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        'gpuctl_check_verdict{cluster="hgx-h100",node="gpu002",check="nccl.busbw",subject=""} 2'
    ) in text
    assert 'gpuctl_node_failed{cluster="hgx-h100",node="gpu003"} 0' in text
    assert "gpuctl_check_measured{" in text
    assert 'unit="GB/s"} 301.5' in text


def test_drain_reasons_are_short_single_lines_with_our_prefix() -> None:
    reasons = drain_reasons(_report())
    assert set(reasons) == {"gpu002"}
    reason = reasons["gpu002"]
    assert reason.startswith("gpuctl: nccl.busbw ")
    assert len(reason) <= REASON_MAX
    assert "\n" not in reason
    assert '"' not in reason
    assert "=" not in reason
    # every failed check by its id (gpuctl.slurm), then the level of the run
    assert "; ib.port.state mlx5_3/1 " in reason
    assert reason.endswith(" [standard]")


def test_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    chromium = require_tool("chromium", "apt install chromium fonts-dejavu-core")
    html = render_html(_report())
    assert "<script" not in html
    assert "http" not in html.split("</style>", 1)[1]
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    shot = tmp_path / "report.png"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    proc = subprocess.run(
        [chromium, *flags, f"--screenshot={shot}", "--window-size=1200,1600", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    ).stdout
    for text in ("gpu002", "NV18", "busbw by message size", "mlx5_1", "ibstat timed out"):
        assert text in dom


def test_report_cli_writes_every_format(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(_report().dumps(), encoding="utf-8")
    res = CliRunner().invoke(
        app,
        [
            "report",
            str(results),
            "--html",
            str(tmp_path / "r.html"),
            "--junit",
            str(tmp_path / "r.xml"),
            "--prom",
            str(tmp_path / "prom"),
            "--drain-reasons",
        ],
    )
    assert res.exit_code == 1  # a node failed
    assert (tmp_path / "r.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert (tmp_path / "prom" / "gpuctl.prom").is_file()
    assert res.stdout.startswith("gpu002\tgpuctl: nccl.busbw")
    bad = tmp_path / "bad.json"
    bad.write_text("{}", encoding="utf-8")
    res = CliRunner().invoke(app, ["report", str(bad), "--html", str(tmp_path / "x.html")])
    assert res.exit_code == 2
    assert "not gpuctl results" in res.stderr


def test_validate_never_writes_reports_through_a_planted_symlink(tmp_path: Path) -> None:
    from test_collect import FakeConnector, Sim

    from gpuctl.config import load_cluster
    from gpuctl.validation.api import validate

    cluster = write_lab_cluster(tmp_path, 2)
    bundle = tmp_path / "bundle"
    validate(load_cluster(cluster), level="quick", out=bundle, connector=FakeConnector(Sim()))
    out = tmp_path / "out"
    (out / "prom").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("precious\n", encoding="utf-8")
    planted = ["r.html", ".r.html.tmp", "r.xml", ".r.xml.tmp", "prom/gpuctl.prom"]
    planted.append("prom/.gpuctl.prom.tmp")
    for name in planted:
        (out / name).symlink_to(victim)
    res = CliRunner().invoke(
        app,
        [
            "validate",
            str(cluster),
            "--bundle",
            str(bundle),
            "--html",
            str(out / "r.html"),
            "--junit",
            str(out / "r.xml"),
            "--prom",
            str(out / "prom"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert victim.read_text(encoding="utf-8") == "precious\n"
    for target in (out / "r.html", out / "r.xml", out / "prom" / "gpuctl.prom"):
        assert not target.is_symlink()
        assert target.stat().st_size > 100


def test_report_of_a_results_file_with_a_non_finite_number_never_crashes() -> None:
    rep = _report()
    node = rep.nodes[0]
    bad = CheckResult("nccl.busbw", node.node, Verdict.OK, "ok", measured=float("nan"))
    rep = ValidationReport(
        rep.cluster, rep.level, (NodeReport(node.node, (bad,)), *rep.nodes[1:]), extra=rep.extra
    )
    data = json.loads(rep.dumps())
    assert data["nodes"][0]["checks"][0]["measured"] is None
    assert data["nodes"][0]["checks"][0]["verdict"] == "unknown"
    for render in (render_html, render_junit, render_prometheus):
        render(rep)


def _write_every_format(tmp_path: Path, jobs: int) -> None:
    from gpuctl.validation.reports.write import write_reports

    rep = _report()
    files = [
        ("prom", tmp_path / "gpuctl.prom"),
        ("json", tmp_path / "results.json"),
        ("html", tmp_path / "report.html"),
        ("junit", tmp_path / "results.xml"),
    ]
    assert write_reports(rep, files, jobs=jobs) == tuple(p for _, p in files)
    assert (tmp_path / "gpuctl.prom").read_text() == render_prometheus(rep)
    assert (tmp_path / "results.json").read_text() == rep.dumps()
    assert (tmp_path / "report.html").read_text() == render_html(rep)
    assert (tmp_path / "results.xml").read_text() == render_junit(rep)
    # a file in a "folder" that is a file: its OSError, with its name
    (tmp_path / "a-file").write_text("")
    bad = tmp_path / "a-file" / "results.xml"
    with pytest.raises(OSError, match="a-file") as caught:
        write_reports(rep, [("json", tmp_path / "r.json"), ("junit", bad)], jobs=jobs)
    assert "a-file" in str(caught.value.filename)
    with pytest.raises(ValueError, match="no report format pdf"):
        write_reports(rep, [("pdf", tmp_path / "r.pdf")], jobs=jobs)


def test_write_reports_writes_what_each_renderer_renders(tmp_path: Path) -> None:
    _write_every_format(tmp_path, jobs=1)


def test_write_reports_in_forked_workers_writes_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large report's formats are rendered side by side in forked workers
    (reports/write.py): the same bytes, the paths in the order asked, the same errors."""
    from gpuctl.validation.reports import write

    monkeypatch.setattr(write, "PARALLEL_MIN_CHECKS", 1)  # this small report counts as large
    _write_every_format(tmp_path, jobs=2)
    # a worker that dies (killed, out of memory) leaves no file half written: every file is
    # written again in this process
    parent = os.getpid()
    junit = write.RENDERERS["junit"]

    def dies_in_a_worker(rep: ValidationReport) -> str:
        if os.getpid() != parent:
            os._exit(9)
        return junit(rep)

    monkeypatch.setitem(write.RENDERERS, "junit", dies_in_a_worker)
    again = tmp_path / "again"
    again.mkdir()
    _write_every_format(again, jobs=2)


def test_a_check_result_pickles_with_every_field() -> None:
    """CheckResult.__reduce__ names its fields one by one (worker processes return results
    pickled): a field added to the class and not to __reduce__ would be lost on the way."""
    import dataclasses
    import pickle

    values: dict[str, Any] = {}
    for i, f in enumerate(dataclasses.fields(CheckResult)):
        values[f.name] = (
            Verdict.WARN if f.name == "verdict" else (f"e{i}",) if f.name == "evidence" else i
        )
    check = CheckResult(**values)
    back = pickle.loads(pickle.dumps(check))  # noqa: S301 - the bytes just made here
    assert back == check
    assert [getattr(back, f.name) for f in dataclasses.fields(CheckResult)] == list(values.values())
