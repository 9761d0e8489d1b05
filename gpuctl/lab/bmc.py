"""SIMULATION: one Redfish BMC per lab GPU node, served over HTTPS on the lab host.

Nothing here talks to real hardware, and nothing outside gpuctl/lab may import it: it lets the
real Redfish client (gpuctl/rollout/redfish.py) and a real `gpuctl rollout` of
``gpu-firmware`` / ``bmc-firmware`` run against the lab.

Real: HTTPS with a certificate per BMC address (IP SANs) signed by the lab's own CA, HTTP Basic
authentication, the credentials in an Ansible Vault file, the Redfish resource shapes (DSP0266,
the DSP8010 schemas), multipart HTTP push updates, tasks and task monitors, resets.

Simulated: the firmware (lab-only packages, :func:`write_package`; a real BMC takes PLDM
``.fwpkg`` files and refuses these), the flash (a few seconds, ``GPUCTL_LAB_BMC_TASK_S``), a BMC
reset (its address refuses connections for ``GPUCTL_LAB_BMC_RESET_S`` seconds), and power: the
node is a systemd-nspawn container, powered off, on and reset through its supervisor's signals
(gpuctl/lab/supervisor.py).

Files (``<lab dir>/bmc``, kept by `gpuctl lab down` like the base image, so the CA a person
trusted and the credentials stay the same across labs; ``state/`` is removed by `down`):

- ``ca.pem`` (0644), ``ca.key`` (0600): the lab BMCs' CA (ECDSA P-256);
- ``server.pem`` (0644), ``server.key`` (0600): the BMCs' certificate, one IP SAN per BMC
  address, made again when the addresses change;
- ``credentials.vault.yml`` (0600): Ansible Vault (default vault id) encrypted YAML
  ``{username: gpuctl-lab, password: <random>}``; ``vault-password`` (0600): its vault password;
- ``state/<node>.json``: what belongs to the BMC: its running and staged BMC firmware and the
  staged GPU firmware per GPU (written atomically).

The GPU firmware that runs is the node's: ``var/lib/gpuctl-lab-sim/gpu-firmware.json`` in the
node's root, written when the GPUs lose power (``PowerCycle``, ``ForceOff``,
``GracefulShutdown``), and read by the node's nvidia-smi (gpuctl.lab.sim.common.gpu_vbios).

The server: ``python -m gpuctl.lab.bmc serve CONFIG`` (:func:`start`, run by `gpuctl lab up`
after the nodes), one ThreadingHTTPServer per BMC address on port 443, all in one process; pid
file and log ``<lab dir>/run/bmc.{pid,log}``. Only addresses in 198.18.0.0/15 (and 127.0.0.1,
for unit tests) are bound. The log has the request lines http.server writes, never a header.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import email.message
import email.parser
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final, Protocol

import yaml

from gpuctl.lab.system import LabError, lab_dir, run
from gpuctl.lab.system import run_dir as _run_dir

LOG = logging.getLogger("gpuctl.lab.bmc")

PORT: Final = 443
USERNAME: Final = "gpuctl-lab"
ALLOWED_NETWORK: Final = ipaddress.ip_network("198.18.0.0/15")
TEST_ADDRESS: Final = "127.0.0.1"
MAX_UPLOAD: Final = 64 << 20

SERVICE_ROOT: Final = "/redfish/v1"
SYSTEM_ID: Final = "System_0"
MANAGER_ID: Final = "BMC_0"
SYSTEM: Final = f"{SERVICE_ROOT}/Systems/{SYSTEM_ID}"
MANAGER: Final = f"{SERVICE_ROOT}/Managers/{MANAGER_ID}"
SYSTEM_RESET: Final = f"{SYSTEM}/Actions/ComputerSystem.Reset"
MANAGER_RESET: Final = f"{MANAGER}/Actions/Manager.Reset"
UPDATE_SERVICE: Final = f"{SERVICE_ROOT}/UpdateService"
INVENTORY: Final = f"{UPDATE_SERVICE}/FirmwareInventory"
MULTIPART_PUSH: Final = f"{UPDATE_SERVICE}/update-multipart"
TASK_SERVICE: Final = f"{SERVICE_ROOT}/TaskService"
TASKS: Final = f"{TASK_SERVICE}/Tasks"
TASK_MONITORS: Final = f"{TASK_SERVICE}/TaskMonitors"
GPU_INVENTORY_PREFIX: Final = "HGX_FW_GPU_SXM_"
BMC_INVENTORY_ID: Final = "BMC_Firmware"
SYSTEM_RESET_TYPES: Final = (
    "On",
    "ForceOff",
    "GracefulShutdown",
    "GracefulRestart",
    "ForceRestart",
    "PowerCycle",
)
MANAGER_RESET_TYPES: Final = ("GracefulRestart", "ForceRestart")
APPLY_TIMES: Final = ("Immediate", "OnReset")

GPU_COMPONENT: Final = "gpu-firmware"
BMC_COMPONENT: Final = "bmc-firmware"
PACKAGE_MAGIC: Final = "gpuctl-lab-firmware-package 1"
PACKAGE_NOTICE: Final = (
    "gpuctl lab SIMULATION firmware package: not a PLDM .fwpkg; only the lab's simulated BMCs "
    "(gpuctl/lab/bmc.py) accept it, a real BMC refuses it"
)
_PAYLOAD_BYTES = 64 << 10
_GPU_VERSION = re.compile(r"[0-9A-Fa-f]{2}(\.[0-9A-Fa-f]{2}){4}")
_BMC_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
_SERVER_MARKER = "gpuctl.lab.bmc"
_GPU_FIRMWARE_FILE = "var/lib/gpuctl-lab-sim/gpu-firmware.json"


# ------------------------------------------------------------------------------------------
# Paths


def bmc_dir() -> Path:
    return lab_dir() / "bmc"


def state_dir() -> Path:
    return bmc_dir() / "state"


def ca_file() -> Path:
    return bmc_dir() / "ca.pem"


def vault_file() -> Path:
    return bmc_dir() / "credentials.vault.yml"


def vault_password_file() -> Path:
    return bmc_dir() / "vault-password"


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory (created with
    ``mode``: a secret is never readable by others, not even for a moment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _seconds(name: str, default: float) -> float:
    try:
        return max(0.0, float(os.environ.get(name, "") or default))
    except ValueError:
        return default


# ------------------------------------------------------------------------------------------
# Credentials (Ansible Vault)


def _vault(password: bytes) -> Any:
    from ansible.parsing.vault import VaultLib, VaultSecret

    return VaultLib([("default", VaultSecret(password))])


def load_credentials(directory: Path | None = None) -> tuple[str, str]:
    """(user name, password) from the vault file (raises LabError; never shows a secret)."""
    d = directory or bmc_dir()
    try:
        password = (d / "vault-password").read_bytes().strip()
        data = (d / "credentials.vault.yml").read_bytes()
    except OSError as exc:
        raise LabError(f"lab BMC credentials: {exc.strerror or exc} (run gpuctl lab up)") from None
    failed = False
    plain = b""
    try:
        plain = _vault(password).decrypt(data)
    except Exception:  # AnsibleError, or anything the vault code raises on a damaged file
        failed = True
    doc: Any = None
    if not failed:
        with contextlib.suppress(yaml.YAMLError):
            doc = yaml.safe_load(plain)
    if not isinstance(doc, dict) or not all(
        isinstance(doc.get(k), str) and doc[k] for k in ("username", "password")
    ):
        raise LabError(f"lab BMC credentials: {d / 'credentials.vault.yml'} cannot be read")
    return str(doc["username"]), str(doc["password"])


def ensure_credentials(directory: Path | None = None) -> bool:
    """The vault file with the lab BMCs' user and a random password, and its vault password
    (both 0600); made once and reused (True when made now)."""
    d = directory or bmc_dir()
    d.mkdir(parents=True, exist_ok=True)
    try:
        load_credentials(d)
    except LabError:
        pass
    else:
        for name in ("vault-password", "credentials.vault.yml"):
            os.chmod(d / name, 0o600)
        return False
    vault_password = secrets.token_urlsafe(32)
    plain = yaml.safe_dump(
        {"username": USERNAME, "password": secrets.token_urlsafe(24)}, sort_keys=False
    ).encode()
    encrypted = _vault(vault_password.encode()).encrypt(plain)
    _write_atomic(d / "vault-password", f"{vault_password}\n".encode(), 0o600)
    _write_atomic(d / "credentials.vault.yml", bytes(encrypted), 0o600)
    return True


# ------------------------------------------------------------------------------------------
# TLS: the lab's CA and the BMCs' certificate


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _ensure_ca(d: Path) -> tuple[Any, Any]:
    """(CA certificate, CA key), loaded or made."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_path, key_path = d / "ca.pem", d / "ca.key"
    with contextlib.suppress(OSError, ValueError, TypeError):
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if (
            isinstance(key, ec.EllipticCurvePrivateKey)
            and cert.public_key() == key.public_key()
            and cert.not_valid_after_utc > _now() + dt.timedelta(days=30)
        ):
            os.chmod(key_path, 0o600)
            os.chmod(cert_path, 0o644)
            return cert, key
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpuctl lab (SIMULATION)"),
            x509.NameAttribute(NameOID.COMMON_NAME, "gpuctl lab BMC CA"),
        ]
    )
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_atomic(
        key_path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        0o600,
    )
    _write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    (d / "server.pem").unlink(missing_ok=True)  # signed by the old CA: made again
    return cert, key


