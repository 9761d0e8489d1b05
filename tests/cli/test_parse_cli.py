"""`gpuctl parse KIND FILE`: the JSON envelope and its exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import ROOT
from typer.testing import CliRunner

from gpuctl.cli.app import app
from gpuctl.validation.capture import capture_output
from gpuctl.validation.parsing import registry


def _body(rel: str) -> str:
    return capture_output(ROOT / "tests" / "fixtures" / rel)


def test_parse_file_prints_the_envelope(tmp_path: Path) -> None:
    f = tmp_path / "ibstat.txt"
    f.write_text(_body("ib/ibstat-h100-ib-ndr400-all-active-space-indent.txt"), encoding="utf-8")
    res = CliRunner().invoke(app, ["parse", "ibstat", str(f)])
    assert res.exit_code == 0, res.output
    env = json.loads(res.stdout)
    assert list(env) == ["kind", "schema_version", "recognised", "data", "problems"]
    assert env["kind"] == "ibstat"
    assert env["schema_version"] == 1
    assert env["data"]["cas"]["mlx5_0"]["ports"]["1"]["rate"] == 400


def test_parse_stdin_and_unrecognised_input_exits_1() -> None:
    res = CliRunner().invoke(app, ["parse", "topo", "-"], input="hello\n")
    assert res.exit_code == 1
    env = json.loads(res.stdout)
    assert env["recognised"] is False
    assert env["problems"]


def test_csv_without_header_takes_fields(tmp_path: Path) -> None:
    f = tmp_path / "q.csv"
    f.write_text(_body("nvidia-smi/query-gpu-csv-noheader-name-deviceid-h100nvl.txt"))
    res = CliRunner().invoke(app, ["parse", "smi-csv", str(f), "--fields", "name,pci.device_id"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["data"]["rows"]
    assert rows[0]["name"] == "NVIDIA H100 NVL"
    res = CliRunner().invoke(app, ["parse", "topo", str(f), "--fields", "name"])
    assert res.exit_code == 2


def test_unknown_kind_and_missing_file_are_usage_errors(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["parse", "nope", "-"], input="")
    assert res.exit_code == 2
    assert "unknown kind 'nope'" in res.stderr
    res = CliRunner().invoke(app, ["parse", "topo", str(tmp_path / "missing.txt")])
    assert res.exit_code == 2


def test_list_names_every_kind_of_the_contract() -> None:
    res = CliRunner().invoke(app, ["parse", "list"])
    assert res.exit_code == 0
    contract = {
        "topo",
        "nccl",
        "perftest",
        "ibstat",
        "ibstatus",
        "ibdev2netdev",
        "ibv-devinfo",
        "sinfo",
        "scontrol-node",
        "xid",
        "fabricmanager",
        "smi-csv",
        "smi-q",
        "smi-xml",
        "dcgm-diag",
    }
    assert contract <= set(registry())
    for kind in contract:
        assert kind in res.stdout


def test_docs_parse_md_documents_every_kind() -> None:
    text = (ROOT / "docs" / "parse.md").read_text(encoding="utf-8")
    index = text.split("| kind | command | section |", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in index.splitlines() if line.startswith("| `")]
    kinds_in_table = {line.split("`")[1] for line in rows}
    assert kinds_in_table == set(registry()), "update the table in docs/parse.md"
    for kind in registry():
        assert text.count(f"`{kind}`") >= 2, f"{kind} has no section in docs/parse.md"


def test_list_shows_the_commands_gpuctl_runs() -> None:
    from gpuctl.cli.parse_cmd import commands_by_kind

    res = CliRunner().invoke(app, ["parse", "list"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    for kind, commands in commands_by_kind().items():
        at = next(i for i, line in enumerate(lines) if line.split(" ", 1)[0] == kind)
        shown = [line.strip()[2:] for line in lines[at + 1 : at + 1 + len(commands)]]
        assert shown == commands, kind
