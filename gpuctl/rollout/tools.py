"""Per rollout component: the command lines gpuctl runs on a node (or against its BMC) to read
the current version and to apply an update, and pure parsers of what those commands print.

Every parser fails closed: output it cannot read with certainty raises :class:`ToolOutputError`
(a :class:`~gpuctl.rollout.backend.BackendError`, so the executor fails the node rather than
guess). A parser never invents a version; ``N/A`` or a missing line is an error, not a default.

Components and tools (each command line carries the documentation it was taken from):

* ``nic-firmware`` (ConnectX HCAs): NVIDIA MFT ``mlxfwmanager`` to read and to burn,
  ``mlxfwreset`` to load a burned image without a reboot, ``flint``/``mstflint`` as the per-device
  alternative. After a burn and before a reset, ``mlxfwmanager`` shows the burned image in the
  ``FW`` row and the firmware still running in an extra ``FW (Running)`` row (sorted among the
  ROM rows, not necessarily right after ``FW``); ``flint query`` shows ``FW Version`` (burned) and
  ``FW Version(Running):`` only when the two differ (mstflint ``flint/subcommands.cpp``).
* ``gpu-firmware`` (HGX baseboards): NVIDIA ``nvfwupd`` against the BMC (``show_version -j``,
  ``update_fw``), credentials passed in a YAML config file (``-c``), never on the command line.
* ``bmc-firmware``: Redfish, see :mod:`gpuctl.rollout.redfish` (no command line).
* ``driver``: ``nvidia-smi --query-gpu=driver_version`` for the loaded driver, ``dpkg-query`` or
  ``rpm -q`` for the installed packages. Installing is the Ansible role's job (nvidia_driver).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gpuctl.rollout.backend import BackendError, Versions
from gpuctl.validation.numbers import json_loads, to_int
from gpuctl.validation.parsers import firmware

# ------------------------------------------------------------------------------------------
# Errors


class ToolOutputError(BackendError):
    """A tool's output (or exit status) that gpuctl cannot read with certainty."""


class VersionsDisagree(ToolOutputError):
    """The devices of one component on one node report different versions."""


def _fail(tool: str, message: str) -> ToolOutputError:
    return ToolOutputError(f"{tool}: {message}")


# a firmware/driver version: digits and dots, letters allowed inside (96.00.BC.00.01, 2.42.5016,
# 00.04.0052.0000_n00, HGX-22.10-1-rc77); never N/A, never blank
_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._+~:-]*$")
_PLACEHOLDERS = frozenset({"", "N/A", "n/a", "NA", "-", "--", "None"})


def _version(tool: str, what: str, value: object) -> str:
    text = value.strip() if isinstance(value, str) else ""
    if text in _PLACEHOLDERS or not _VERSION.match(text):
        raise _fail(tool, f"{what}: no version ({value!r})")
    return text


def _device_number(tool: str, text: str) -> int:
    """``Device #N``'s N; a number no tool prints (5,000 digits) is an error, not a crash."""
    value = to_int(text)
    if value is None:
        raise _fail(tool, f"device number {text[:40]!r} is not a number")
    return value


def _render(line: str) -> str:
    """One output line as a terminal shows it: ``\r`` returns to the first column and ``\b``
    steps back one, later characters overwriting earlier ones (MFT tools draw progress that way:
    ``\rFSMST_INITIALIZE -  12%``, ``\b\b\b\bDone``)."""
    if "\r" not in line and "\b" not in line:
        return line
    cells: list[str] = []
    column = 0
    for char in line:
        if char == "\r":
            column = 0
        elif char == "\b":
            column = max(0, column - 1)
        else:
            if column < len(cells):
                cells[column] = char
            else:
                cells.append(char)
            column += 1
    return "".join(cells)


def _lines(text: str) -> list[str]:
    return [_render(line) for line in text.split("\n")]


