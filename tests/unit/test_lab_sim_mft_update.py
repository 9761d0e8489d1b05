"""The lab's simulated firmware update: ``mlxfwmanager -u -i IMAGE -y`` burns a lab image, the
burned version is pending (``FW (Running)`` / ``FW Version(Running)``) until the node's boot id
changes, then it runs. Every output is read by gpuctl's rollout parsers (the ones that read real
nodes) and by the validation parsers."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuctl.lab.sim import mft, profiles
from gpuctl.rollout import tools
from gpuctl.rollout.backend import Versions
from gpuctl.validation.parsing import parse

NODE = "gpu-node-01"
PROFILE = "hgx-h100-ndr"
NEW = "28.99.1000"


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node's state directory and boot id file (written by the tests to 'reboot')."""
    monkeypatch.setenv("GPUCTL_SIM_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUCTL_SIM_BOOT_ID_FILE", str(tmp_path / "boot_id"))
    (tmp_path / "boot_id").write_text("1b0e5a3c-0000-4000-8000-000000000001\n", encoding="utf-8")
    return tmp_path


def _profile() -> dict[str, object]:
    return profiles.load(PROFILE)


def _reboot(node: Path) -> None:
    (node / "boot_id").write_text("1b0e5a3c-0000-4000-8000-000000000002\n", encoding="utf-8")


def _query(profile: dict[str, object], *args: str) -> list[tools.NicFirmware]:
    run = mft.mlxfwmanager_main(profile, {}, NODE, ["--query", *args])
    assert (run.status, run.stderr) == (0, "")
    result = parse("mlxfwmanager", run.stdout)
    assert result.recognised, result.problems
    assert result.problems == ()
    return tools.parse_mlxfwmanager_query(run.stdout)


def test_query_burn_pending_reboot_running(node: Path) -> None:
    profile = _profile()
    old = str(profile["firmware"]["hca"])  # type: ignore[index]
    psid = str(profile["nics"]["board_id"])  # type: ignore[index]
    count = len(profile["nics"]["ports"])  # type: ignore[index]
    image = node / "fw-lab.txt"
    mft.write_image(str(image), psid, NEW)

    before = _query(profile)
    assert [(d.flashed, d.running, d.pending) for d in before] == [(old, old, None)] * count
    assert tools.nic_versions(before, psid) == Versions(running=old, pending=None)

    run = mft.mlxfwmanager_main(profile, {}, NODE, tools.nic_update_argv(str(image))[1:])
    assert (run.status, run.stderr) == (0, "")
    update = tools.parse_mlxfwmanager_update(run.stdout, run.status)
    assert update == tools.NicUpdate(tuple(range(1, count + 1)), (), True)
    assert f"Found {count} device(s) requiring firmware update...\n\nDevice #1: Updating FW" in (
        run.stdout
    )
    assert run.stdout.endswith("Done\n\nRestart needed for updates to take effect.\n")

    pending = _query(profile)
    assert [(d.flashed, d.running, d.pending) for d in pending] == [(NEW, old, NEW)] * count
    assert tools.nic_versions(pending, psid) == Versions(running=old, pending=NEW)
    flint = mft.flint_query(profile, {}, NODE, "mlx5_0")
    assert f"FW Version:            {NEW}\nFW Version(Running):   {old}\n" in flint
    assert tools.parse_flint_query(flint, "mlx5_0").pending == NEW
    data = parse("flint-query", flint).data
    assert (data["fw_version"], data["fw_version_running"]) == (NEW, old)

    # a second mlxfwmanager -u before the reboot: the flashed image is already the target
    again = mft.mlxfwmanager_main(profile, {}, NODE, ["-u", "-i", str(image), "-y"])
    assert again.status == 0
    assert "All listed device(s) firmware images are up to date." in again.stdout
    assert tools.parse_mlxfwmanager_update(again.stdout, again.status).burned == ()

    _reboot(node)
    after = _query(profile)
    assert [(d.flashed, d.running, d.pending) for d in after] == [(NEW, NEW, None)] * count
    assert "FW Version(Running)" not in mft.flint_query(profile, {}, NODE, "mlx5_0")
    state = (node / "state" / mft.STATE_FILE).read_text(encoding="utf-8")
    assert "000000000001" in state  # the file still names the boot of the burn: nothing rewrote it


