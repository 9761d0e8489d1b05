"""NVIDIA Firmware Tools (MFT) outputs for a simulated node: ``mlxfwmanager --query`` and
``flint -d DEV query``, and the update path ``mlxfwmanager [-d DEV] -u -i IMAGE -y``. Layouts
are copied from the real captures in tests/fixtures/ib (``mlxup-query-*``, ``flint-query-*``)
and tests/fixtures/rollout (``mlxup-update-*``, ``mlxfwmanager-query-*-fw-running-*``,
``flint-query-full-*-fw-version-running-*``); the messages of cases without a capture come from
mstflint's ``mlxfwupdate/mlxfwmanager.cpp`` (the same code base as MFT's mlxfwmanager).
Standard library only.

One device block per HCA of the profile (each ``mlx5_N`` is its own single-port card here).
Without a firmware image, Available is ``N/A`` and the status ``No matching image found``, as the
real tools print. Part numbers and descriptions are a typical card for the profile's adapter and
rate (illustrative, not read from any machine); no expansion ROM is simulated, so only the FW row
(and, with a burn pending, the ``FW (Running)`` row) is shown.

Firmware state across reboots. A burn records, per HCA, the running and the flashed version and
the node's boot id (``/proc/sys/kernel/random/boot_id``; systemd-nspawn gives every boot of a lab
node a new one) in ``<state dir>/mft.json``, the state dir being the one of faults.json
(/var/lib/gpuctl-lab-sim, on the node's disk). Every tool reads that file (``ibstat`` and
``ibv_devinfo`` too, through :func:`running_hcas`): while the boot id is the recorded one, the old
firmware runs and the burned one is pending (``FW (Running)`` row, ``FW Version(Running):`` line;
the verbs tools show the running one); once the boot id differs, the node has rebooted and the
flashed version runs. No boot hook is needed. An HCA without an entry runs the profile's
firmware. The ``firmware`` fault overrides both versions of the HCAs it names, burned or not, in
every tool, and is never written to the file. Test overrides: ``GPUCTL_SIM_STATE_DIR``,
``GPUCTL_SIM_BOOT_ID_FILE``.

Lab firmware images (lab-only; a real image is a binary .bin or .mfa): a text file

    gpuctl-lab-firmware-image 1
    PSID: MT_0000000838
    FW Version: 28.43.1014

naming the PSID it is built for and the version it carries (:func:`write_image` writes one).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .common import (
    Faults,
    Hca,
    Profile,
    hca_firmware_fault,
    hcas,
    read_state_file,
    write_state_file,
)

DEFAULT_STATE_DIR = "/var/lib/gpuctl-lab-sim"
STATE_FILE = "mft.json"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
IMAGE_MAGIC = "gpuctl-lab-firmware-image 1"

# mlxfwmanager exit statuses (mstflint mlxfwupdate/err_msgs.h)
ERR_QUERY_FAILED = 1
ERR_BAD_CMD_ARGS = 3
ERR_IMG_NOT_FOUND = 9
ERR_FILE_PARSE_FAILED = 17
ERR_ERRORS_ENCOUNTERED = 255
ERR_PARTIAL = 254

_DEVICE_TYPE = {  # ca_type (ibstat) -> "Device Type" mlxfwmanager prints
    "MT4115": "ConnectX4",
    "MT4117": "ConnectX4LX",
    "MT4119": "ConnectX5",
    "MT4121": "ConnectX5",
    "MT4123": "ConnectX6",
    "MT4125": "ConnectX6DX",
    "MT4127": "ConnectX6LX",
    "MT4129": "ConnectX7",
    "MT4131": "ConnectX8",
    "MT41686": "BlueField2",
    "MT41692": "BlueField3",
}

_CARDS = {  # (ca_type, rate) -> (part number, description): typical cards, illustrative
    ("MT4123", 200): (
        "MCX653105A-HDA_Ax",
        "ConnectX-6 VPI adapter card; HDR IB (200Gb/s) and 200GbE; single-port QSFP56; "
        "PCIe4.0 x16; tall bracket; ROHS R6",
    ),
    ("MT4125", 200): (
        "MCX623105AN-VDA_Ax",
        "ConnectX-6 Dx EN adapter card; 200GbE; Single-port QSFP56; PCIe 4.0 x16; No Crypto;",
    ),
    ("MT4125", 100): (
        "MCX623106AN-CDA_Ax",
        "ConnectX-6 Dx EN adapter card; 100GbE; Dual-port QSFP56; PCIe 4.0 x16; No Crypto;",
    ),
    ("MT4129", 400): (
        "MCX75310AAS-NEA_Ax",
        "NVIDIA ConnectX-7 HHHL Adapter card; 400GbE / NDR IB (default mode); Single-port OSFP; "
        "PCIe 5.0 x16; Crypto Disabled; Secure Boot Enabled;",
    ),
}


class MftError(Exception):
    """What the real tool would print, and its exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def device_type(ca_type: str) -> str:
    return _DEVICE_TYPE.get(ca_type, ca_type)