def common_version(component: str, versions: Iterable[tuple[str, str]]) -> str:
    """The one version all ``(device, version)`` pairs share; raises when none or several."""
    pairs = list(versions)
    if not pairs:
        raise ToolOutputError(f"{component}: no device reported a version")
    distinct = sorted({v for _, v in pairs})
    if len(distinct) > 1:
        detail = ", ".join(f"{d}={v}" for d, v in pairs)
        raise VersionsDisagree(f"{component}: devices report different versions ({detail})")
    return distinct[0]


# ------------------------------------------------------------------------------------------
# nic-firmware: command lines

MLXFWMANAGER = "mlxfwmanager"
MLXFWRESET = "mlxfwreset"
FLINT = "flint"


def nic_query_argv(device: str | None = None) -> list[str]:
    """Read every ConnectX (or one, ``device`` = mst device or PCI address) firmware.

    ``mlxfwmanager [-d DEV] --query``: MFT documentation, "mlxfwmanager - Firmware Update and
    Query Tool", https://docs.nvidia.com/networking/display/mftv4310/mlxfwmanager+%E2%80%93+Firmware+Update+and+Query+Tool
    (``-d|--dev``: "Perform operation for specified mst device(s)"; ``--query``: "Query device(s)
    info").
    """
    return [MLXFWMANAGER, *(["-d", device] if device else []), "--query"]


def nic_update_argv(image: str, device: str | None = None) -> list[str]:
    """Burn ``image`` (a .bin or .mfa file on the node) unattended on every device whose PSID it
    matches, or on ``device`` only.

    ``mlxfwmanager [-d DEV] -u -i IMAGE -y``: same page as :func:`nic_query_argv` (``-u|--update``
    "Update firmware image(s) on the device(s)", ``-i|--image-file`` "Specified image file to
    use"; ``-y|--yes`` answers the "Perform FW update? [y/N]" prompt, which without it reads
    stdin and, finding none, performs nothing); ``--online`` is not used (nodes fetch nothing
    from the internet). Exit status 0 on success; 254 when some devices burned and others failed;
    255 when errors were met (mstflint ``mlxfwupdate/mlxfwmanager.cpp``).
    """
    return [MLXFWMANAGER, *(["-d", device] if device else []), "-u", "-i", image, "-y"]


def nic_activate_argv(device: str) -> list[str]:
    """Load the burned firmware on ``device`` without a reboot.

    ``mlxfwreset -d DEV --yes reset``: "mstfwreset - Loading Firmware on 5th Generation Devices
    Tool" (mstflint's build of MFT's mlxfwreset, same options),
    https://docs.nvidia.com/networking/display/msflintv4300/mstfwreset+%E2%80%93+Loading+Firmware+on+5th+Generation+Devices+Tool
    and its manual page https://manpages.ubuntu.com/manpages/noble/en/man1/mstfwreset.1.html
    (``-y|--yes`` "answer yes on prompt"; without ``--level`` the tool chooses the reset level and
    prints it: level 3 "Driver restart and PCI reset" in tests/fixtures/rollout/mlxfwreset-*).
    A reboot of the node loads it as well ("To load new FW run mlxfwreset or reboot machine",
    mstflint's burn output).
    """
    return [MLXFWRESET, "-d", device, "--yes", "reset"]


def flint_query_argv(device: str, tool: str = FLINT) -> list[str]:
    """``flint -d DEV query`` (``tool="mstflint"`` for the open-source build, same output).

    MFT documentation, "flint - Firmware Burning Tool",
    https://docs.nvidia.com/networking/display/mftv4230/flint+%E2%80%93+firmware+burning+tool
    """
    return [tool, "-d", device, "query"]


def flint_burn_argv(device: str, image: str, tool: str = FLINT) -> list[str]:
    """``flint -d DEV -i IMAGE --yes burn``: the per-device alternative to mlxfwmanager.

    Same page as :func:`flint_query_argv` (``-i|--image``, ``-y|--yes`` for the non-interactive
    mode, command ``burn``/``b``). ``--allow_psid_change`` is never passed: an image for another
    PSID must fail.
    """
    return [tool, "-d", device, "-i", image, "--yes", "burn"]


# ------------------------------------------------------------------------------------------
# nic-firmware: parsers