def _server_ok(d: Path, ca: Any, addresses: set[str]) -> bool:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        cert = x509.load_pem_x509_certificate((d / "server.pem").read_bytes())
        key = serialization.load_pem_private_key((d / "server.key").read_bytes(), password=None)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        cert.verify_directly_issued_by(ca)
    except Exception:  # unreadable, another CA's, damaged: made again
        return False
    have = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    return (
        have == addresses
        and cert.public_key() == key.public_key()
        and cert.not_valid_after_utc > _now() + dt.timedelta(days=30)
    )


def ensure_tls(addresses: Sequence[str], directory: Path | None = None) -> bool:
    """The CA (``ca.pem`` 0644, ``ca.key`` 0600) and a server certificate for ``addresses``
    (one IP SAN each; ``server.pem``, ``server.key`` 0600), made when missing, expiring, or
    for other addresses. True when the server certificate was made now."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not addresses:
        raise LabError("lab BMCs: no BMC address")
    ips = [ipaddress.ip_address(a) for a in addresses]
    d = directory or bmc_dir()
    d.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ensure_ca(d)
    if _server_ok(d, ca, {str(ip) for ip in ips}):
        return False
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpuctl lab (SIMULATION)"),
                    x509.NameAttribute(NameOID.COMMON_NAME, "gpuctl lab BMC"),
                ]
            )
        )
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=825))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ip) for ip in ips]), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_atomic(
        d / "server.key",
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        0o600,
    )
    _write_atomic(d / "server.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return True


def server_context(directory: Path | None = None) -> ssl.SSLContext:
    d = directory or bmc_dir()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(d / "server.pem"), str(d / "server.key"))
    return context


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


# ------------------------------------------------------------------------------------------
# Multipart form data (DSP0266 "Multipart HTTP push updates")


class BadRequest(Exception):
    def __init__(self, message_id: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message_id = message_id
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    filename: str | None
    content_type: str
    data: bytes


def parse_multipart(body: bytes, content_type: str) -> dict[str, Part]:
    """The parts of a ``multipart/form-data`` body by name (RFC 7578; raises BadRequest)."""
    header = email.message.Message()
    header["Content-Type"] = content_type
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str):
        raise BadRequest(
            "Base.1.18.UnrecognizedRequestBody",
            "expected Content-Type multipart/form-data with a boundary",
            415,
        )
    if not 1 <= len(boundary) <= 200:
        raise BadRequest("Base.1.18.UnrecognizedRequestBody", "bad multipart boundary")
    delim = b"--" + boundary.encode("latin-1")
    if body.startswith(delim):
        pos = len(delim)
    else:
        first = body.find(b"\r\n" + delim)
        if first < 0:
            raise BadRequest("Base.1.18.UnrecognizedRequestBody", "no multipart boundary found")
        pos = first + 2 + len(delim)
    parts: dict[str, Part] = {}
    while True:
        if body[pos : pos + 2] == b"--":
            return parts
        eol = body.find(b"\r\n", pos)
        if eol < 0 or body[pos:eol].strip(b" \t"):
            raise BadRequest("Base.1.18.UnrecognizedRequestBody", "malformed multipart body")
        start = eol + 2
        if body.startswith(b"\r\n", start):
            head, content_start = b"", start + 2
        else:
            end = body.find(b"\r\n\r\n", start)
            if end < 0:
                raise BadRequest("Base.1.18.UnrecognizedRequestBody", "malformed part headers")
            head, content_start = body[start:end], end + 4
        after = body.find(b"\r\n" + delim, content_start)
        if after < 0:
            raise BadRequest("Base.1.18.UnrecognizedRequestBody", "unterminated multipart body")
        message = email.parser.HeaderParser().parsestr(head.decode("latin-1"))
        name = message.get_param("name", header="content-disposition")
        if isinstance(name, str) and name not in parts:
            filename = message.get_param("filename", header="content-disposition")
            parts[name] = Part(
                name,
                filename if isinstance(filename, str) else None,
                message.get_content_type(),
                body[content_start:after],
            )
        pos = after + 2 + len(delim)


# ------------------------------------------------------------------------------------------
# Power: the node's supervisor is its power switch


class PowerControl(Protocol):
    """A node's power as its BMC sees it (the lab: :class:`SupervisorPower`; tests: a fake)."""

    def is_on(self) -> bool: ...
    def force_off(self) -> None: ...
    def graceful_off(self) -> None: ...
    def restart(self, graceful: bool) -> None: ...
    def power_on(self) -> None: ...
    def wait_off(self, timeout: float) -> bool: ...