def mst_device(hca: Hca) -> str:
    """``/dev/mst/mt4129_pciconf0``: the name ``mst status`` gives the card of ``hca``."""
    return f"/dev/mst/{hca.ca_type.lower()}_pciconf{hca.index}"


def _guid(hca: Hca) -> str:
    return hca.node_guid.removeprefix("0x").rjust(16, "0")


def _mac(hca: Hca) -> str:
    guid = _guid(hca)  # OUI + 0300/fffe + 3 bytes: the MAC is the outer 6 bytes
    return guid[:6] + guid[10:]


# ------------------------------------------------------------------------------------------
# Firmware state (what runs, what is flashed) and lab images


@dataclass(frozen=True, slots=True)
class Firmware:
    running: str
    flashed: str

    @property
    def pending(self) -> bool:
        return self.running != self.flashed


@dataclass(frozen=True, slots=True)
class LabImage:
    psid: str
    version: str


def state_dir() -> str:
    """Where the firmware state lives: GPUCTL_SIM_STATE_DIR, else faults.json's directory."""
    explicit = os.environ.get("GPUCTL_SIM_STATE_DIR")
    if explicit:
        return explicit
    faults = os.environ.get("GPUCTL_SIM_FAULTS")
    return os.path.dirname(faults) if faults else DEFAULT_STATE_DIR


def boot_id() -> str:
    """This boot's id ("" when it cannot be read: then a burn never becomes active)."""
    path = os.environ.get("GPUCTL_SIM_BOOT_ID_FILE", BOOT_ID_PATH)
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _read_state(directory: str) -> dict[str, object]:
    try:
        return read_state_file(directory, STATE_FILE)
    except ValueError as exc:
        raise MftError(f"-E- gpuctl lab: unreadable firmware state {exc}\n", 1) from None


def firmware_state(
    profile: Profile, faults: Faults, node: str, directory: str | None = None
) -> dict[str, Firmware]:
    """Per HCA name, the firmware running now and the one on flash (see the module docstring):
    the ``firmware`` fault's version where it names the HCA, else the burned state."""
    burned = _burned_state(profile, node, directory)
    result = {}
    for name, fw in burned.items():
        fault = hca_firmware_fault(faults, name)
        result[name] = Firmware(fault, fault) if fault else fw
    return result


def running_hcas(profile: Profile, faults: Faults, node: str) -> list[Hca]:
    """:func:`~.common.hcas` with each HCA's ``firmware`` the version running now, as
    ``mlxfwmanager`` shows it (``FW (Running)``): what ``ibstat`` and ``ibv_devinfo`` print. An
    unreadable state file is mlxfwmanager's error to report; the verbs tools then show the
    profile's (or the fault's) version, as before any burn."""
    devices = hcas(profile, faults, node)
    try:
        states = firmware_state(profile, faults, node)
    except MftError:
        return devices
    return [replace(hca, firmware=states[hca.name].running) for hca in devices]


def _burned_state(profile: Profile, node: str, directory: str | None) -> dict[str, Firmware]:
    """Per HCA name, the firmware state the file records (the profile's where it has none),
    faults left out: what a burn starts from and saves."""
    data = _read_state(directory or state_dir())
    entries = data.get("hcas") if isinstance(data.get("hcas"), dict) else {}
    rebooted = data.get("boot_id") != boot_id()
    result = {}
    for hca in hcas(profile, {}, node):
        entry = entries.get(hca.name) if isinstance(entries, dict) else None
        if not isinstance(entry, dict) or not entry.get("flashed"):
            result[hca.name] = Firmware(hca.firmware, hca.firmware)
            continue
        flashed = str(entry["flashed"])
        running = flashed if rebooted else str(entry.get("running") or flashed)
        result[hca.name] = Firmware(running, flashed)
    return result


def save_firmware_state(states: dict[str, Firmware], directory: str | None = None) -> None:
    """Record ``states`` as of this boot (atomically: a reader never sees half a file)."""
    data = {
        "boot_id": boot_id(),
        "hcas": {
            name: {"running": fw.running, "flashed": fw.flashed} for name, fw in states.items()
        },
    }
    write_state_file(directory or state_dir(), STATE_FILE, data)


