"""NVIDIA Firmware Tools (MFT) outputs for a simulated node: ``mlxfwmanager --query`` and
``flint -d DEV query``. Layouts are copied from the real captures in tests/fixtures/ib
(``mlxup-query-*``, ``flint-query-*``). Standard library only.

One device block per HCA of the profile (each ``mlx5_N`` is its own single-port card here). The
FW version is the profile's (or the ``firmware`` fault's); no firmware image is given, so
Available is ``N/A`` and the status ``No matching image found``, as the real tools print. Part
numbers and descriptions are a typical card for the profile's adapter and rate (illustrative,
not read from any machine); no expansion ROM is simulated, so only the FW row is shown.
"""

from __future__ import annotations

from .common import Faults, Hca, Profile, hcas

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


def mlxfwmanager_query(profile: Profile, faults: Faults, node: str) -> str:
    devices = hcas(profile, faults, node)
    if not devices:
        raise MftError("-E- No devices found or specified, mst might be stopped.\n", 1)
    nics = profile["nics"]
    lines = ["Querying Mellanox devices firmware ...", ""]
    for hca in devices:
        part, description = _CARDS.get((hca.ca_type, hca.max_rate), ("N/A", "N/A"))
        lines += [
            f"Device #{hca.index + 1}:",
            "----------",
            "",
            f"  Device Type:      {device_type(hca.ca_type)}",
            f"  Part Number:      {part}",
            f"  Description:      {description}",
            f"  PSID:             {nics.get('board_id') or 'N/A'}",
            f"  PCI Device Name:  {mst_device(hca)}",
            f"  Base GUID:        {_guid(hca)}",
            f"  Base MAC:         {_mac(hca)}",
            "  Versions:         Current        Available",
            f"     FW             {hca.firmware:<15}N/A",
            "",
            "  Status:           No matching image found",
            "",
        ]
    return "\n".join(lines)


def flint_query(profile: Profile, faults: Faults, node: str, device: str) -> str:
    """``flint -d DEVICE query``; DEVICE is an mst device or an HCA name (``mlx5_0``)."""
    for hca in hcas(profile, faults, node):
        if device in (mst_device(hca), hca.name):
            break
    else:
        raise MftError(
            f"-E- Cannot open Device: {device}. No such file or directory. MFE_CR_ERROR\n", 1
        )
    psid = profile["nics"].get("board_id") or "N/A"
    return (
        "Image type:            FS4\n"
        f"FW Version:            {hca.firmware}\n"
        f"Product Version:       {hca.firmware}\n"
        "Description:           UID                GuidsNumber\n"
        f"Base GUID:             {_guid(hca)}        4\n"
        f"Base MAC:              {_mac(hca)}            4\n"
        "Image VSD:             N/A\n"
        "Device VSD:            N/A\n"
        f"PSID:                  {psid}\n"
        "Security Attributes:   N/A\n"
    )