@dataclass(frozen=True, slots=True)
class NicFirmware:
    """One adapter's firmware. ``flashed``: the image on flash, loaded at the next reset;
    ``running``: the firmware running now (equal to ``flashed`` when no reset is pending)."""

    device: str
    psid: str
    flashed: str
    running: str
    available: str | None = None
    status: str | None = None

    @property
    def pending(self) -> str | None:
        """The burned version waiting for a reset, or None."""
        return self.flashed if self.flashed != self.running else None


def parse_mlxfwmanager_query(text: str) -> list[NicFirmware]:
    """The devices of ``mlxfwmanager --query`` (also ``mlxup --query`` and the query part that
    ``mlxfwmanager -u`` prints first), in their order.

    Read by :func:`gpuctl.validation.parsers.firmware.scan_mlxfwmanager` (layout: mstflint
    ``mlxfwupdate/mlxfwmanager.cpp`` ``printDeviceInfoQuery``; fixtures in tests/fixtures/ib and
    tests/fixtures/rollout); any line out of its place fails: a ``-E-`` line, a line before the
    first device, a device without its dashed underline, a line that is neither ``Label: value``
    nor an image row. Release-note lines after a status and what follows the ``---------``
    trailer are skipped.
    """
    tool = MLXFWMANAGER
    scan = firmware.scan_mlxfwmanager(_lines(text))
    for note in scan.notes:
        if note.kind == "error":
            raise _fail(tool, note.text)
        if note.kind == "bad-number":
            raise _fail(tool, f"device number {note.text[:40]!r} is not a number")
        if note.device is None:
            raise _fail(tool, f"unexpected line before the first device: {note.text[:120]!r}")
        where = f"device #{to_int(scan.devices[note.device - 1].number)}"
        if note.kind == "underline":
            raise _fail(tool, f"{where}: no underline ({note.text[:60]!r})")
        if note.kind == "duplicate":
            raise _fail(tool, f"{where}: {note.text!r} row twice")
        if note.kind in ("unknown", "noise", "layout"):
            raise _fail(tool, f"{where}: unrecognised line {note.text[:120]!r}")
    if not scan.devices:
        raise _fail(tool, "no 'Device #N:' block (no devices found, or not mlxfwmanager output)")
    return [_nic_device(tool, device) for device in scan.devices]


def _nic_device(tool: str, device: firmware.AdapterQuery) -> NicFirmware:
    where = f"device #{to_int(device.number)}"
    rows = device.versions or {}
    name = device.pci_device_name or ""
    psid = device.psid or ""
    if name in _PLACEHOLDERS or psid in _PLACEHOLDERS:
        raise _fail(tool, f"{where}: no PCI Device Name or PSID")
    if device.status is None:
        raise _fail(tool, f"{where}: no Status line (output cut short?)")
    if "FW" not in rows:
        raise _fail(tool, f"{where} ({name}): no FW version row")
    flashed = _version(tool, f"{name} FW", rows["FW"].current)
    running = flashed
    if "FW (Running)" in rows:
        running = _version(tool, f"{name} FW (Running)", rows["FW (Running)"].current)
    available = rows["FW"].available
    return NicFirmware(
        device=name,
        psid=psid,
        flashed=flashed,
        running=running,
        available=None if available is None or available in _PLACEHOLDERS else available,
        status=device.status or None,
    )


def parse_flint_query(text: str, device: str) -> NicFirmware:
    """``flint -d DEVICE query`` (or ``mstflint ... q``, ``query full``) of one adapter, read by
    :func:`gpuctl.validation.parsers.firmware.scan_flint_query`.

    ``FW Version:`` is the image on flash; ``FW Version(Running):`` appears only when the running
    firmware differs (mstflint ``flint/subcommands.cpp``: printed when ``running_fw_ver`` is set
    and differs from ``fw_ver``). flint does not print the device name, so the caller's
    ``device`` is kept. Only the lines gpuctl needs are read (the first of each); a ``-E-`` line
    is an error.
    """
    tool = FLINT
    scan = firmware.scan_flint_query(_lines(text))
    for note in scan.notes:
        if note.kind == "error":
            raise _fail(tool, f"{device}: {note.text}")
    fw_version, psid = scan.first("FW Version"), scan.first("PSID")
    if fw_version is None or psid is None:
        raise _fail(tool, f"{device}: no 'FW Version:' and 'PSID:' lines (not flint query output)")
    flashed = _version(tool, f"{device} FW Version", fw_version)
    running = flashed
    for key in ("FW Version(Running)", "FW Version (Running)"):
        value = scan.first(key)
        if value is not None:
            running = _version(tool, f"{device} {key}", value)
    if psid in _PLACEHOLDERS:
        raise _fail(tool, f"{device}: no PSID")
    return NicFirmware(device=device, psid=psid, flashed=flashed, running=running)


