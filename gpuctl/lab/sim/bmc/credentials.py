"""SIMULATION: where the lab BMCs keep their files, and their user's credentials (an Ansible
Vault file and its vault password, both 0600)."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any, Final

import yaml

from gpuctl.fileio import write_atomic
from gpuctl.lab.system import LabError, lab_dir

USERNAME: Final = "gpuctl-lab"


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
    write_atomic(d / "vault-password", f"{vault_password}\n".encode(), mode=0o600, durable=True)
    write_atomic(d / "credentials.vault.yml", bytes(encrypted), mode=0o600, durable=True)
    return True