def test_burn_one_device_with_d(node: Path) -> None:
    profile = _profile()
    old = str(profile["firmware"]["hca"])  # type: ignore[index]
    psid = str(profile["nics"]["board_id"])  # type: ignore[index]
    image = node / "fw.txt"
    mft.write_image(str(image), psid, NEW)
    argv = tools.nic_update_argv(str(image), device="mlx5_1")
    run = mft.mlxfwmanager_main(profile, {}, NODE, argv[1:])
    assert tools.parse_mlxfwmanager_update(run.stdout, run.status).burned == (1,)
    devices = _query(profile)
    assert [d.pending for d in devices[:3]] == [None, NEW, None]
    with pytest.raises(tools.VersionsDisagree, match="different versions"):
        tools.nic_versions(devices, psid)
    one = _query(profile, "-d", "mlx5_1")
    assert len(one) == 1
    assert one[0].running == old
    assert one[0].flashed == NEW


def test_without_yes_nothing_is_burned(node: Path) -> None:
    profile = _profile()
    image = node / "fw.txt"
    mft.write_image(str(image), str(profile["nics"]["board_id"]), NEW)  # type: ignore[index]
    run = mft.mlxfwmanager_main(profile, {}, NODE, ["-u", "-i", str(image)])
    assert run.stdout.endswith("Perform FW update? [y/N]: No updates performed\n")
    with pytest.raises(tools.ToolOutputError, match="no update performed"):
        tools.parse_mlxfwmanager_update(run.stdout, run.status)
    assert all(d.pending is None for d in _query(profile))


def test_wrong_psid_and_bad_images(node: Path) -> None:
    profile = _profile()
    other = node / "other.txt"
    mft.write_image(str(other), "MT_0000009999", NEW)
    run = mft.mlxfwmanager_main(profile, {}, NODE, ["-u", "-i", str(other), "-y"])
    assert run.status == mft.ERR_IMG_NOT_FOUND
    assert "No matching image found" in run.stdout
    with pytest.raises(tools.ToolOutputError, match="exit status 9"):
        tools.parse_mlxfwmanager_update(run.stdout, run.status)
    query = mft.mlxfwmanager_main(profile, {}, NODE, ["-i", str(other)])
    assert query.status == mft.ERR_IMG_NOT_FOUND
    assert "-E- Could not find matching firmware images for" in query.stderr

    missing = mft.mlxfwmanager_main(profile, {}, NODE, ["-u", "-i", str(node / "nope"), "-y"])
    assert (missing.status, missing.stderr) == (3, f"-E- Can't find file {node / 'nope'}\n")
    junk = node / "junk.bin"
    junk.write_bytes(b"\x7fELF not a lab image")
    bad = mft.mlxfwmanager_main(profile, {}, NODE, ["-u", "-i", str(junk), "-y"])
    assert (bad.status, bad.stderr) == (17, f"-E- Error parsing file: {junk}\n")
    assert mft.mlxfwmanager_main(profile, {}, NODE, ["-u", "-y"]).status == 3
    assert mft.mlxfwmanager_main(profile, {}, NODE, ["--bogus"]).status == 3
    assert not (node / "state" / mft.STATE_FILE).exists()


def test_query_with_image_trailer(node: Path) -> None:
    profile = _profile()
    image = node / "fw.txt"
    mft.write_image(str(image), str(profile["nics"]["board_id"]), NEW)  # type: ignore[index]
    run = mft.mlxfwmanager_main(profile, {}, NODE, ["-i", str(image)])
    assert run.status == 0
    assert "  Status:           Update required\n\n---------\nFound " in run.stdout
    assert run.stdout.endswith("Please use -u flag to perform the update.\n")
    devices = tools.parse_mlxfwmanager_query(run.stdout)
    assert {d.available for d in devices} == {NEW}
    assert {d.status for d in devices} == {"Update required"}
