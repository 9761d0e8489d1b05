"""`gpuctl lab` refuses to run without root, with a clear message (no lab needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuctl.cli.app import app


@pytest.mark.parametrize("command", [["lab", "up"], ["lab", "down"], ["lab", "reboot", "gpu001"]])
def test_lab_needs_root(monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    res = CliRunner().invoke(app, command)
    assert res.exit_code == 2
    assert "the lab needs root" in res.stderr
    assert "Traceback" not in res.output


def test_lab_status_of_a_lab_that_is_not_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    monkeypatch.setenv("GPUCTL_LAB_DIR", str(tmp_path))
    res = CliRunner().invoke(app, ["lab", "status", "--json"])
    assert res.exit_code == 0
    assert '"nodes": []' in res.stdout


# --- faults against the node's simulated hardware (no lab needed: the node's files in a temp dir)


@pytest.fixture
def lab_node(monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]) -> Path:
    """gpu001 of profile hgx-h100-ndr (8 GPUs, mlx5_0..mlx5_7) and ctl01 (no GPUs), as the
    lab writes them; root, and the nodes' addresses, faked."""
    from gpuctl.lab import lab
    from gpuctl.lab.sim import profiles

    monkeypatch.setenv("GPUCTL_LAB_DIR", str(tmp_path))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(lab, "address_of", lambda name: "198.18.0.11")
    monkeypatch.setattr(lab, "run", lambda *a, **kw: pytest.fail("no kernel line expected"))
    hardware = Path(tmp_path) / "nodes" / "gpu001" / "root" / "etc" / "gpuctl-lab"
    hardware.mkdir(parents=True)
    (hardware / "hardware.json").write_text(profiles.profile_json("hgx-h100-ndr"))
    return Path(tmp_path) / "nodes"


@pytest.mark.parametrize(
    ("node", "fault", "message"),
    [
        (
            ["gpu001", "ecc", "9"],
            "ecc",
            "ecc: gpu001 has no GPU 9; its GPUs are 0-7 (8x NVIDIA H100 80GB HBM3, profile "
            "hgx-h100-ndr)",
        ),
        (
            ["gpu001", "ib_port_down", "mlx5_9"],
            "ib_port_down",
            "ib_port_down: gpu001 has no HCA mlx5_9; its HCAs are mlx5_0, mlx5_1, mlx5_2, "
            "mlx5_3, mlx5_4, mlx5_5, mlx5_6, mlx5_7",
        ),
        (
            ["ctl01", "gpu_lost", "3"],
            "gpu_lost",
            "gpu_lost: ctl01 has no simulated GPUs or HCAs (not a GPU node?)",
        ),
    ],
)
def test_a_fault_on_hardware_the_node_lacks_is_refused(
    lab_node: Path, node: list[str], fault: str, message: str
) -> None:
    """They used to succeed and change nothing, so the next validation passed."""
    res = CliRunner().invoke(app, ["lab", "fault", *node])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == f"error: {message}"
    assert "Traceback" not in res.output
    assert not (lab_node / node[0] / "root" / "var" / "lib" / "gpuctl-lab-sim").exists()


def test_a_fault_on_hardware_the_node_has_is_stored(lab_node: Path) -> None:
    res = CliRunner().invoke(app, ["lab", "fault", "gpu001", "ib_port_down", "mlx5_7"])
    assert res.exit_code == 0, res.output
    assert '"mlx5_7": "Down"' in res.stdout