def nic_versions(devices: Sequence[NicFirmware], psid: str | None = None) -> Versions:
    """The node's ``nic-firmware`` versions: the adapters with ``psid`` (all when None) must agree
    on both the running and the burned version, else :class:`VersionsDisagree`."""
    chosen = [d for d in devices if psid is None or d.psid == psid]
    if not chosen:
        have = ", ".join(sorted({d.psid for d in devices})) or "none"
        raise ToolOutputError(f"nic-firmware: no adapter with PSID {psid} (found: {have})")
    running = common_version("nic-firmware running", ((d.device, d.running) for d in chosen))
    flashed = common_version("nic-firmware flashed", ((d.device, d.flashed) for d in chosen))
    return Versions(running=running, pending=flashed if flashed != running else None)


@dataclass(frozen=True, slots=True)
class NicUpdate:
    """What ``mlxfwmanager -u`` did: the device numbers it burned, and whether it reported that
    everything was already up to date (nothing to burn)."""

    burned: tuple[int, ...]
    up_to_date: tuple[int, ...]
    restart_needed: bool


_UPDATING = re.compile(r"^Device #(\d+): Updating FW \.\.\.")
_DEVICE_STATUS = re.compile(r"^Device #(\d+): (.+?)\s*$")
_STAGE_OK = re.compile(r"^.+ -\s+OK\s*$")


def parse_mlxfwmanager_update(text: str, returncode: int) -> NicUpdate:
    """The result of ``mlxfwmanager -u -i IMAGE -y`` (fixture
    tests/fixtures/rollout/mlxup-update-cx7-2dev-burn-restart-needed.out).

    Success needs exit status 0 and, for each ``Device #N: Updating FW ...``, its stage lines
    (``FSMST_INITIALIZE -   OK``) ending in ``Done``; a ``Fail : ...`` or ``-E-`` line, another
    per-device status than ``Up to date``, or a missing ``Restart needed`` after a burn raise.
    """
    tool = MLXFWMANAGER
    if returncode != 0:
        errors = [ln.strip() for ln in _lines(text) if ln.strip().startswith("-E-")]
        detail = f": {errors[0]}" if errors else ""
        raise _fail(tool, f"update failed with exit status {returncode}{detail}")
    burned: list[int] = []
    up_to_date: list[int] = []
    open_device: int | None = None
    restart = False
    all_up_to_date = False
    for raw in _lines(text):
        stripped = raw.strip()
        if not stripped:
            continue
        if stripped.startswith("-E-") or stripped.startswith("Fail"):
            raise _fail(tool, f"update failed: {stripped[:200]}")
        if stripped.endswith("No updates performed"):  # after the prompt on one line
            raise _fail(tool, "no update performed (the prompt was answered no)")
        if stripped == "Restart needed for updates to take effect.":
            restart = True
            continue
        if stripped == "All listed device(s) firmware images are up to date.":
            all_up_to_date = True
            continue
        updating = _UPDATING.match(stripped)
        if updating:
            if open_device is not None:
                raise _fail(tool, f"device #{open_device}: update did not finish")
            open_device = _device_number(tool, updating.group(1))
            continue
        if open_device is not None:
            if stripped == "Interrupted":
                raise _fail(tool, f"device #{open_device}: update interrupted")
            if stripped == "Done":
                burned.append(open_device)
                open_device = None
                continue
            if _STAGE_OK.match(stripped) or stripped.startswith(("-W-", "-I-", "Preparing")):
                continue
            raise _fail(tool, f"device #{open_device}: unexpected line {stripped[:120]!r}")
        status = _DEVICE_STATUS.match(stripped)
        if status and not stripped.endswith(":"):
            if status.group(2) == "Up to date":
                up_to_date.append(_device_number(tool, status.group(1)))
                continue
            raise _fail(tool, f"device #{status.group(1)}: {status.group(2)}")
    if open_device is not None:
        raise _fail(tool, f"device #{open_device}: update did not finish (output cut short?)")
    if burned and not restart:
        raise _fail(tool, "burned, but no 'Restart needed for updates to take effect.'")
    if not burned and not all_up_to_date and not up_to_date:
        raise _fail(tool, "neither a burn nor 'up to date' in the output")
    return NicUpdate(tuple(burned), tuple(up_to_date), restart)