def _live_pid(pidfile: Path, marker: bytes) -> int | None:
    try:
        pid = int(pidfile.read_text(encoding="utf-8").strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[-1].split()
    except (OSError, ValueError):
        return None
    if stat[0] == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # a supervisor this process started, now ended
        return None
    return pid if marker in cmdline else None


class SupervisorPower:
    """SIMULATION: the lab node's power, through its supervisor (gpuctl/lab/supervisor.py):
    on = the supervisor runs; off = SIGUSR2 (at once) or SIGTERM (clean shutdown), after which
    the supervisor ends; restart = SIGUSR1 (reset) or SIGHUP (clean reboot); on again = a new
    supervisor (gpuctl.lab.lab.start_node), unless the node's ``no_reboot`` fault keeps it
    down."""

    def __init__(self, node: str, root: Path, run_dir: Path) -> None:
        self.node = node
        self.root = root
        self.pidfile = run_dir / f"{node}.pid"

    def _pid(self) -> int | None:
        return _live_pid(self.pidfile, b"gpuctl.lab.supervisor")

    def _signal(self, signum: int) -> None:
        pid = self._pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def is_on(self) -> bool:
        return self._pid() is not None

    def force_off(self) -> None:
        self._signal(signal.SIGUSR2)

    def graceful_off(self) -> None:
        self._signal(signal.SIGTERM)

    def restart(self, graceful: bool) -> None:
        self._signal(signal.SIGHUP if graceful else signal.SIGUSR1)

    def power_on(self) -> None:
        from gpuctl.lab.supervisor import _stays_down

        if self.is_on():
            return
        if _stays_down(str(self.root)):
            LOG.info("%s: stays down (fault no_reboot)", self.node)
            return
        from gpuctl.lab import lab

        lab.start_node(self.node)

    def wait_off(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.is_on():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True


# ------------------------------------------------------------------------------------------
# One node's BMC


@dataclass(frozen=True, slots=True)
class BmcSpec:
    node: str
    address: str
    root: Path  # the node's root (its disk: hardware.json, faults.json, gpu-firmware.json)


@dataclass(frozen=True, slots=True)
class Timing:
    """How long the simulation takes (seconds)."""

    task_s: float = 3.0  # a firmware update task (GPUCTL_LAB_BMC_TASK_S)
    reset_s: float = 5.0  # a BMC reset: its address refuses connections (GPUCTL_LAB_BMC_RESET_S)
    reset_delay_s: float = 2.0  # a finished BMC update until the BMC resets itself, so that a
    # client polling its task sees Completed first (GPUCTL_LAB_BMC_RESET_DELAY_S)
    power_off_timeout_s: float = 90.0  # longest wait for a node to power off

    @classmethod
    def from_env(cls) -> Timing:
        return cls(
            task_s=_seconds("GPUCTL_LAB_BMC_TASK_S", 3.0),
            reset_s=_seconds("GPUCTL_LAB_BMC_RESET_S", 5.0),
            reset_delay_s=_seconds("GPUCTL_LAB_BMC_RESET_DELAY_S", 2.0),
        )


@dataclass
class Task:
    id: str
    component: str
    filename: str
    version: str
    targets: tuple[str, ...]
    started: float  # time.monotonic()
    start_time: str
    duration: float
    failure: tuple[str, str] | None  # (MessageId, Message) known at upload
    state: str = "Running"
    status: str = "OK"
    end_time: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)


def _iso() -> str:
    return _now().isoformat(timespec="seconds").replace("+00:00", "Z")


def _message(message_id: str, message: str, severity: str, *args: str) -> dict[str, Any]:
    return {
        "@odata.type": "#Message.v1_1_2.Message",
        "MessageId": message_id,
        "Message": message,
        "MessageArgs": list(args),
        "MessageSeverity": severity,
        "Severity": severity,
    }


def _link(uri: str) -> dict[str, str]:
    return {"@odata.id": uri}


def _collection(uri: str, odata_type: str, name: str, members: list[str]) -> dict[str, Any]:
    return {
        "@odata.type": f"#{odata_type}.{odata_type}",
        "@odata.id": uri,
        "Name": name,
        "Members@odata.count": len(members),
        "Members": [_link(m) for m in members],
    }


class Listener(Protocol):
    def stop(self) -> None: ...
    def start(self) -> None: ...


class LabBmc:
    """SIMULATION: the BMC of one lab node: its Redfish resources, its firmware state, its
    update tasks and its power actions."""

    def __init__(
        self,
        spec: BmcSpec,
        power: PowerControl,
        state_directory: Path,
        timing: Timing,
    ) -> None:
        self.spec = spec
        self.power = power
        self.state_file = state_directory / f"{spec.node}.json"
        self.timing = timing
        self.listener: Listener | None = None
        self._lock = threading.RLock()
        self._power_lock = threading.Lock()
        self._tasks: dict[str, Task] = {}
        self._next_task = 1
        self._uuid = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{spec.node}.bmc.gpuctl-lab"))

    # -- the node's disk and the BMC's state --------------------------------------------------

    def profile(self) -> dict[str, Any]:
        path = self.spec.root / "etc" / "gpuctl-lab" / "hardware.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise BadRequest(
                "Base.1.18.ServiceTemporarilyUnavailable",
                f"{self.spec.node}: the node's hardware description is not readable",
                503,
            ) from None
        if not isinstance(data, dict):
            raise BadRequest("Base.1.18.InternalError", "hardware description is not a mapping")
        return data

    def faults(self) -> dict[str, Any]:
        path = self.spec.root / "var" / "lib" / "gpuctl-lab-sim" / "faults.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def state(self) -> dict[str, Any]:
        with self._lock:
            try:
                data = json.loads(self.state_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = None
            if not isinstance(data, dict):
                firmware = self.profile().get("firmware") or {}
                data = {
                    "node": self.spec.node,
                    "bmc_firmware": {
                        "running": str(firmware.get("bmc") or "lab-bmc-1.0.0"),
                        "staged": None,
                    },
                    "gpu_firmware_staged": {},
                }
                self._save(data)
            return data

    def _save(self, data: dict[str, Any]) -> None:
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        _write_atomic(self.state_file, text.encode(), 0o644)

    def gpu_slots(self) -> list[tuple[int, int]]:
        """(SXM slot, GPU index in the profile), by slot: the slot is the GPU's module id when
        the module ids number the GPUs 1..n (HGX), else the index + 1."""
        gpus = self.profile()["gpus"]
        count = int(gpus["count"])
        modules = [int(m) for m in gpus.get("module_ids") or []]
        numbered = list(range(1, count + 1))
        slots = modules if sorted(modules) == numbered else numbered
        return sorted(zip(slots, range(count), strict=True))

    def running_gpu_firmware(self) -> dict[int, str]:
        """GPU index -> the VBIOS version it runs (what the node's nvidia-smi shows)."""
        from gpuctl.lab.sim.common import all_gpus, gpu_vbios

        profile, faults = self.profile(), self.faults()
        directory = str(self.spec.root / "var" / "lib" / "gpuctl-lab-sim")
        return {
            gpu.physical: gpu_vbios(profile, faults, gpu, state_dir=directory)
            for gpu in all_gpus(profile, self.spec.node)
        }

    def _inventory_ids(self) -> dict[str, int | None]:
        """FirmwareInventory Id -> GPU index (None: the BMC's own firmware)."""
        ids: dict[str, int | None] = {
            f"{GPU_INVENTORY_PREFIX}{slot}": index for slot, index in self.gpu_slots()
        }
        ids[BMC_INVENTORY_ID] = None
        return ids

    def activate_gpu_firmware(self) -> None:
        """The GPUs lost power: the staged GPU firmware runs from now on (gpu-firmware.json in
        the node's root, read by its nvidia-smi)."""
        with self._lock:
            state = self.state()
            staged: dict[str, str] = state.get("gpu_firmware_staged") or {}
            if not staged:
                return
            path = self.spec.root / _GPU_FIRMWARE_FILE
            try:
                running = json.loads(path.read_text(encoding="utf-8"))["gpus"]
                if not isinstance(running, dict):
                    running = {}
            except (OSError, ValueError, KeyError, TypeError):
                running = {}
            running.update(staged)
            text = json.dumps({"gpus": running}, indent=2, sort_keys=True) + "\n"
            _write_atomic(path, text.encode(), 0o644)
            state["gpu_firmware_staged"] = {}
            self._save(state)
            LOG.info("%s: GPU firmware activated: %s", self.spec.node, sorted(set(staged.values())))

    # -- resources ----------------------------------------------------------------------------

    def _power_state(self) -> str:
        return "On" if self.power.is_on() else "Off"

    def resource(self, path: str) -> dict[str, Any] | None:
        """The resource at ``path`` (normalised), None when there is none."""
        node = self.spec.node
        if path == SERVICE_ROOT:
            return {
                "@odata.type": "#ServiceRoot.v1_16_0.ServiceRoot",
                "@odata.id": SERVICE_ROOT,
                "Id": "RootService",
                "Name": "Root Service",
                "RedfishVersion": "1.17.0",
                "UUID": self._uuid,
                "Vendor": "gpuctl lab (SIMULATION)",
                "Product": "gpuctl lab simulated BMC",
                "Systems": _link(f"{SERVICE_ROOT}/Systems"),
                "Managers": _link(f"{SERVICE_ROOT}/Managers"),
                "UpdateService": _link(UPDATE_SERVICE),
                "TaskService": _link(TASK_SERVICE),
                "Links": {},
            }
        if path == f"{SERVICE_ROOT}/Systems":
            return _collection(
                path, "ComputerSystemCollection", "Computer System Collection", [SYSTEM]
            )
        if path == SYSTEM:
            power = self._power_state()
            return {
                "@odata.type": "#ComputerSystem.v1_22_0.ComputerSystem",
                "@odata.id": SYSTEM,
                "Id": SYSTEM_ID,
                "Name": node,
                "HostName": node,
                "SystemType": "Physical",
                "Manufacturer": "gpuctl lab (SIMULATION)",
                "Model": str(self.profile().get("description", "")),
                "SerialNumber": f"LAB{hashlib.sha256(node.encode()).hexdigest()[:10].upper()}",
                "UUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpuctl-lab")),
                "PowerState": power,
                "Status": {
                    "State": "Enabled" if power == "On" else "StandbyOffline",
                    "Health": "OK",
                },
                "Actions": {
                    "#ComputerSystem.Reset": {
                        "target": SYSTEM_RESET,
                        "ResetType@Redfish.AllowableValues": list(SYSTEM_RESET_TYPES),
                    }
                },
                "Links": {"ManagedBy": [_link(MANAGER)]},
            }
        if path == f"{SERVICE_ROOT}/Managers":
            return _collection(path, "ManagerCollection", "Manager Collection", [MANAGER])
        if path == MANAGER:
            return {
                "@odata.type": "#Manager.v1_19_0.Manager",
                "@odata.id": MANAGER,
                "Id": MANAGER_ID,
                "Name": f"{node} BMC",
                "ManagerType": "BMC",
                "Model": "gpuctl lab BMC (SIMULATION)",
                "UUID": self._uuid,
                "FirmwareVersion": self.state()["bmc_firmware"]["running"],
                "PowerState": "On",
                "Status": {"State": "Enabled", "Health": "OK"},
                "Actions": {
                    "#Manager.Reset": {
                        "target": MANAGER_RESET,
                        "ResetType@Redfish.AllowableValues": list(MANAGER_RESET_TYPES),
                    }
                },
                "Links": {"ManagerForServers": [_link(SYSTEM)]},
            }
        if path == UPDATE_SERVICE:
            return {
                "@odata.type": "#UpdateService.v1_14_0.UpdateService",
                "@odata.id": UPDATE_SERVICE,
                "Id": "UpdateService",
                "Name": "Update Service",
                "ServiceEnabled": True,
                "Status": {"State": "Enabled", "Health": "OK"},
                "FirmwareInventory": _link(INVENTORY),
                "MultipartHttpPushUri": MULTIPART_PUSH,
                "MaxImageSizeBytes": MAX_UPLOAD,
                "MultipartHttpPushUri@Redfish.OperationApplyTimeSupport": {
                    "@odata.type": "#Settings.v1_4_0.OperationApplyTimeSupport",
                    "SupportedValues": list(APPLY_TIMES),
                },
            }
        if path == INVENTORY:
            members = [f"{INVENTORY}/{i}" for i in self._inventory_ids()]
            return _collection(
                path, "SoftwareInventoryCollection", "Firmware Inventory Collection", members
            )
        if path.startswith(f"{INVENTORY}/"):
            return self._inventory_item(path.rsplit("/", 1)[-1])
        if path == TASK_SERVICE:
            return {
                "@odata.type": "#TaskService.v1_2_1.TaskService",
                "@odata.id": TASK_SERVICE,
                "Id": "TaskService",
                "Name": "Task Service",
                "ServiceEnabled": True,
                "Status": {"State": "Enabled", "Health": "OK"},
                "Tasks": _link(TASKS),
            }
        if path == TASKS:
            with self._lock:
                members = [f"{TASKS}/{i}" for i in self._tasks]
            return _collection(path, "TaskCollection", "Task Collection", members)
        return None

    def _inventory_item(self, ident: str) -> dict[str, Any] | None:
        ids = self._inventory_ids()
        if ident not in ids:
            return None
        index = ids[ident]
        if index is None:
            version = self.state()["bmc_firmware"]["running"]
            name = "BMC firmware"
        else:
            version = self.running_gpu_firmware()[index]
            name = f"GPU SXM {ident.removeprefix(GPU_INVENTORY_PREFIX)} firmware"
        return {
            "@odata.type": "#SoftwareInventory.v1_10_0.SoftwareInventory",
            "@odata.id": f"{INVENTORY}/{ident}",
            "Id": ident,
            "Name": name,
            "Version": version,
            "Updateable": True,
            "WriteProtected": False,
            "Manufacturer": "gpuctl lab (SIMULATION)",
            "Status": {"State": "Enabled", "Health": "OK"},
        }

    # -- tasks --------------------------------------------------------------------------------

    def task(self, ident: str) -> Task | None:
        with self._lock:
            return self._tasks.get(ident)

    def task_body(self, task: Task) -> dict[str, Any]:
        with self._lock:
            if task.state == "Running":
                elapsed = time.monotonic() - task.started
                full = task.duration / (0.5 if task.failure else 1.0)
                percent = min(99, int(100 * elapsed / full)) if full > 0 else 99
            else:
                percent = 100
            body: dict[str, Any] = {
                "@odata.type": "#Task.v1_7_3.Task",
                "@odata.id": f"{TASKS}/{task.id}",
                "Id": task.id,
                "Name": f"Update {task.component} from {task.filename}",
                "TaskState": task.state,
                "TaskStatus": task.status,
                "PercentComplete": percent,
                "StartTime": task.start_time,
                "TaskMonitor": f"{TASK_MONITORS}/{task.id}",
                "Messages": list(task.messages),
                "Payload": {"TargetUri": MULTIPART_PUSH, "HttpOperation": "POST"},
            }
            if task.end_time is not None:
                body["EndTime"] = task.end_time
            return body

    def start_update(self, parameters: dict[str, Any], part: Part) -> Task:
        """Check the package and the targets, and start the task (its end is decided now:
        a bad package or target fails it half way; the ``fw_update_fails`` fault at its end)."""
        targets = tuple(str(t) for t in parameters.get("Targets") or [])
        apply_time = str(parameters.get("@Redfish.OperationApplyTime") or "Immediate")
        filename = part.filename or "UpdateFile"
        failure: tuple[str, str] | None = None
        component, version = "unknown", ""
        try:
            package = read_package(part.data)
            component, version = package.component, package.version
            self._check_targets(package, targets)
        except PackageError as exc:
            failure = (
                "Update.1.0.VerificationFailed",
                f"Verification of image '{filename}' at '{self.spec.node} BMC' failed: {exc}",
            )
        with self._lock:
            ident = str(self._next_task)
            self._next_task += 1
            duration = self.timing.task_s * (0.5 if failure else 1.0)
            task = Task(
                id=ident,
                component=component,
                filename=filename,
                version=version,
                targets=targets,
                started=time.monotonic(),
                start_time=_iso(),
                duration=duration,
                failure=failure,
                messages=[
                    _message(
                        "Update.1.0.UpdateInProgress",
                        "An update is in progress.",
                        "OK",
                    )
                ],
            )
            self._tasks[ident] = task
        LOG.info(
            "%s: task %s: update %s %s from %s (targets: %s, apply time %s)",
            self.spec.node,
            ident,
            component,
            version or "?",
            filename,
            ", ".join(t.rstrip("/").rsplit("/", 1)[-1] for t in targets) or "all",
            apply_time,
        )
        timer = threading.Timer(duration, self._finish, (task, apply_time))
        timer.daemon = True
        timer.start()
        return task

    def _check_targets(self, package: LabPackage, targets: tuple[str, ...]) -> None:
        ids = self._inventory_ids()
        for target in targets:
            ident = target.rstrip("/").removeprefix(f"{INVENTORY}/")
            if ident == target.rstrip("/") or ident not in ids:
                raise PackageError(f"Target {target} is not in this BMC's FirmwareInventory")
            is_gpu = ids[ident] is not None
            if is_gpu != (package.component == GPU_COMPONENT):
                raise PackageError(
                    f"Target {target} is not a {package.component} component (the package "
                    f"is {package.component} {package.version})"
                )
        if package.component == GPU_COMPONENT:
            model = str(self.profile().get("model", ""))
            if package.gpu_model != model:
                raise PackageError(
                    f"the package is for {package.gpu_model} GPUs, this node has {model}"
                )

    def _finish(self, task: Task, apply_time: str) -> None:
        try:
            self._finish_task(task, apply_time)
        except Exception as exc:  # a bug or an unreadable node: the task fails, not the server
            LOG.exception("%s: task %s failed inside the BMC", self.spec.node, task.id)
            with self._lock:
                task.state, task.status, task.end_time = "Exception", "Critical", _iso()
                task.messages.append(
                    _message(
                        "Update.1.0.ApplyFailed",
                        f"Installation of image '{task.filename}' failed: {type(exc).__name__}",
                        "Critical",
                    )
                )

    def _finish_task(self, task: Task, apply_time: str) -> None:
        where = f"{self.spec.node} BMC"
        with self._lock:
            failure = task.failure
            if failure is None and self.faults().get("fw_update_fails"):
                failure = (
                    "Update.1.0.ApplyFailed",
                    f"Installation of image '{task.filename}' to '{where}' failed "
                    "(simulated fault fw_update_fails)",
                )
            if failure is not None:
                task.state, task.status = "Exception", "Critical"
                task.messages.append(_message(*failure, "Critical"))
                task.end_time = _iso()
                LOG.info("%s: task %s: %s", self.spec.node, task.id, failure[0])
                return
            state = self.state()
            bounce = False
            if task.component == GPU_COMPONENT:
                ids = self._inventory_ids()
                chosen = [ids[t.rstrip("/").rsplit("/", 1)[-1]] for t in task.targets] or [
                    i for i in ids.values() if i is not None
                ]
                staged = state.setdefault("gpu_firmware_staged", {})
                for index in chosen:
                    staged[str(index)] = task.version
                task.messages.append(
                    _message(
                        "Update.1.0.AwaitingActivation",
                        f"Awaiting for an action to proceed with activating image "
                        f"'{task.filename}' on '{where}': the GPUs run it after a power cycle "
                        "(PowerCycle, or ForceOff then On).",
                        "OK",
                    )
                )
            else:
                state["bmc_firmware"]["staged"] = task.version
                bounce = apply_time == "Immediate"
                if not bounce:
                    task.messages.append(
                        _message(
                            "Update.1.0.AwaitingActivation",
                            f"Awaiting for an action to proceed with activating image "
                            f"'{task.filename}' on '{where}': Manager.Reset.",
                            "OK",
                        )
                    )
            self._save(state)
            task.messages.append(
                _message(
                    "Update.1.0.UpdateSuccessful",
                    f"Device '{where}' successfully updated with image '{task.filename}'.",
                    "OK",
                )
            )
            task.state, task.status, task.end_time = "Completed", "OK", _iso()
        LOG.info("%s: task %s: completed", self.spec.node, task.id)
        if bounce:
            self.reset_self(delay=self.timing.reset_delay_s)

    # -- resets -------------------------------------------------------------------------------

    def reset_self(self, delay: float = 0.1) -> None:
        """The BMC resets: after ``delay`` its address refuses connections for
        ``timing.reset_s`` seconds; a staged BMC firmware runs when it answers again."""

        def bounce() -> None:
            time.sleep(delay)
            LOG.info("%s: BMC resets (%.1f s)", self.spec.node, self.timing.reset_s)
            listener = self.listener
            if listener is not None:
                listener.stop()
            try:
                with self._lock:
                    state = self.state()
                    staged = state["bmc_firmware"].get("staged")
                    if staged:
                        state["bmc_firmware"] = {"running": staged, "staged": None}
                        self._save(state)
                time.sleep(self.timing.reset_s)
            finally:
                if listener is not None:
                    listener.start()
            LOG.info("%s: BMC is back", self.spec.node)

        threading.Thread(target=bounce, name=f"bmc-reset-{self.spec.node}", daemon=True).start()

    def reset_system(self, reset_type: str) -> None:
        """Start ``reset_type`` (ComputerSystem.Reset) in the background; one power action at
        a time per node."""

        def act() -> None:
            with self._power_lock:
                try:
                    self._power_action(reset_type)
                except Exception:
                    LOG.exception("%s: %s failed", self.spec.node, reset_type)

        threading.Thread(target=act, name=f"bmc-power-{self.spec.node}", daemon=True).start()

    def _power_action(self, reset_type: str) -> None:
        power, node = self.power, self.spec.node
        LOG.info("%s: ComputerSystem.Reset %s (power %s)", node, reset_type, self._power_state())
        if reset_type == "On":
            power.power_on()
        elif reset_type in ("ForceOff", "GracefulShutdown", "PowerCycle"):
            if power.is_on():
                if reset_type == "GracefulShutdown":
                    power.graceful_off()
                else:
                    power.force_off()
                if not power.wait_off(self.timing.power_off_timeout_s):
                    LOG.warning("%s: did not power off; %s abandoned", node, reset_type)
                    return
            self.activate_gpu_firmware()  # the GPUs lost power
            if reset_type == "PowerCycle":
                power.power_on()
        elif reset_type in ("ForceRestart", "GracefulRestart"):
            if power.is_on():
                power.restart(graceful=reset_type == "GracefulRestart")
            else:
                power.power_on()
        LOG.info("%s: %s done (power %s)", node, reset_type, self._power_state())


