"""What the command line prints about nodes and runs: node text literally (no emoji codes, no
markup, no escape sequences), the real numbers in headers and summaries, complete help."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpuctl.cli import provision_cmds, validate_cmd
from gpuctl.cli.app import app
from gpuctl.cli.output import err_console, literal, out_console
from gpuctl.errors import UsageError
from gpuctl.provision import HostOutcome, ProvisionResult, RunRecord
from gpuctl.validation.results import CheckResult, NodeReport, ValidationReport, Verdict

runner = CliRunner()
NODE_TEXT = "GPU 0000:ab:00.0 :smile: [red]fell[/red] off the bus \x1b[2J"


def test_the_validate_table_prints_node_text_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    """rich turned the PCI address 0000:ab:00 into an emoji (its :ab: code)."""
    check = CheckResult("gpu.count", "gpu001", Verdict.FAIL, NODE_TEXT, subject="GPU3")
    report = ValidationReport("lab", "quick", (NodeReport("gpu001", (check,)),))
    out_console().print(validate_cmd._table(report))
    shown = capsys.readouterr().out
    assert "0000:ab:00.0 :smile: [red]fell[/red] off the bus \\x1b[2J" in shown
    assert "\x1b" not in shown


@pytest.mark.parametrize("console", [out_console, err_console])
def test_every_console_prints_emoji_codes_as_text(
    console: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    console().print(literal(NODE_TEXT))
    captured = capsys.readouterr()
    assert "0000:ab:00.0 :smile: [red]fell[/red] off the bus \\x1b[2J" in (
        captured.out + captured.err
    )


@pytest.mark.parametrize(
    ("more", "header"),
    [((), "(level quick, 4 nodes, 4 at a time)"), (("--limit", "gpu002"), "1 node, 1 at a time")],
)
def test_the_validate_header_says_how_many_nodes(
    cluster_yml: Path, monkeypatch: pytest.MonkeyPatch, more: tuple[str, ...], header: str
) -> None:
    """It said "64 nodes at once" (the --parallel default) on a 4-node cluster."""

    def stop(*args: Any, **kw: Any) -> Any:
        raise UsageError("stopped after the header")

    monkeypatch.setattr(validate_cmd, "validate", stop)
    res = runner.invoke(app, ["validate", str(cluster_yml), "--level", "quick", *more])
    assert res.exit_code == 2
    assert header in res.stderr
    assert "64 nodes" not in res.stderr


def test_validate_help_names_the_multi_node_phase_of_long() -> None:
    res = runner.invoke(app, ["validate", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    text = " ".join(res.stdout.replace("│", " ").split())
    assert "multi-node nccl-tests through Slurm" in text


def _provision_result(tmp_path: Path, hosts: dict[str, HostOutcome]) -> ProvisionResult:
    record = RunRecord("r1", "lab", "now", status="successful", check=True, hosts=hosts)
    return ProvisionResult("r1", tmp_path / "runs" / "r1", record, 3.0)


@pytest.mark.parametrize(
    ("hosts", "note"),
    [
        (
            {
                "gpu001": HostOutcome(ok=9, changed=2, state="changed"),
                "gpu002": HostOutcome(ok=11, state="ok"),
            },
            "(check mode: would change 2 tasks on 1 host; nothing was applied)",
        ),
        ({"gpu001": HostOutcome(ok=11, state="ok")}, "(check mode: nothing would change)"),
    ],
)
def test_provision_check_says_what_would_change(
    cluster_yml: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    hosts: dict[str, HostOutcome],
    note: str,
) -> None:
    """It said "nothing changed" beside a table with changed=2."""
    monkeypatch.setattr(
        provision_cmds, "provision", lambda *a, **kw: _provision_result(tmp_path, hosts)
    )
    res = runner.invoke(app, ["provision", str(cluster_yml), "--check"])
    assert res.exit_code == 0, res.output
    assert note in res.stderr
    assert "nothing changed" not in res.stderr