@dataclass(frozen=True, slots=True)
class FlintBurn:
    previous: str  # "Current FW version on flash"
    new: str  # "New FW version"


def parse_flint_burn(text: str, returncode: int) -> FlintBurn:
    """The result of ``flint -d DEV -i IMAGE --yes burn`` (fixtures
    tests/fixtures/rollout/*flint-burn*.out): exit status 0, both version lines, every stage
    line ending in ``OK``, no ``-E-`` line."""
    tool = FLINT
    if returncode != 0:
        errors = [ln.strip() for ln in _lines(text) if ln.strip().startswith("-E-")]
        detail = f": {errors[0]}" if errors else ""
        raise _fail(tool, f"burn failed with exit status {returncode}{detail}")
    previous = new = None
    stages = 0
    for raw in _lines(text):
        stripped = raw.strip()
        if stripped.startswith("-E-"):
            raise _fail(tool, f"burn failed: {stripped[:200]}")
        match = re.match(r"^Current FW version on flash:\s+(\S+)$", stripped)
        if match:
            previous = match.group(1)
            continue
        match = re.match(r"^New FW version:\s+(\S+)$", stripped)
        if match:
            new = match.group(1)
            continue
        if re.match(r"^.+ -\s+(\S+)$", stripped) and not stripped.startswith("-"):
            if not stripped.rstrip().endswith("OK"):
                raise _fail(tool, f"burn stage failed: {stripped[:200]}")
            stages += 1
    if previous is None or new is None or stages == 0:
        raise _fail(tool, "no 'Current FW version on flash' / 'New FW version' / stage lines")
    return FlintBurn(_version(tool, "flash", previous), _version(tool, "new", new))


def parse_mlxfwreset(text: str, returncode: int) -> None:
    """``mlxfwreset -d DEV --yes reset`` succeeded: exit status 0 and ``-I- FW was loaded
    successfully.`` (fixture tests/fixtures/rollout/mlxfwreset-reset-y-cx7-level3-loaded.out)."""
    lines = [ln.strip() for ln in _lines(text)]
    errors = [ln for ln in lines if ln.startswith("-E-")]
    if returncode != 0 or errors:
        detail = f": {errors[0]}" if errors else ""
        raise _fail(MLXFWRESET, f"reset failed with exit status {returncode}{detail}")
    if "-I- FW was loaded successfully." not in lines:
        raise _fail(MLXFWRESET, "no '-I- FW was loaded successfully.' line")


# ------------------------------------------------------------------------------------------
# gpu-firmware (HGX baseboard): nvfwupd against the BMC

NVFWUPD = "nvfwupd"
# the AP names nvfwupd gives the HGX GPUs' firmware (NVIDIA/open-nvfwupd json-options.rst)
HGX_GPU_PREFIX = "HGX_FW_GPU_"