# ------------------------------------------------------------------------------------------
# HTTP


def _normalise(raw_path: str) -> str:
    path = raw_path.split("?", 1)[0].split("#", 1)[0]
    path = re.sub("/+", "/", path)
    return path.rstrip("/") or "/"


class _Handler(BaseHTTPRequestHandler):
    """Redfish over HTTP/1.1 for one BMC (the server's ``bmc``)."""

    server: _BmcServer
    protocol_version = "HTTP/1.1"
    server_version = "gpuctl-lab-bmc/1"
    sys_version = ""
    timeout = 120

    def log_message(self, format: str, *args: Any) -> None:
        # http.server's line: client, request line, status (never a header)
        LOG.info("%s %s %s", self.server.bmc.spec.address, self.address_string(), format % args)

    # -- answers ------------------------------------------------------------------------------

    def _send(
        self,
        status: int,
        body: dict[str, Any] | None,
        headers: dict[str, str] | None = None,
    ) -> None:
        data = b"" if body is None else json.dumps(body, indent=1).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("OData-Version", "4.0")
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)

    def _error(
        self, status: int, message_id: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        body = {
            "error": {
                "code": message_id,
                "message": message,
                "@Message.ExtendedInfo": [
                    _message(message_id, message, "Critical" if status >= 500 else "Warning")
                ],
            }
        }
        self._send(status, body, headers)

    def _authorised(self) -> bool:
        header = self.headers.get("Authorization") or ""
        scheme, _, token = header.partition(" ")
        ok = False
        if scheme.lower() == "basic":
            try:
                user, sep, password = (
                    base64.b64decode(token.strip(), validate=True).decode().partition(":")
                )
            except (binascii.Error, UnicodeDecodeError, ValueError):
                user, sep, password = "", "", ""
            service = self.server.service
            ok = bool(sep) and (
                hmac.compare_digest(user.encode(), service.username.encode())
                & hmac.compare_digest(password.encode(), service.password.encode())
            )
        if not ok:
            self._drain()
            self._error(
                401,
                "Base.1.18.NoValidSession",
                "There is no valid session established with the implementation "
                "(HTTP Basic authentication required).",
                {"WWW-Authenticate": 'Basic realm="Redfish"'},
            )
        return ok

    def _drain(self, limit: int = 1 << 20) -> None:
        """Read and drop a request body not used (closing with it unread would reset the
        connection before the client reads the answer); a larger one closes the connection."""
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if self.headers.get("Transfer-Encoding") or not 0 <= length <= limit:
            self.close_connection = True
        elif length:
            self.rfile.read(length)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise BadRequest("Base.1.18.GeneralError", "chunked bodies are not supported", 411)
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise BadRequest("Base.1.18.GeneralError", "bad Content-Length")
        if length > MAX_UPLOAD:
            self.close_connection = True
            raise BadRequest(
                "Base.1.18.PayloadTooLarge",
                f"the body is larger than {MAX_UPLOAD} bytes",
                413,
            )
        data = self.rfile.read(length) if length else b""
        if len(data) != length:
            self.close_connection = True
            raise BadRequest("Base.1.18.GeneralError", "the body ended early")
        return data

    def _json_body(self) -> dict[str, Any]:
        data = self._body()
        try:
            body = json.loads(data) if data.strip() else {}
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise BadRequest("Base.1.18.MalformedJSON", "The request body is not a JSON object.")
        return body

    # -- methods ------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch(self._get)

    def do_HEAD(self) -> None:
        self._dispatch(self._get)

    def do_POST(self) -> None:
        self._dispatch(self._post)

    def do_PATCH(self) -> None:
        self._dispatch(self._not_allowed)

    def do_PUT(self) -> None:
        self._dispatch(self._not_allowed)

    def do_DELETE(self) -> None:
        self._dispatch(self._not_allowed)

    def _dispatch(self, method: Callable[[str], None]) -> None:
        path = _normalise(self.path)
        try:
            if path in ("/redfish", SERVICE_ROOT) and self.command in ("GET", "HEAD"):
                method(path)  # the service root needs no authentication (DSP0266)
            elif self._authorised():
                method(path)
        except BadRequest as exc:
            self._error(exc.status, exc.message_id, exc.message)

    def _not_allowed(self, path: str) -> None:
        self._drain()
        self._error(405, "Base.1.18.OperationNotAllowed", f"{self.command} is not allowed here.")

    def _get(self, path: str) -> None:
        bmc = self.server.bmc
        if path == "/redfish":
            self._send(200, {"v1": f"{SERVICE_ROOT}/"})
            return
        if path.startswith(f"{TASKS}/") or path.startswith(f"{TASK_MONITORS}/"):
            task = bmc.task(path.rsplit("/", 1)[-1])
            if task is None:
                self._error(404, "Base.1.18.ResourceNotFound", f"No resource at {path}.")
                return
            body = bmc.task_body(task)
            running = body["TaskState"] == "Running"
            headers = {"Retry-After": "1"} if running else {}
            if path.startswith(TASK_MONITORS):
                if running:
                    headers["Location"] = f"{TASK_MONITORS}/{task.id}"
                self._send(202 if running else 200, body, headers)
            else:
                self._send(200, body, headers)
            return
        resource = bmc.resource(path)
        if resource is None:
            self._error(404, "Base.1.18.ResourceNotFound", f"No resource at {path}.")
            return
        self._send(200, resource)

    def _post(self, path: str) -> None:
        bmc = self.server.bmc
        if path == SYSTEM_RESET:
            reset_type = self._reset_type(SYSTEM_RESET_TYPES)
            self._send(204, None)
            bmc.reset_system(reset_type)
            return
        if path == MANAGER_RESET:
            self._reset_type(MANAGER_RESET_TYPES)
            self._send(204, None)
            bmc.reset_self()
            return
        if path == MULTIPART_PUSH:
            self._update()
            return
        if bmc.resource(path) is not None or path.startswith((TASKS, TASK_MONITORS)):
            self._not_allowed(path)
            return
        self._drain()
        self._error(404, "Base.1.18.ResourceNotFound", f"No resource at {path}.")

    def _reset_type(self, allowed: Sequence[str]) -> str:
        body = self._json_body()
        value = body.get("ResetType")
        if value is None:
            raise BadRequest(
                "Base.1.18.ActionParameterMissing",
                "The action requires the parameter ResetType.",
            )
        if value not in allowed:
            raise BadRequest(
                "Base.1.18.ActionParameterNotSupported",
                f"ResetType {str(value)[:40]!r} is not supported (allowed: {', '.join(allowed)}).",
            )
        return str(value)

    def _update(self) -> None:
        data = self._body()
        parts = parse_multipart(data, self.headers.get("Content-Type") or "")
        if "UpdateParameters" not in parts or "UpdateFile" not in parts:
            raise BadRequest(
                "Base.1.18.ActionParameterMissing",
                "A multipart update needs the parts UpdateParameters and UpdateFile.",
            )
        try:
            parameters = json.loads(parts["UpdateParameters"].data or b"{}")
        except ValueError:
            parameters = None
        if not isinstance(parameters, dict):
            raise BadRequest("Base.1.18.MalformedJSON", "UpdateParameters is not a JSON object.")
        targets = parameters.get("Targets", [])
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise BadRequest(
                "Base.1.18.PropertyValueTypeError",
                "UpdateParameters: Targets must be a list of URIs.",
            )
        apply_time = parameters.get("@Redfish.OperationApplyTime", "Immediate")
        if apply_time not in APPLY_TIMES:
            raise BadRequest(
                "Base.1.18.PropertyValueNotInList",
                f"@Redfish.OperationApplyTime {str(apply_time)[:40]!r} is not supported "
                f"(supported: {', '.join(APPLY_TIMES)}).",
            )
        if not isinstance(parameters.get("ForceUpdate", False), bool):
            raise BadRequest(
                "Base.1.18.PropertyValueTypeError", "UpdateParameters: ForceUpdate is a boolean."
            )
        task = self.server.bmc.start_update(parameters, parts["UpdateFile"])
        monitor = f"{TASK_MONITORS}/{task.id}"
        self._send(202, self.server.bmc.task_body(task), {"Location": monitor, "Retry-After": "1"})


class _BmcServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(
        self, address: tuple[str, int], bmc: LabBmc, service: BmcService, context: ssl.SSLContext
    ) -> None:
        self.bmc = bmc
        self.service = service
        self.context = context
        super().__init__(address, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """TLS in the request's own thread (a slow handshake holds up no other client)."""
        request.settimeout(30)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or type(exc).__name__
            # a client that connects and goes (a port probe) is not worth a line
            level = logging.DEBUG if isinstance(exc, ssl.SSLEOFError) else logging.INFO
            LOG.log(
                level,
                "%s %s TLS handshake failed: %s",
                self.bmc.spec.address,
                client_address[0],
                reason,
            )
            return
        try:
            _Handler(tls, client_address, self)
        finally:
            with contextlib.suppress(OSError):
                tls.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        LOG.exception("%s: error serving %s", self.bmc.spec.address, client_address[0])


def check_bind_address(address: str) -> None:
    """Only the lab's range (198.18.0.0/15) and 127.0.0.1 (unit tests) are ever bound."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise LabError(f"lab BMC: {address!r} is not an IP address") from None
    if ip not in ALLOWED_NETWORK and str(ip) != TEST_ADDRESS:
        raise LabError(f"lab BMC: refusing to bind {address} (only {ALLOWED_NETWORK})")


class _Listener:
    """One BMC's HTTPS server; stopped and started again when the BMC resets."""

    def __init__(
        self, bmc: LabBmc, service: BmcService, port: int, context: ssl.SSLContext
    ) -> None:
        check_bind_address(bmc.spec.address)
        self.bmc = bmc
        self.service = service
        self.port = port
        self.context = context
        self._server: _BmcServer | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._server is not None:
                return
            deadline = time.monotonic() + 10
            while True:
                try:
                    server = _BmcServer(
                        (self.bmc.spec.address, self.port), self.bmc, self.service, self.context
                    )
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            self.port = server.server_address[1]
            self._server = server
            threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.2},
                name=f"bmc-{self.bmc.spec.node}",
                daemon=True,
            ).start()

    def stop(self) -> None:
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