def write_image(path: str, psid: str, version: str) -> None:
    """Write a lab firmware image (text) for ``psid`` carrying ``version``."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f"{IMAGE_MAGIC}\nPSID: {psid}\nFW Version: {version}\n")


def read_image(path: str) -> LabImage:
    """A lab image; MftError with mlxfwmanager's messages when missing or not one."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(4096)
    except FileNotFoundError:
        raise MftError(f"-E- Can't find file {path}\n", ERR_BAD_CMD_ARGS) from None
    except (OSError, UnicodeDecodeError):
        raise MftError(f"-E- Error parsing file: {path}\n", ERR_FILE_PARSE_FAILED) from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    fields = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
    psid = fields.get("PSID", "").strip()
    version = fields.get("FW Version", "").strip()
    if lines[:1] != [IMAGE_MAGIC] or not psid or not re.fullmatch(r"\d+(\.\d+)+", version):
        raise MftError(f"-E- Error parsing file: {path}\n", ERR_FILE_PARSE_FAILED)
    return LabImage(psid, version)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


# ------------------------------------------------------------------------------------------
# mlxfwmanager and flint


def _psid(profile: Profile) -> str:
    return str(profile["nics"].get("board_id") or "N/A")


def _select(devices: list[Hca], names: Sequence[str] | None) -> list[Hca]:
    if names is None:
        return devices
    chosen = []
    for name in names:
        for hca in devices:
            if name in (mst_device(hca), hca.name):
                chosen.append(hca)
                break
        else:
            raise MftError(
                f"-E- Failed to query {name} device, error : No such file or directory\n",
                ERR_QUERY_FAILED,
            )
    return chosen


def _status(fw: Firmware, psid: str, image: LabImage | None) -> tuple[str, str]:
    """(Available column, Status) of one device against ``image``."""
    if image is None or image.psid != psid:
        return "N/A", "No matching image found"
    if _version_key(fw.flashed) < _version_key(image.version):
        return image.version, "Update required"
    return image.version, "Up to date"  # same or older: a downgrade needs --force


def _device_block(
    number: int, hca: Hca, psid: str, fw: Firmware, available: str, status: str
) -> list[str]:
    part, description = _CARDS.get((hca.ca_type, hca.max_rate), ("N/A", "N/A"))
    lines = [
        f"Device #{number}:",
        "----------",
        "",
        f"  Device Type:      {device_type(hca.ca_type)}",
        f"  Part Number:      {part}",
        f"  Description:      {description}",
        f"  PSID:             {psid}",
        f"  PCI Device Name:  {mst_device(hca)}",
        f"  Base GUID:        {_guid(hca)}",
        f"  Base MAC:         {_mac(hca)}",
        "  Versions:         Current        Available",
        f"     FW             {fw.flashed:<15}{available}",
    ]
    if fw.pending:  # sorted among the ROM rows by name in the real tool; the sim has no ROMs
        lines.append(f"     FW (Running)   {fw.running:<15}N/A")
    return [*lines, "", f"  Status:           {status}", ""]


def mlxfwmanager_query(
    profile: Profile,
    faults: Faults,
    node: str,
    *,
    image: LabImage | None = None,
    devices: Sequence[str] | None = None,
    states: dict[str, Firmware] | None = None,
) -> str:
    """``mlxfwmanager [-d DEV] --query [-i IMAGE]``: the device blocks (no trailer)."""
    found = hcas(profile, faults, node)
    if not found:
        raise MftError("-E- No devices found or specified, mst might be stopped.\n", 1)
    chosen = _select(found, devices)
    fw = states if states is not None else firmware_state(profile, faults, node)
    psid = _psid(profile)
    lines = ["Querying Mellanox devices firmware ...", ""]
    for number, hca in enumerate(chosen, 1):
        available, status = _status(fw[hca.name], psid, image)
        lines += _device_block(number, hca, psid, fw[hca.name], available, status)
    return "\n".join(lines)


def flint_query(
    profile: Profile,
    faults: Faults,
    node: str,
    device: str,
    *,
    states: dict[str, Firmware] | None = None,
) -> str:
    """``flint -d DEVICE query``; DEVICE is an mst device or an HCA name (``mlx5_0``). With a
    burn pending, ``FW Version`` is the flashed image and ``FW Version(Running)`` follows it."""
    for hca in hcas(profile, faults, node):
        if device in (mst_device(hca), hca.name):
            break
    else:
        raise MftError(
            f"-E- Cannot open Device: {device}. No such file or directory. MFE_CR_ERROR\n", 1
        )
    fw = (states if states is not None else firmware_state(profile, faults, node))[hca.name]
    running = f"FW Version(Running):   {fw.running}\n" if fw.pending else ""
    return (
        "Image type:            FS4\n"
        f"FW Version:            {fw.flashed}\n"
        f"{running}"
        f"Product Version:       {fw.flashed}\n"
        "Description:           UID                GuidsNumber\n"
        f"Base GUID:             {_guid(hca)}        4\n"
        f"Base MAC:              {_mac(hca)}            4\n"
        "Image VSD:             N/A\n"
        "Device VSD:            N/A\n"
        f"PSID:                  {_psid(profile)}\n"
        "Security Attributes:   N/A\n"
    )