def nvfwupd_show_version_argv(config_path: str, packages: Sequence[str] = ()) -> list[str]:
    """``nvfwupd -c CONFIG show_version [-p PKG ...] -j``: the BMC's firmware inventory as JSON.

    NVIDIA DGX firmware update guides, "GPU Tray Sample Configuration" (``nvfwupd -c config.yaml
    show_version``), https://docs.nvidia.com/dgx/dgxb200-fw-update-guide/gpu-tray-sample-config.html,
    and "JSON Output Options for Automation" (``show_version ... -j``),
    https://docs.nvidia.com/multi-node-nvlink-systems/nvfupd-guide/appendix/json-options.html .
    The BMC address and credentials live in the config file (:func:`write_nvfwupd_config`), so
    they never appear in an argv (process lists, logs).
    """
    return [
        NVFWUPD,
        "-c",
        config_path,
        "show_version",
        *(["-p", *packages] if packages else []),
        "-j",
    ]


def nvfwupd_update_argv(config_path: str, packages: Sequence[str]) -> list[str]:
    """``nvfwupd -c CONFIG update_fw -p PKG ... -y``: push the packages and wait for the BMC's
    update task (``-y``: "Bypass firmware update confirmation prompt"; NVIDIA/open-nvfwupd
    ``cli_schema.yaml``). The update targets (``UpdateParametersTargets``, e.g. the whole GPU tray
    ``/redfish/v1/UpdateService/FirmwareInventory/HGX_0``) come from the config file.
    New GPU firmware becomes active only after an AC power cycle (model.RESTART_KIND)."""
    if not packages:
        raise ValueError("nvfwupd update_fw needs at least one package")
    return [NVFWUPD, "-c", config_path, "update_fw", "-p", *packages, "-y"]


def write_nvfwupd_config(
    path: str | os.PathLike[str],
    *,
    bmc_ip: str,
    username: str,
    password: str,
    target_platform: str,
    packages: Sequence[str],
    update_targets: Sequence[str] = (),
) -> None:
    """Write nvfwupd's YAML config (as JSON, which YAML reads) readable by its owner only.

    Keys from NVIDIA/open-nvfwupd ``nvfwupd/config.yaml`` (BMC_IP, RF_USERNAME, RF_PASSWORD,
    TargetPlatform, FWUpdateFilePath, UpdateParametersTargets); ``SANITIZE_LOG`` stays on so
    nvfwupd masks the credentials in its own logs. Nothing is returned: the password only goes
    to the file, created with mode 0600 (an existing file is replaced).
    """
    config: dict[str, Any] = {
        "TargetPlatform": target_platform,
        "FWUpdateFilePath": list(packages),
        "BMC_IP": bmc_ip,
        "RF_USERNAME": username,
        "RF_PASSWORD": password,
        "SANITIZE_LOG": True,
    }
    if update_targets:
        config["UpdateParametersTargets"] = list(update_targets)
    target = Path(path)
    target.unlink(missing_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2)
        handle.write("\n")


@dataclass(frozen=True, slots=True)
class FirmwareDevice:
    """One ``Firmware Devices`` entry of ``nvfwupd show_version -j``."""

    ap_name: str
    sys_version: str | None
    pkg_version: str | None
    up_to_date: bool | None


@dataclass(frozen=True, slots=True)
class NvfwupdInventory:
    system_model: str | None
    packages: tuple[str, ...]
    devices: tuple[FirmwareDevice, ...]

    def by_prefix(self, prefix: str) -> tuple[FirmwareDevice, ...]:
        return tuple(d for d in self.devices if d.ap_name.startswith(prefix))