class BmcService:
    """SIMULATION: every lab node's BMC, each on its own address, in one process."""

    def __init__(
        self,
        specs: Sequence[BmcSpec],
        *,
        username: str,
        password: str,
        context: ssl.SSLContext,
        state_directory: Path,
        power: Callable[[BmcSpec], PowerControl],
        timing: Timing | None = None,
        port: int = PORT,
    ) -> None:
        self.username = username
        self.password = password
        self.timing = timing or Timing.from_env()
        state_directory.mkdir(parents=True, exist_ok=True)
        self.bmcs = {s.node: LabBmc(s, power(s), state_directory, self.timing) for s in specs}
        self._listeners = {
            node: _Listener(bmc, self, port, context) for node, bmc in self.bmcs.items()
        }
        for node, bmc in self.bmcs.items():
            bmc.listener = self._listeners[node]

    def start(self) -> None:
        for listener in self._listeners.values():
            listener.start()

    def stop(self) -> None:
        for listener in self._listeners.values():
            listener.stop()

    def url(self, node: str) -> str:
        listener = self._listeners[node]
        return f"https://{listener.bmc.spec.address}:{listener.port}"


# ------------------------------------------------------------------------------------------
# The lab's BMC process (started by `gpuctl lab up`, ended by `gpuctl lab down`)


