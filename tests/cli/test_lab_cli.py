"""`gpuctl lab` refuses to run without root, with a clear message (no lab needed)."""

from __future__ import annotations

import os

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
