"""The HCA firmware version the lab's ``ibstat`` and ``ibv_devinfo`` print comes from the same
state as ``mlxfwmanager`` (gpuctl/lab/sim/mft.py): the profile's until a burn, the old one while
the burn is pending, the burned one once the node's boot id changed; the ``firmware`` fault
overrides all of them, in every tool, and never lands in the state file."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from gpuctl.lab.sim import ib, mft, profiles, standin
from gpuctl.rollout import tools
from gpuctl.validation.parsing import parse

NODE = "gpu-node-01"
PROFILE = "hgx-h100-ndr"
NEW = "28.99.1000"
FAULT = "28.39.1002"


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node's state directory and boot id file (written by the tests to 'reboot')."""
    monkeypatch.setenv("GPUCTL_SIM_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUCTL_SIM_BOOT_ID_FILE", str(tmp_path / "boot_id"))
    _boot(tmp_path, 1)
    return tmp_path


def _boot(node: Path, number: int) -> None:
    (node / "boot_id").write_text(f"1b0e5a3c-0000-4000-8000-{number:012d}\n", encoding="utf-8")


def _profile() -> dict[str, Any]:
    return profiles.load(PROFILE)


def _names(profile: dict[str, Any]) -> list[str]:
    return [port["name"] for port in profile["nics"]["ports"]]


def _burn(node: Path, profile: dict[str, Any], faults: dict[str, Any], *argv: str) -> None:
    image = node / "fw.txt"
    mft.write_image(str(image), str(profile["nics"]["board_id"]), NEW)
    run = mft.mlxfwmanager_main(profile, faults, NODE, [*argv, "-u", "-i", str(image), "-y"])
    assert run.status == 0, run.stderr
    assert tools.parse_mlxfwmanager_update(run.stdout, run.status).burned


