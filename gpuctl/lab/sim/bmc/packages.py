"""SIMULATION: the lab's firmware packages (lab-only; a real BMC takes PLDM ``.fwpkg`` files and
refuses these)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

GPU_COMPONENT: Final = "gpu-firmware"
BMC_COMPONENT: Final = "bmc-firmware"
PACKAGE_MAGIC: Final = "gpuctl-lab-firmware-package 1"
PACKAGE_NOTICE: Final = (
    "gpuctl lab SIMULATION firmware package: not a PLDM .fwpkg; only the lab's simulated BMCs "
    "(gpuctl/lab/sim/bmc/) accept it, a real BMC refuses it"
)
_PAYLOAD_BYTES = 64 << 10
_GPU_VERSION = re.compile(r"[0-9A-Fa-f]{2}(\.[0-9A-Fa-f]{2}){4}")
_BMC_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


# ------------------------------------------------------------------------------------------
# Lab firmware packages (lab-only; a real one is a PLDM .fwpkg)


class PackageError(ValueError):
    """Not a lab firmware package this BMC can take (the message says why)."""


@dataclass(frozen=True, slots=True)
class LabPackage:
    component: str  # gpu-firmware | bmc-firmware
    version: str
    gpu_model: str | None  # GPU packages: the gpu_models.yml key they are built for


def _payload(component: str, version: str) -> bytes:
    """Stand-in image bytes (deterministic; a real package carries the firmware here)."""
    out = bytearray()
    block = hashlib.sha256(f"{component}\x1f{version}".encode()).digest()
    while len(out) < _PAYLOAD_BYTES:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:_PAYLOAD_BYTES])


def check_version(component: str, version: str) -> str:
    """``version`` when it fits ``component`` (GPU: a VBIOS version such as 96.00.74.00.01)."""
    if component == GPU_COMPONENT:
        if not _GPU_VERSION.fullmatch(version):
            raise PackageError(
                f"GPU firmware version {version!r}: expected a VBIOS version such as 96.00.74.00.01"
            )
    elif component == BMC_COMPONENT:
        if not _BMC_VERSION.fullmatch(version):
            raise PackageError(
                f"BMC firmware version {version!r}: letters, digits and . _ + - only "
                "(up to 64), such as lab-bmc-2.7.1"
            )
    else:
        raise PackageError(f"unknown component {component!r}: {GPU_COMPONENT} or {BMC_COMPONENT}")
    return version


def package_bytes(component: str, version: str, gpu_model: str | None = None) -> bytes:
    """A lab firmware package: a text line ``gpuctl-lab-firmware-package 1``, a JSON header
    line (component, version, GPU model, payload size and SHA-256, a notice that it is lab-only),
    then the payload."""
    check_version(component, version)
    if component == GPU_COMPONENT and not gpu_model:
        raise PackageError("a GPU firmware package needs the GPU model it is built for")
    payload = _payload(component, version)
    header = {
        "notice": PACKAGE_NOTICE,
        "component": component,
        "version": version,
        "gpu_model": gpu_model if component == GPU_COMPONENT else None,
        "payload_bytes": len(payload),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
    }
    return f"{PACKAGE_MAGIC}\n{json.dumps(header, sort_keys=True)}\n".encode() + payload


def write_package(out: Path, component: str, version: str, gpu_model: str | None = None) -> None:
    data = package_bytes(component, version, gpu_model)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)


def read_package(data: bytes) -> LabPackage:
    """The package in ``data`` (raises PackageError)."""
    first, _, rest = data.partition(b"\n")
    if first.strip() != PACKAGE_MAGIC.encode():
        raise PackageError(
            "not a gpuctl lab firmware package (this simulated BMC takes only packages from "
            "`gpuctl lab firmware-image --component gpu-firmware|bmc-firmware`)"
        )
    line, _, payload = rest.partition(b"\n")
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise PackageError("damaged lab firmware package: unreadable header")
    component, version = header.get("component"), header.get("version")
    if not isinstance(component, str) or not isinstance(version, str):
        raise PackageError("damaged lab firmware package: no component or version")
    check_version(component, version)
    if header.get("payload_bytes") != len(payload) or (
        header.get("payload_sha256") != hashlib.sha256(payload).hexdigest()
    ):
        raise PackageError("damaged lab firmware package: the payload does not match its SHA-256")
    model = header.get("gpu_model")
    if component == GPU_COMPONENT and not isinstance(model, str):
        raise PackageError("damaged lab firmware package: a GPU package without its GPU model")
    return LabPackage(component, version, model if isinstance(model, str) else None)