def parse_nvfwupd_show_version(text: str) -> NvfwupdInventory:
    """``nvfwupd show_version -j`` (fixture
    tests/fixtures/rollout/nvfwupd-show-version-json-dgxh100-hgx-8gpu.out).

    Fails unless ``Connection Status`` is ``Successful`` and ``Error Code`` is 0. ``Sys Version``
    is what the BMC reports as installed; ``Up-To-Date`` is kept as printed and never used to
    decide a version (the real output shows PSU rows with equal versions and ``No``). The plain
    text table of show_version (without ``-j``) is not parsed.
    """
    tool = NVFWUPD
    try:
        # numbers no BMC prints (5,000 digits, NaN, 1e400) decode as None: that field unknown
        data = json_loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(
            tool, f"show_version -j printed no JSON ({exc.msg} at line {exc.lineno})"
        ) from None
    if not isinstance(data, dict):
        raise _fail(tool, "show_version -j: not a JSON object")
    if data.get("Connection Status") != "Successful":
        raise _fail(tool, f"BMC connection: {data.get('Connection Status')!r}")
    if data.get("Error Code") != 0:
        raise _fail(tool, f"show_version error code {data.get('Error Code')!r}")
    rows = data.get("Firmware Devices")
    if not isinstance(rows, list) or not rows:
        raise _fail(tool, "show_version -j: no 'Firmware Devices'")
    devices = []
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("AP Name"), str):
            raise _fail(tool, f"show_version -j: bad device entry {str(row)[:120]}")
        up = row.get("Up-To-Date")
        devices.append(
            FirmwareDevice(
                ap_name=row["AP Name"],
                sys_version=_json_text(row.get("Sys Version")),
                pkg_version=_json_text(row.get("Pkg Version")),
                up_to_date={"Yes": True, "No": False}.get(str(up)),
            )
        )
    packages = data.get("Packages") or []
    model = data.get("System Model")
    return NvfwupdInventory(
        system_model=model if isinstance(model, str) else None,
        packages=tuple(str(p) for p in packages) if isinstance(packages, list) else (),
        devices=tuple(devices),
    )