@dataclass(frozen=True, slots=True)
class ToolRun:
    stdout: str
    stderr: str
    status: int


_USAGE = (
    "-E- gpuctl lab: simulated forms: 'mlxfwmanager [-d DEV] --query [-i IMAGE]' and "
    "'mlxfwmanager [-d DEV] -u -i IMAGE [-y]'\n"
)


def mlxfwmanager_main(profile: Profile, faults: Faults, node: str, args: Sequence[str]) -> ToolRun:
    """The simulated ``mlxfwmanager`` command line: query, or burn a lab image (see the module
    docstring). Returns what it prints and its exit status; a burn updates the firmware state."""
    query = update = yes = False
    image_path: str | None = None
    devices: list[str] | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--query", "-q"):
            query = True
        elif arg in ("-u", "--update"):
            update = True
        elif arg in ("-y", "--yes"):
            yes = True
        elif arg in ("-i", "--image-file", "-d", "--dev") and i + 1 < len(args):
            if arg in ("-i", "--image-file"):
                image_path = args[i + 1]
            else:
                devices = [d for d in args[i + 1].split(";") if d]
            i += 1
        else:
            return ToolRun("", _USAGE, ERR_BAD_CMD_ARGS)
        i += 1
    if update and (query or image_path is None):  # -u without an image looks online: not here
        return ToolRun("", _USAGE, ERR_BAD_CMD_ARGS)
    try:
        image = read_image(image_path) if image_path is not None else None
        states = firmware_state(profile, faults, node)
        text = mlxfwmanager_query(
            profile, faults, node, image=image, devices=devices, states=states
        )
    except MftError as exc:
        return ToolRun("", exc.message, exc.status)
    chosen = _select(hcas(profile, faults, node), devices)
    psid = _psid(profile)
    results = [(hca, _status(states[hca.name], psid, image)[1]) for hca in chosen]
    need = [hca for hca, status in results if status == "Update required"]
    no_image = [hca for hca, status in results if status == "No matching image found"]
    if query or image is None:
        return ToolRun(text, "", 0)
    burned = image.version
    out, err = [text, "\n"], []  # the real tool ends every block with a blank line
    if not update:  # a query with an image: the summary trailer (update_query_ == 0)
        status = 0
        if need:
            out.append(
                f"---------\nFound {len(need)} device(s) requiring firmware update. "
                "Please use -u flag to perform the update.\n"
            )
        elif not no_image:
            out.append("---------\nAll listed device(s) firmware images are up to date.\n")
        if no_image:
            err.append("" if need else "---------\n")
            err.append(
                f"-E- Could not find matching firmware images for {len(no_image)} device(s).\n"
            )
            status = ERR_IMG_NOT_FOUND
        return ToolRun("".join(out), "".join(err), status)
    status = ERR_IMG_NOT_FOUND if no_image else 0
    if need:
        out.append(f"---------\nFound {len(need)} device(s) requiring firmware update...\n")
    elif not no_image:
        out.append("---------\nAll listed device(s) firmware images are up to date.\n")
    out.append("\n")
    if not need:
        return ToolRun("".join(out), "", status)
    if not yes:  # the prompt reads stdin; a lab node's tool runs have none: the answer is no
        out.append("Perform FW update? [y/N]: No updates performed\n")
        return ToolRun("".join(out), "", status)
    saved = _burned_state(profile, node, None)  # what the file holds: no fault goes into it
    for number, (hca, result) in enumerate(results, 1):
        if hca not in need:
            label = "Error - no matching image found" if hca in no_image else result
            out.append(f"Device #{number}: {label}\n")
            continue
        out.append(f"Device #{number}: Updating FW ...     \n")
        out.append("FSMST_INITIALIZE -   OK          \n")
        out.append("Writing Boot image component -   OK          \n")
        out.append("Done\n")
        saved[hca.name] = Firmware(saved[hca.name].running, burned)
    save_firmware_state(saved)
    out.append("\nRestart needed for updates to take effect.\n")
    if no_image:
        err.append("-E- One or more errors were encountered.\n")
        status = ERR_PARTIAL
    return ToolRun("".join(out), "".join(err), status)