def _verbs(profile: dict[str, Any], faults: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Per HCA, (ibstat's firmware version, ibv_devinfo's fw_ver), as gpuctl's parsers read them."""
    cas = parse("ibstat", ib.ibstat(profile, faults, NODE))
    devinfo = parse("ibv-devinfo", ib.ibv_devinfo(profile, faults, NODE, verbose=True))
    assert cas.recognised, cas.problems
    assert devinfo.recognised, devinfo.problems
    return {
        name: (ca["firmware_version"], devinfo.data["hcas"][name]["fw_ver"])
        for name, ca in cas.data["cas"].items()
    }


def _mlxfwmanager(profile: dict[str, Any], faults: dict[str, Any]) -> dict[str, str]:
    """Per HCA (in profile order), the running version mlxfwmanager --query shows."""
    run = mft.mlxfwmanager_main(profile, faults, NODE, ["--query"])
    assert run.status == 0, run.stderr
    devices = tools.parse_mlxfwmanager_query(run.stdout)
    return {name: d.running for name, d in zip(_names(profile), devices, strict=True)}


def test_the_verbs_tools_show_the_running_firmware_through_a_burn_and_a_reboot(
    node: Path,
) -> None:
    profile = _profile()
    old = str(profile["firmware"]["hca"])
    names = _names(profile)
    assert _verbs(profile, {}) == dict.fromkeys(names, (old, old))

    _burn(node, profile, {})
    # pending: the old image still runs, and that is what the HCA reports
    assert _verbs(profile, {}) == dict.fromkeys(names, (old, old))
    assert _mlxfwmanager(profile, {}) == dict.fromkeys(names, old)

    _boot(node, 2)
    assert _verbs(profile, {}) == dict.fromkeys(names, (NEW, NEW))
    assert _mlxfwmanager(profile, {}) == dict.fromkeys(names, NEW)
    # one CA asked for by name, and its port alone, agree
    assert f"Firmware version: {NEW}\n" in ib.ibstat(profile, {}, NODE, "mlx5_3")
    assert f"\tfw_ver:\t\t\t\t{NEW}\n" in ib.ibv_devinfo(profile, {}, NODE, "mlx5_3")


def test_a_burn_of_one_device_changes_only_that_device(node: Path) -> None:
    profile = _profile()
    old = str(profile["firmware"]["hca"])
    _burn(node, profile, {}, "-d", "mlx5_1")
    _boot(node, 2)
    verbs = _verbs(profile, {})
    assert verbs.pop("mlx5_1") == (NEW, NEW)
    assert set(verbs.values()) == {(old, old)}


def test_the_firmware_fault_wins_over_a_burned_version(node: Path) -> None:
    profile = _profile()
    names = _names(profile)
    _burn(node, profile, {})
    _boot(node, 2)
    every = {"firmware": {"hca": FAULT}}
    assert _verbs(profile, every) == dict.fromkeys(names, (FAULT, FAULT))
    assert _mlxfwmanager(profile, every) == dict.fromkeys(names, FAULT)
    # a per-device fault wins over the all-HCA one, on that device only
    one = {"firmware": {"hca": FAULT, "mlx5_2": "28.39.1003"}}
    assert _verbs(profile, one)["mlx5_2"] == ("28.39.1003", "28.39.1003")
    assert _verbs(profile, one)["mlx5_0"] == (FAULT, FAULT)
    # cleared: the burned version again
    assert _verbs(profile, {}) == dict.fromkeys(names, (NEW, NEW))


def test_a_burn_under_the_fault_never_saves_the_fault(node: Path) -> None:
    profile = _profile()
    old = str(profile["firmware"]["hca"])
    names = _names(profile)
    fault = {"firmware": {"hca": FAULT}}
    _burn(node, profile, fault)
    state = json.loads((node / "state" / mft.STATE_FILE).read_text(encoding="utf-8"))
    assert {e["running"] for e in state["hcas"].values()} == {old}
    assert {e["flashed"] for e in state["hcas"].values()} == {NEW}
    assert _verbs(profile, fault) == dict.fromkeys(names, (FAULT, FAULT))
    # the fault cleared before the reboot: the old image runs, the burned one is pending
    assert _verbs(profile, {}) == dict.fromkeys(names, (old, old))
    _boot(node, 2)
    assert _verbs(profile, {}) == dict.fromkeys(names, (NEW, NEW))


def test_an_unreadable_state_file_leaves_the_verbs_tools_working(node: Path) -> None:
    profile = _profile()
    old = str(profile["firmware"]["hca"])
    (node / "state").mkdir()
    (node / "state" / mft.STATE_FILE).write_text("{not json", encoding="utf-8")
    assert set(_verbs(profile, {}).values()) == {(old, old)}
    assert set(_verbs(profile, {"firmware": {"hca": FAULT}}).values()) == {(FAULT, FAULT)}
    run = mft.mlxfwmanager_main(profile, {}, NODE, ["--query"])
    assert run.status == 1
    assert "unreadable firmware state" in run.stderr


def test_the_node_launchers_read_the_state_beside_faults_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a lab node: no GPUCTL_SIM_STATE_DIR, the state lives beside faults.json, and the
    ibstat and mlxfwmanager launchers read the same file."""
    profile = _profile()
    (tmp_path / "hw.json").write_text(profiles.profile_json(PROFILE), encoding="utf-8")
    monkeypatch.delenv("GPUCTL_SIM_STATE_DIR", raising=False)
    monkeypatch.setenv("GPUCTL_SIM_PROFILE", str(tmp_path / "hw.json"))
    monkeypatch.setenv("GPUCTL_SIM_FAULTS", str(tmp_path / "faults.json"))
    monkeypatch.setenv("GPUCTL_SIM_NODE", NODE)
    monkeypatch.setenv("GPUCTL_SIM_BOOT_ID_FILE", str(tmp_path / "boot_id"))
    _boot(tmp_path, 1)
    image = tmp_path / "fw.txt"
    mft.write_image(str(image), str(profile["nics"]["board_id"]), NEW)
    out, err = io.StringIO(), io.StringIO()
    assert standin.main("mlxfwmanager", ["-u", "-i", str(image), "-y"], out, err) == 0
    assert (tmp_path / mft.STATE_FILE).is_file()
    _boot(tmp_path, 2)
    out = io.StringIO()
    assert standin.main("/usr/bin/ibstat", [], out, err) == 0
    cas = parse("ibstat", out.getvalue()).data["cas"]
    assert {ca["firmware_version"] for ca in cas.values()} == {NEW}
    out = io.StringIO()
    assert standin.main("ibv_devinfo", ["-d", "mlx5_0"], out, err) == 0
    assert f"\tfw_ver:\t\t\t\t{NEW}\n" in out.getvalue()