def _config_file() -> Path:
    return _run_dir() / "bmc.json"


def _pidfile() -> Path:
    return _run_dir() / "bmc.pid"


def server_pid() -> int | None:
    return _live_pid(_pidfile(), _SERVER_MARKER.encode())


def add_addresses(bridge: str, addresses: Sequence[str]) -> None:
    """Put each BMC address on the lab bridge as a /32 (idempotent): reachable from the host,
    not from the nodes (their 198.18.0.0/24 has no route to them)."""
    have = run(["ip", "-o", "-4", "addr", "show", "dev", bridge]).stdout
    present = {word.split("/")[0] for word in have.split()}
    for address in addresses:
        check_bind_address(address)
        if address not in present:
            run(["ip", "addr", "add", f"{address}/32", "dev", bridge])


def _port_open(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((address, port)) == 0


def start(specs: Sequence[BmcSpec], bridge: str, timeout: float = 20) -> bool:
    """Credentials, TLS, the addresses on the bridge, and the server process (restarted when
    the BMCs or the certificate changed). True when the process was started now."""
    ensure_credentials()
    addresses = [s.address for s in specs]
    ensure_tls(addresses)
    add_addresses(bridge, addresses)
    config = {
        "port": PORT,
        "bmcs": [{"node": s.node, "address": s.address, "root": str(s.root)} for s in specs],
        "certificate_sha256": hashlib.sha256((bmc_dir() / "server.pem").read_bytes()).hexdigest(),
    }
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    with contextlib.suppress(OSError):
        if server_pid() is not None and _config_file().read_text(encoding="utf-8") == text:
            return False
    stop_server()
    _config_file().write_text(text, encoding="utf-8")
    log = open(_run_dir() / "bmc.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(  # noqa: S603 - argv list
        [sys.executable, "-m", _SERVER_MARKER, "serve", str(_config_file())],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd="/",
    )
    log.close()
    _pidfile().write_text(f"{proc.pid}\n", encoding="utf-8")
    deadline = time.monotonic() + timeout
    while not all(_port_open(a, PORT) for a in addresses):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server()
            raise LabError(f"the lab BMCs did not start (see {_run_dir() / 'bmc.log'})")
        time.sleep(0.1)
    return True


def stop_server(timeout: float = 10) -> None:
    pid = server_pid()
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while server_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        if server_pid() is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while server_pid() is not None and time.monotonic() < deadline + 5:
                time.sleep(0.05)
    _pidfile().unlink(missing_ok=True)
    _config_file().unlink(missing_ok=True)


def stop() -> None:
    """End the server and forget the BMCs' state (`gpuctl lab down`: the nodes' disks go too).
    The CA, the certificate and the credentials stay."""
    stop_server()
    shutil.rmtree(state_dir(), ignore_errors=True)


def serve(config_path: Path) -> int:
    """The server process: every BMC of the config, until SIGTERM."""
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s gpuctl-lab-bmc: %(message)s"
    )
    config = json.loads(config_path.read_text(encoding="utf-8"))
    specs = [BmcSpec(b["node"], b["address"], Path(b["root"])) for b in config["bmcs"]]
    username, password = load_credentials()
    run_dir = _run_dir()
    service = BmcService(
        specs,
        username=username,
        password=password,
        context=server_context(),
        state_directory=state_dir(),
        power=lambda s: SupervisorPower(s.node, s.root, run_dir),
        port=int(config.get("port", PORT)),
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: done.set())
    signal.signal(signal.SIGINT, lambda signum, frame: done.set())
    service.start()
    LOG.info("serving %s", ", ".join(f"{s.node} {s.address}:{PORT}" for s in specs))
    while not done.wait(1.0):
        pass
    service.stop()
    LOG.info("stopped")
    return 0


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or argv[0] != "serve":
        sys.stderr.write("usage: python -m gpuctl.lab.bmc serve CONFIG (run by gpuctl lab up)\n")
        return 2
    return serve(Path(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
