"""BMC access for `gpuctl rollout` (gpuctl.rollout.bmc): where the credentials come from (an
Ansible Vault file or the environment), the checks made before a rollout starts, and that no
secret reaches a message."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from ansible.parsing.vault import VaultLib, VaultSecret

from gpuctl.config import load_cluster
from gpuctl.config.loader import load_cluster_text
from gpuctl.errors import ConfigError, UsageError
from gpuctl.rollout.bmc import bmc_url, check_bmc_access, load_credentials
from gpuctl.starter import starter

PASSWORD = "bmc-Pa55-7731-secret"  # noqa: S105 - test value, checked never to leak
VAULT_PASSWORD = "vault-Pa55-0099"  # noqa: S105 - test value


def lab_cluster(tmp_path: Path, *, vault: bool = True) -> Path:
    """The lab starter (bmc_addresses, a vault file) with its BMC files beside it."""
    text = starter("lab", 2)
    if not vault:
        doc = yaml.safe_load(text)
        doc["bmc"]["credentials"] = {"username_env": "T_BMC_USER", "password_env": "T_BMC_PASS"}
        text = yaml.safe_dump(doc, sort_keys=False)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "cluster.yml"
    path.write_text(text, encoding="utf-8")
    (tmp_path / ".gpuctl/lab/bmc").mkdir(parents=True)
    (tmp_path / ".gpuctl/lab/bmc/ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    return path


def write_vault(
    directory: Path,
    content: object,
    *,
    vault_password: str = VAULT_PASSWORD,
    mode: int = 0o600,
) -> None:
    pw = directory / ".gpuctl/lab/bmc/vault-password"
    pw.write_text(VAULT_PASSWORD + "\n", encoding="utf-8")
    pw.chmod(mode)
    lib = VaultLib([("default", VaultSecret(vault_password.encode()))])
    blob = lib.encrypt(yaml.safe_dump(content))
    vault = directory / ".gpuctl/lab/bmc/credentials.vault.yml"
    vault.write_bytes(blob)
    vault.chmod(0o600)


def assert_no_secret(text: str) -> None:
    assert PASSWORD not in text
    assert VAULT_PASSWORD not in text


def test_credentials_from_the_vault_file(tmp_path: Path) -> None:
    path = lab_cluster(tmp_path)
    write_vault(tmp_path, {"username": "ops", "password": PASSWORD})
    creds = load_credentials(path, load_cluster(path))
    assert (creds.username, creds.secret()) == ("ops", PASSWORD)
    assert_no_secret(repr(creds))


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("wrong-vault-password", "cannot decrypt it with the vault password in"),
        ("readable-by-others", "group or others may read it; chmod 600"),
        ("not-a-mapping", "expected a YAML mapping with `username` and `password`"),
        ("plain-text", "not an Ansible Vault file"),
        ("missing", "vault password file .*No such file"),
    ],
)
def test_vault_problems_are_usage_errors_without_secrets(
    tmp_path: Path, setup: str, message: str
) -> None:
    path = lab_cluster(tmp_path)
    vault = tmp_path / ".gpuctl/lab/bmc/credentials.vault.yml"
    if setup == "wrong-vault-password":
        write_vault(tmp_path, {"username": "ops", "password": PASSWORD}, vault_password="x")  # noqa: S106
    elif setup == "readable-by-others":
        write_vault(tmp_path, {"username": "ops", "password": PASSWORD}, mode=0o644)
    elif setup == "not-a-mapping":
        write_vault(tmp_path, [PASSWORD])
    elif setup == "plain-text":
        write_vault(tmp_path, {})
        vault.write_text(f"username: ops\npassword: {PASSWORD}\n")
        vault.chmod(0o600)
    with pytest.raises(UsageError, match=message) as info:
        load_credentials(path, load_cluster(path))
    assert_no_secret(str(info.value))


def test_the_vault_password_file_may_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = lab_cluster(tmp_path)
    write_vault(tmp_path, {"username": "ops", "password": PASSWORD})
    doc = yaml.safe_load(path.read_text())
    del doc["bmc"]["credentials"]["vault_password_file"]
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    with pytest.raises(UsageError, match=r"set bmc\.credentials\.vault_password_file or ANSIBLE_"):
        load_credentials(path, load_cluster(path))
    monkeypatch.setenv(
        "ANSIBLE_VAULT_PASSWORD_FILE", str(tmp_path / ".gpuctl/lab/bmc/vault-password")
    )
    assert load_credentials(path, load_cluster(path)).secret() == PASSWORD


def test_credentials_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = lab_cluster(tmp_path, vault=False)
    monkeypatch.setenv("T_BMC_USER", "ops")
    monkeypatch.delenv("T_BMC_PASS", raising=False)
    with pytest.raises(UsageError, match=r"bmc.credentials: .*not set: T_BMC_PASS"):
        load_credentials(path, load_cluster(path))
    monkeypatch.setenv("T_BMC_PASS", PASSWORD)
    creds = load_credentials(path, load_cluster(path))
    assert (creds.username, creds.secret()) == ("ops", PASSWORD)


def test_every_node_in_scope_needs_a_bmc_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cluster.yml"
    path.write_text(starter("hgx-h100", 4), encoding="utf-8")  # no bmc_addresses
    monkeypatch.setenv("GPUCTL_BMC_USERNAME", "ops")
    monkeypatch.setenv("GPUCTL_BMC_PASSWORD", PASSWORD)
    with pytest.raises(UsageError, match=r"no BMC address for gpu001, gpu002: set node_groups"):
        check_bmc_access(path, load_cluster(path), ["gpu001", "gpu002"])
    lab = lab_cluster(tmp_path / "lab")
    write_vault(tmp_path / "lab", {"username": "ops", "password": PASSWORD})
    assert check_bmc_access(lab, load_cluster(lab), ["gpu001"]).username == "ops"
    (tmp_path / "lab/.gpuctl/lab/bmc/ca.pem").unlink()
    with pytest.raises(UsageError, match=r"bmc.ca_bundle: .*ca.pem is not a file"):
        check_bmc_access(lab, load_cluster(lab), ["gpu001"])


def test_bmc_addresses_are_checked_like_addresses() -> None:
    text = starter("lab", 2).replace(
        'bmc_addresses: "198.18.1.[11-12]"', 'bmc_addresses: "198.18.1.11,bad_name!"'
    )
    with pytest.raises(ConfigError) as info:
        load_cluster_text(text, "cluster.yml")
    message = str(info.value)
    assert "bmc_addresses" in message
    assert "neither an IP address nor a host name" in message or "node set" in message
    short = starter("lab", 2).replace('bmc_addresses: "198.18.1.[11-12]"', "bmc_addresses: a1")
    with pytest.raises(ConfigError, match="1 BMC addresses for 2 nodes"):
        load_cluster_text(short, "cluster.yml")


def test_bmc_urls() -> None:
    assert bmc_url("198.18.1.11", 443) == "https://198.18.1.11"
    assert bmc_url("fd00::5", 8443) == "https://[fd00::5]:8443"
    assert bmc_url("bmc-gpu001.example", 443) == "https://bmc-gpu001.example"


def test_the_lab_cluster_yml_points_at_the_lab_bmc_files() -> None:
    from gpuctl.lab.lab import lab_cluster_text, lab_dir

    cluster = load_cluster_text(lab_cluster_text(2, "hgx-h100-ndr"), "lab")
    creds = cluster.bmc.credentials
    assert creds.vault_file == os.fspath(lab_dir() / "bmc/credentials.vault.yml")
    assert creds.vault_password_file == os.fspath(lab_dir() / "bmc/vault-password")
    assert cluster.bmc.ca_bundle == os.fspath(lab_dir() / "bmc/ca.pem")
    assert cluster.bmc.verify_tls is True