def _json_text(value: object) -> str | None:
    """A version cell of show_version -j as text; a placeholder, null, a refused number or a
    list/object (which no version is) is None."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    text = str(value)
    return None if text in _PLACEHOLDERS else text


def gpu_firmware_versions(inventory: NvfwupdInventory, prefix: str = HGX_GPU_PREFIX) -> Versions:
    """``gpu-firmware`` of an HGX baseboard: the one ``Sys Version`` all GPU entries
    (``HGX_FW_GPU_SXM_1`` ...) share. ``pending`` is None: ``show_version -j`` shows no staged
    version (``-s/--staged`` exists in nvfwupd, but no real output of it was found)."""
    gpus = inventory.by_prefix(prefix)
    if not gpus:
        raise ToolOutputError(f"gpu-firmware: no {prefix}* entry in nvfwupd show_version")
    pairs = [(g.ap_name, _version(NVFWUPD, g.ap_name, g.sys_version or "")) for g in gpus]
    return Versions(running=common_version("gpu-firmware", pairs), pending=None)


def parse_nvfwupd_update(text: str, returncode: int) -> None:
    """``nvfwupd update_fw ... -y`` succeeded: exit status 0 and ``Firmware update successful!``.

    Written against the documented end of the output (NVIDIA/open-nvfwupd
    ``firmware_update_guide/docs/appendix/output-formatting.rst``: "Firmware update successful!",
    "Overall Time Taken: ..."); no complete real transcript was found.
    """
    lines = [ln.strip() for ln in _lines(text)]
    if returncode != 0:
        raise _fail(NVFWUPD, f"update_fw failed with exit status {returncode}")
    if "Firmware update successful!" not in lines:
        raise _fail(NVFWUPD, "update_fw: no 'Firmware update successful!' line")


# ------------------------------------------------------------------------------------------
# driver

NVIDIA_SMI = "nvidia-smi"
# nvidia-smi exit statuses (nvidia-smi(1) "RETURN VALUE"): 6 no devices found, 9 driver not loaded
_SMI_STATUS = {
    6: "no GPU found",
    9: "the NVIDIA driver is not loaded",
    12: "the NVML shared library could not be found",
}


def driver_running_argv() -> list[str]:
    """``nvidia-smi --query-gpu=driver_version --format=csv,noheader``: one line per GPU with
    the loaded driver's version (nvidia-smi(1), "--query-gpu"; the nvidia_driver role reads the
    same, ``__nvidia_driver_smi_argv``)."""
    return [NVIDIA_SMI, "--query-gpu=driver_version", "--format=csv,noheader"]


def parse_driver_running(text: str, returncode: int) -> str:
    """The loaded driver's version; every GPU line must carry the same one (fixture
    tests/fixtures/rollout/nvsmi-query-gpu-driver-version-csv-noheader-2gpu.out)."""
    if returncode != 0:
        why = _SMI_STATUS.get(returncode, f"exit status {returncode}")
        raise _fail(NVIDIA_SMI, why)
    lines = [ln.strip() for ln in _lines(text) if ln.strip()]
    pairs = [(f"GPU {i}", _version(NVIDIA_SMI, f"GPU {i}", ln)) for i, ln in enumerate(lines)]
    return common_version("driver", pairs)


PackageFamily = Literal["deb", "rpm"]
_DPKG_FORMAT = "${Package}\\t${db:Status-Abbrev}\\t${Version}\\n"
_RPM_FORMAT = "%{NAME}\\t%{VERSION}\\t%{RELEASE}\\n"


def driver_installed_argv(packages: Sequence[str], family: PackageFamily) -> list[str]:
    """The installed version of the driver packages the nvidia_driver role pins (its
    ``__nvidia_driver_packages``, e.g. ``nvidia-driver`` on Debian/RHEL).

    deb: ``dpkg-query -W -f='${Package}\\t${db:Status-Abbrev}\\t${Version}\\n' PKG...``
    (dpkg-query(1): ``-W|--show``, ``-f|--showformat``, ``db:Status-Abbrev`` since dpkg 1.16.2).
    rpm: ``rpm -q --queryformat '%{NAME}\\t%{VERSION}\\t%{RELEASE}\\n' PKG...`` (rpm(8), "QUERY
    OPTIONS", ``--qf|--queryformat``). The output is in these formats by construction.
    """
    if not packages:
        raise ValueError("no driver package named")
    if family == "deb":
        return ["dpkg-query", "-W", f"-f={_DPKG_FORMAT}", *packages]
    return ["rpm", "-q", "--queryformat", _RPM_FORMAT, *packages]


def _debian_upstream(version: str) -> str:
    """``[epoch:]upstream[-revision]`` -> upstream (Debian Policy 5.6.12)."""
    text = version.split(":", 1)[1] if ":" in version else version
    return text.rsplit("-", 1)[0] if "-" in text else text


def parse_driver_installed(
    text: str, returncode: int, packages: Sequence[str], family: PackageFamily
) -> str:
    """The one upstream driver version every named package is installed at.

    Every package must be listed and installed (dpkg ``ii``; rpm: no "is not installed" line) and
    all must agree, else :class:`ToolOutputError`: a half-upgraded set is never read as either
    version. dpkg's revision (``-1``, ``-0ubuntu1``) and epoch are dropped; rpm's VERSION has none.
    """
    tool = "dpkg-query" if family == "deb" else "rpm"
    found: dict[str, list[str]] = {}
    for raw in _lines(text):
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        if "is not installed" in line or line.startswith("dpkg-query:"):
            raise _fail(tool, line.strip())
        cells = line.split("\t")
        if len(cells) != 3:
            raise _fail(tool, f"unexpected line {line[:120]!r}")
        if family == "deb":
            name, status, version = cells
            # want/status/error flags: installed is "i" then no error; "h" (held, as gpuctl's
            # roles hold the driver) or "i" wanted
            flags = status.ljust(3)
            if flags[0] not in "ih" or flags[1] != "i" or flags[2].strip():
                raise _fail(tool, f"{name} is not installed (status {status.strip() or 'none'!r})")
            found.setdefault(name, []).append(_debian_upstream(version))
        else:
            name, version, _release = cells
            found.setdefault(name, []).append(version)
    missing = [p for p in packages if p not in found]
    if returncode != 0 or missing:
        raise _fail(
            tool, f"not installed: {', '.join(missing) or 'exit status ' + str(returncode)}"
        )
    pairs = [(name, _version(tool, name, v)) for name in packages for v in found[name]]
    return common_version("driver installed", pairs)


def driver_versions(running: str, installed: str) -> Versions:
    """``driver``: the loaded version runs; an installed different one waits for a reboot."""
    return Versions(running=running, pending=installed if installed != running else None)
