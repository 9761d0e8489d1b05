"""Rollout tool command lines and parsers, on real outputs (tests/fixtures/rollout, /ib)."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest
from helpers import ROOT

from gpuctl.rollout import tools
from gpuctl.rollout.backend import BackendError, Versions
from gpuctl.validation.capture import capture_output

ROLLOUT = ROOT / "tests" / "fixtures" / "rollout"
IB = ROOT / "tests" / "fixtures" / "ib"


def body(name: str, folder: Path = ROLLOUT) -> str:
    return capture_output(folder / name)


# ------------------------------------------------------------------------------------------
# command lines


def test_nic_command_lines() -> None:
    assert tools.nic_query_argv() == ["mlxfwmanager", "--query"]
    assert tools.nic_query_argv("0000:8e:00.0") == ["mlxfwmanager", "-d", "0000:8e:00.0", "--query"]
    assert tools.nic_update_argv("/srv/fw.bin") == ["mlxfwmanager", "-u", "-i", "/srv/fw.bin", "-y"]
    assert tools.nic_update_argv("/srv/fw.bin", "/dev/mst/mt4129_pciconf0") == [
        "mlxfwmanager",
        "-d",
        "/dev/mst/mt4129_pciconf0",
        "-u",
        "-i",
        "/srv/fw.bin",
        "-y",
    ]
    assert tools.nic_activate_argv("/dev/mst/mt4129_pciconf0") == [
        "mlxfwreset",
        "-d",
        "/dev/mst/mt4129_pciconf0",
        "--yes",
        "reset",
    ]
    assert tools.flint_query_argv("41:00.0", tool="mstflint") == [
        "mstflint",
        "-d",
        "41:00.0",
        "query",
    ]
    assert tools.flint_burn_argv("41:00.0", "fw.bin") == [
        "flint",
        "-d",
        "41:00.0",
        "-i",
        "fw.bin",
        "--yes",
        "burn",
    ]


def test_gpu_and_driver_command_lines() -> None:
    assert tools.nvfwupd_show_version_argv("/run/c.yaml") == [
        "nvfwupd",
        "-c",
        "/run/c.yaml",
        "show_version",
        "-j",
    ]
    assert tools.nvfwupd_show_version_argv("c", ["a.fwpkg"]) == [
        "nvfwupd",
        "-c",
        "c",
        "show_version",
        "-p",
        "a.fwpkg",
        "-j",
    ]
    assert tools.nvfwupd_update_argv("c", ["a.fwpkg", "b.fwpkg"]) == [
        "nvfwupd",
        "-c",
        "c",
        "update_fw",
        "-p",
        "a.fwpkg",
        "b.fwpkg",
        "-y",
    ]
    with pytest.raises(ValueError, match="at least one package"):
        tools.nvfwupd_update_argv("c", [])
    assert tools.driver_running_argv() == [
        "nvidia-smi",
        "--query-gpu=driver_version",
        "--format=csv,noheader",
    ]
    assert tools.driver_installed_argv(["nvidia-driver"], "deb") == [
        "dpkg-query",
        "-W",
        "-f=${Package}\\t${db:Status-Abbrev}\\t${Version}\\n",
        "nvidia-driver",
    ]
    assert tools.driver_installed_argv(["nvidia-driver"], "rpm") == [
        "rpm",
        "-q",
        "--queryformat",
        "%{NAME}\\t%{VERSION}\\t%{RELEASE}\\n",
        "nvidia-driver",
    ]


def test_nvfwupd_config_keeps_the_password_out_of_argv(tmp_path: Path) -> None:
    path = tmp_path / "nvfwupd.yaml"
    path.write_text("old", encoding="utf-8")
    password = "pa55-Word!"  # noqa: S105 - test value
    tools.write_nvfwupd_config(
        path,
        bmc_ip="10.0.0.9",
        username="admin",
        password=password,
        target_platform="HGX",
        packages=["nvfw_HGX.fwpkg"],
        update_targets=["/redfish/v1/UpdateService/FirmwareInventory/HGX_0"],
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config = json.loads(path.read_text(encoding="utf-8"))  # JSON is YAML: nvfwupd reads it
    assert config == {
        "TargetPlatform": "HGX",
        "FWUpdateFilePath": ["nvfw_HGX.fwpkg"],
        "BMC_IP": "10.0.0.9",
        "RF_USERNAME": "admin",
        "RF_PASSWORD": password,
        "SANITIZE_LOG": True,
        "UpdateParametersTargets": ["/redfish/v1/UpdateService/FirmwareInventory/HGX_0"],
    }
    argv = tools.nvfwupd_update_argv(str(path), ["nvfw_HGX.fwpkg"])
    assert not any(password in part for part in argv)


# ------------------------------------------------------------------------------------------
# nic-firmware


def test_mlxfwmanager_query_with_fw_running_row() -> None:
    (device,) = tools.parse_mlxfwmanager_query(
        body("mlxfwmanager-query-cx3pro-fw-running-pending-windows.txt")
    )
    assert device == tools.NicFirmware(
        device="mt4103_pci_cr0",
        psid="HP_1380110017",
        flashed="2.42.5700",
        running="2.42.5016",
        available="2.42.5700",
        status="Up to date",
    )
    assert device.pending == "2.42.5700"
    assert tools.nic_versions([device]) == Versions(running="2.42.5016", pending="2.42.5700")


def test_mlxup_query_without_running_row() -> None:
    (device,) = tools.parse_mlxfwmanager_query(body("mlxup-query-cx6lx-update-required.txt", IB))
    assert (device.device, device.psid, device.flashed, device.running, device.available) == (
        "0002:01:00.0",
        "MT_0000000575",
        "26.33.1048",
        "26.33.1048",
        "26.43.1014",
    )
    assert device.pending is None
    assert device.status == "Update required"


def test_mlxup_update_transcript() -> None:
    text = body("mlxup-update-cx7-2dev-burn-restart-needed.out")
    devices = tools.parse_mlxfwmanager_query(text)  # the query part printed before the burn
    assert [(d.device, d.flashed, d.available) for d in devices] == [
        ("/dev/mst/mt4129_pciconf1", "28.42.1000", "28.43.1014"),
        ("/dev/mst/mt4129_pciconf0", "28.42.1000", "28.43.1014"),
    ]
    assert tools.nic_versions(devices, "MT_0000001244") == Versions("28.42.1000", None)
    assert tools.parse_mlxfwmanager_update(text, 0) == tools.NicUpdate((1, 2), (), True)
    with pytest.raises(tools.ToolOutputError, match="exit status 254"):
        tools.parse_mlxfwmanager_update(text, 254)
    cut = text[: text.index("Done\nDevice #2")] + "Done\nDevice #2: Updating FW ...     \n"
    with pytest.raises(tools.ToolOutputError, match="device #2: update did not finish"):
        tools.parse_mlxfwmanager_update(cut, 0)
    failed = text.replace(
        "Writing Boot image component -   OK          \nDone\nDevice #2",
        "Fail : Burning FS4 image failed\nDevice #2",
    )
    with pytest.raises(tools.ToolOutputError, match="Fail : Burning FS4 image failed"):
        tools.parse_mlxfwmanager_update(failed, 0)
    no_restart = text.replace("Restart needed for updates to take effect.\n", "")
    with pytest.raises(tools.ToolOutputError, match="no 'Restart needed"):
        tools.parse_mlxfwmanager_update(no_restart, 0)


def test_mlxfwmanager_raw_progress_is_rendered() -> None:
    """What a pipe gets (no terminal): ``\\r`` progress and ``\\b`` before Done."""
    raw = (
        "Found 1 device(s) requiring firmware update...\n\n"
        "Device #1: Updating FW ...     \n"
        "\rFSMST_INITIALIZE -   0%\rFSMST_INITIALIZE -   OK          \n"
        "\rWriting Boot image component -  55%\rWriting Boot image component -   OK          \n"
        "\b\b\b\bDone\n\nRestart needed for updates to take effect.\n"
    )
    assert tools.parse_mlxfwmanager_update(raw, 0).burned == (1,)


def test_mlxfwmanager_refuses_unknown_layouts() -> None:
    with pytest.raises(tools.ToolOutputError, match="-E- No devices found"):
        tools.parse_mlxfwmanager_query(
            "Querying Mellanox devices firmware ...\n-E- No devices found or specified\n"
        )
    with pytest.raises(tools.ToolOutputError, match="no 'Device #N:' block"):
        tools.parse_mlxfwmanager_query("Querying Mellanox devices firmware ...\n\n")
    good = body("mlxfwmanager-query-cx3pro-fw-running-pending-windows.txt")
    for broken, message in (
        (good.replace("2.42.5016", "N/A"), "FW \\(Running\\): no version"),
        (good.replace("     FW             2.42.5700      2.42.5700\n", ""), "no FW version row"),
        (good.replace("  Status:           Up to date\n", ""), "no Status line"),
        (good.replace("  PSID:             HP_1380110017\n", ""), "no PCI Device Name or PSID"),
        (good.replace("----------", "=========="), "no underline"),
        ("garbage\n" + good, "unexpected line before the first device"),
        (good.replace("  Port1 GUID:", "Port1 GUID -"), "unrecognised line"),
    ):
        with pytest.raises(tools.ToolOutputError, match=message):
            tools.parse_mlxfwmanager_query(broken)


def test_flint_query_running_line() -> None:
    pending = tools.parse_flint_query(
        body("flint-query-full-cx3-fw-version-running-pending.txt"), "/dev/mst/mt4099_pci_cr0"
    )
    assert pending == tools.NicFirmware(
        device="/dev/mst/mt4099_pci_cr0",
        psid="MT_1170110023",
        flashed="2.42.5000",
        running="2.35.5100",
    )
    active = tools.parse_flint_query(
        body("flint-query-cx7-after-mlxfwreset-no-running-line.txt"), "/dev/mst/mt4129_pciconf0"
    )
    assert (active.psid, active.flashed, active.running, active.pending) == (
        "MT_0000001244",
        "28.43.1014",
        "28.43.1014",
        None,
    )
    cx6 = tools.parse_flint_query(body("flint-query-cx6lx-fs4-rom-info-secure-fw.txt", IB), "d")
    assert (cx6.flashed, cx6.running, cx6.psid) == ("26.33.1048", "26.33.1048", "MT_0000000575")
    with pytest.raises(tools.ToolOutputError, match="Cannot open Device"):
        tools.parse_flint_query(
            "-E- Cannot open Device: 41:00.0. No such file or directory.\n", "d"
        )
    with pytest.raises(tools.ToolOutputError, match="not flint query output"):
        tools.parse_flint_query("Image type:            FS4\n", "d")


def test_flint_burn_transcripts() -> None:
    assert tools.parse_flint_burn(body("flint-burn-cx3-fs2-nonfailsafe-prompt.out"), 0) == (
        tools.FlintBurn("2.35.5100", "2.42.5000")
    )
    assert tools.parse_flint_burn(body("flint-burn-cx3pro-fs2-windows.out"), 0) == (
        tools.FlintBurn("2.42.5016", "2.42.5700")
    )
    connectib = body("mstflint-burn-connectib-load-new-fw-hint.out")
    assert tools.parse_flint_burn(connectib, 0) == tools.FlintBurn("10.16.1020", "10.16.1200")
    with pytest.raises(tools.ToolOutputError, match="exit status 1"):
        tools.parse_flint_burn(connectib, 1)
    bad = connectib.replace(
        "Restoring signature                     - OK",
        "Restoring signature                     - FAILED",
    )
    with pytest.raises(tools.ToolOutputError, match="burn stage failed"):
        tools.parse_flint_burn(bad, 0)
    with pytest.raises(tools.ToolOutputError, match="-E- Burning FS4 image failed"):
        tools.parse_flint_burn(connectib + "-E- Burning FS4 image failed: bad image\n", 0)


def test_mlxfwreset_transcript() -> None:
    text = body("mlxfwreset-reset-y-cx7-level3-loaded.out")
    tools.parse_mlxfwreset(text, 0)
    with pytest.raises(tools.ToolOutputError, match="exit status 1"):
        tools.parse_mlxfwreset(text, 1)
    with pytest.raises(tools.ToolOutputError, match="FW was loaded successfully"):
        tools.parse_mlxfwreset(text.replace("-I- FW was loaded successfully.\n", ""), 0)


def test_nic_versions_fail_closed() -> None:
    a = tools.NicFirmware("a", "MT_1", "1.2.3", "1.2.3")
    b = tools.NicFirmware("b", "MT_1", "1.2.4", "1.2.3")
    c = tools.NicFirmware("c", "MT_2", "9.9.9", "9.9.9")
    assert tools.nic_versions([a, c], "MT_1") == Versions("1.2.3", None)
    with pytest.raises(tools.VersionsDisagree, match=re.escape("a=1.2.3, b=1.2.4")):
        tools.nic_versions([a, b])
    with pytest.raises(
        tools.ToolOutputError, match="no adapter with PSID MT_3 \\(found: MT_1, MT_2\\)"
    ):
        tools.nic_versions([a, c], "MT_3")
    assert issubclass(tools.ToolOutputError, BackendError)


# ------------------------------------------------------------------------------------------
# gpu-firmware


def test_nvfwupd_show_version_json() -> None:
    inventory = tools.parse_nvfwupd_show_version(
        body("nvfwupd-show-version-json-dgxh100-hgx-8gpu.out")
    )
    assert inventory.system_model == "DGXH100"
    assert inventory.packages == ("DGX_0003_241205.1.0_custom",)
    assert len(inventory.devices) == 76
    gpus = inventory.by_prefix("HGX_FW_GPU_")
    assert [g.ap_name for g in gpus] == [f"HGX_FW_GPU_SXM_{i}" for i in range(1, 9)]
    assert {(g.sys_version, g.pkg_version, g.up_to_date) for g in gpus} == {
        ("96.00.BC.00.01", None, False)
    }
    assert inventory.devices[-1] == tools.FirmwareDevice(
        "PSU_5", "0204.0201.0204", "0204.0201.0204", False
    )
    assert tools.gpu_firmware_versions(inventory) == Versions("96.00.BC.00.01", None)
    assert tools.gpu_firmware_versions(inventory, "HGX_FW_BMC_") == Versions("HGX-22.10-1-rc77")
    with pytest.raises(tools.ToolOutputError, match="no NOPE_\\* entry"):
        tools.gpu_firmware_versions(inventory, "NOPE_")


def test_nvfwupd_fail_closed() -> None:
    text = body("nvfwupd-show-version-json-dgxh100-hgx-8gpu.out")
    data = json.loads(text)
    for change, message in (
        ({"Connection Status": "Failed"}, "BMC connection: 'Failed'"),
        ({"Error Code": 1}, "error code 1"),
        ({"Firmware Devices": []}, "no 'Firmware Devices'"),
    ):
        with pytest.raises(tools.ToolOutputError, match=message):
            tools.parse_nvfwupd_show_version(json.dumps({**data, **change}))
    with pytest.raises(tools.ToolOutputError, match="printed no JSON"):
        tools.parse_nvfwupd_show_version("System Model: DGXH100\n")
    rows = data["Firmware Devices"]
    mixed = [
        dict(r, **{"Sys Version": "96.00.61.00.01"}) if r["AP Name"] == "HGX_FW_GPU_SXM_3" else r
        for r in rows
    ]
    inventory = tools.parse_nvfwupd_show_version(json.dumps({**data, "Firmware Devices": mixed}))
    with pytest.raises(tools.VersionsDisagree, match=re.escape("HGX_FW_GPU_SXM_3=96.00.61.00.01")):
        tools.gpu_firmware_versions(inventory)
    unknown = [
        dict(r, **{"Sys Version": "N/A"}) if r["AP Name"] == "HGX_FW_GPU_SXM_1" else r for r in rows
    ]
    inventory = tools.parse_nvfwupd_show_version(json.dumps({**data, "Firmware Devices": unknown}))
    with pytest.raises(tools.ToolOutputError, match="HGX_FW_GPU_SXM_1: no version"):
        tools.gpu_firmware_versions(inventory)


def test_nvfwupd_update_result() -> None:
    done = "Firmware update successful!\nOverall Time Taken: 0:10:58\n"
    tools.parse_nvfwupd_update(done, 0)
    with pytest.raises(tools.ToolOutputError, match="exit status 1"):
        tools.parse_nvfwupd_update(done, 1)
    with pytest.raises(tools.ToolOutputError, match="no 'Firmware update successful!'"):
        tools.parse_nvfwupd_update("FW update started, Task Id: HGX_9\n", 0)


# ------------------------------------------------------------------------------------------
# driver


def test_driver_running() -> None:
    text = body("nvsmi-query-gpu-driver-version-csv-noheader-2gpu.out")
    assert tools.parse_driver_running(text, 0) == "515.57"
    with pytest.raises(tools.VersionsDisagree, match=re.escape("GPU 1=550.54.15")):
        tools.parse_driver_running("515.57\n550.54.15\n", 0)
    with pytest.raises(tools.ToolOutputError, match="driver is not loaded"):
        tools.parse_driver_running("", 9)
    with pytest.raises(tools.ToolOutputError, match="no device reported a version"):
        tools.parse_driver_running("\n", 0)
    with pytest.raises(tools.ToolOutputError, match="no version"):
        tools.parse_driver_running("[N/A]\n", 0)


def test_driver_installed_dpkg_and_rpm() -> None:
    packages = ["nvidia-driver", "nvidia-smi"]
    deb = "nvidia-driver\tii \t570.172.08-1\nnvidia-smi\tii \t570.172.08-1\n"
    assert tools.parse_driver_installed(deb, 0, packages, "deb") == "570.172.08"
    ubuntu = "nvidia-driver-570-open\tii \t1:570.133.20-0ubuntu1\n"
    assert tools.parse_driver_installed(ubuntu, 0, ["nvidia-driver-570-open"], "deb") == (
        "570.133.20"
    )
    half = "nvidia-driver\tii \t575.57.08-1\nnvidia-smi\tii \t570.172.08-1\n"
    with pytest.raises(tools.VersionsDisagree, match=re.escape("nvidia-driver=575.57.08")):
        tools.parse_driver_installed(half, 0, packages, "deb")
    # held (gpuctl's nvidia_driver role holds them): "hi" is installed too
    held = "nvidia-driver\thi \t570.172.08-1\nnvidia-smi\thi \t570.172.08-1\n"
    assert tools.parse_driver_installed(held, 0, packages, "deb") == "570.172.08"
    for bad in ("rc ", "iU ", "hiR", "iiF"):
        broken = f"nvidia-driver\t{bad}\t570.172.08-1\nnvidia-smi\tii \t570.172.08-1\n"
        with pytest.raises(tools.ToolOutputError, match="nvidia-driver is not installed"):
            tools.parse_driver_installed(broken, 0, packages, "deb")
    removed = "nvidia-driver\trc \t570.172.08-1\nnvidia-smi\tii \t570.172.08-1\n"
    with pytest.raises(tools.ToolOutputError, match="nvidia-driver is not installed"):
        tools.parse_driver_installed(removed, 0, packages, "deb")
    with pytest.raises(tools.ToolOutputError, match="not installed: nvidia-smi"):
        tools.parse_driver_installed("nvidia-driver\tii \t570.172.08-1\n", 1, packages, "deb")
    rpm = "nvidia-driver\t570.172.08\t1.el9\n"
    assert tools.parse_driver_installed(rpm, 0, ["nvidia-driver"], "rpm") == "570.172.08"
    with pytest.raises(tools.ToolOutputError, match="is not installed"):
        tools.parse_driver_installed(
            "package nvidia-driver is not installed\n", 1, ["nvidia-driver"], "rpm"
        )
    assert tools.driver_versions("515.57", "570.172.08") == Versions("515.57", "570.172.08")
    assert tools.driver_versions("570.172.08", "570.172.08") == Versions("570.172.08", None)
