"""The nodes' BMCs for `gpuctl rollout`: credentials, and the Redfish steps of the
``gpu-firmware`` and ``bmc-firmware`` components.

Credentials come from an Ansible Vault file (``bmc.credentials.vault_file``, decrypted with the
vault password file) or from two environment variables, never from cluster.yml itself. They
live in a :class:`gpuctl.rollout.redfish.Credentials`, whose repr hides the password, and every
Redfish error message is redacted by the client before it can reach the audit log.

GPU firmware (HGX): the package is pushed to the BMC's ``MultipartHttpPushUri`` with the GPUs'
FirmwareInventory members (``bmc.gpu_inventory_prefix``) as ``Targets``; the BMC flashes them
and the new firmware is loaded when the GPUs lose power, so the node is power cycled through
``ComputerSystem.Reset`` (``bmc.power_cycle``). The versions are the FirmwareInventory members'
``Version``; the staged one is not visible over standard Redfish, so ``Versions.pending`` is
reported as unknown (the executor then restarts again rather than assume).

BMC firmware: the package is pushed with ``@Redfish.OperationApplyTime: Immediate`` (and the
``bmc.bmc_inventory_id`` member as target when set); the BMC activates it by resetting itself,
and the rollout waits until ``Managers/<id>.FirmwareVersion`` is the target. The host keeps
running.
"""

from __future__ import annotations

import ipaddress
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gpuctl.config.derived import nodes as cluster_nodes
from gpuctl.config.model import Cluster
from gpuctl.errors import UsageError
from gpuctl.rollout import redfish
from gpuctl.rollout.backend import BackendError, Versions

VAULT_PASSWORD_ENV = "ANSIBLE_VAULT_PASSWORD_FILE"  # noqa: S105 - a variable name
MIXED = "mixed"


def _resolve(value: str) -> Path:
    """A path-valued bmc field as the loader left it (relative ones already made relative to
    the folder of cluster.yml), with ``~`` expanded."""
    return Path(os.path.expanduser(value))


def _private(path: Path, what: str) -> bytes:
    """Read a secret file; refused when others may read it (like ssh does for keys)."""
    try:
        st = path.stat()
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsageError(
                f"{what} {path}: mode {stat.S_IMODE(st.st_mode):04o}, group or others may read "
                f"it; chmod 600 {path}"
            )
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror or exc}") from None


def load_credentials(cluster_path: Path, cluster: Cluster) -> redfish.Credentials:
    """The BMC user and password, from the vault file or the environment (UsageError when they
    cannot be had; the message never holds a secret)."""
    spec = cluster.bmc.credentials
    if spec.vault_file is None:
        try:
            return redfish.Credentials.from_env(spec.username_env, spec.password_env)
        except redfish.RedfishError as exc:
            raise UsageError(f"bmc.credentials: {exc}") from None
    vault = _resolve(spec.vault_file)
    if spec.vault_password_file is not None:
        pw_file = _resolve(spec.vault_password_file)
    elif os.environ.get(VAULT_PASSWORD_ENV):
        pw_file = Path(os.path.expanduser(os.environ[VAULT_PASSWORD_ENV]))
    else:
        raise UsageError(
            "bmc.credentials.vault_file needs a vault password: set "
            f"bmc.credentials.vault_password_file or {VAULT_PASSWORD_ENV}"
        )
    return _from_vault(vault, pw_file)


def _from_vault(vault: Path, pw_file: Path) -> redfish.Credentials:
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import VaultLib, VaultSecret

    password = _private(pw_file, "vault password file").strip()
    if not password:
        raise UsageError(f"vault password file {pw_file} is empty")
    data = _private(vault, "BMC credentials vault file")
    lib = VaultLib([("default", VaultSecret(password))])
    if not lib.is_encrypted(data):
        raise UsageError(
            f"{vault}: not an Ansible Vault file (encrypt it: ansible-vault encrypt {vault})"
        )
    failure: str | None = None
    plain = b""
    try:
        plain = lib.decrypt(data)
    except AnsibleError:
        failure = f"{vault}: cannot decrypt it with the vault password in {pw_file}"
    if failure is not None:
        raise UsageError(failure)
    try:
        doc: Any = yaml.safe_load(plain)
    except yaml.YAMLError:
        doc = None  # the parser's message may quote the plain text: not shown
    if not isinstance(doc, dict) or not all(
        isinstance(doc.get(k), str) and doc.get(k) for k in ("username", "password")
    ):
        raise UsageError(f"{vault}: expected a YAML mapping with `username` and `password`")
    return redfish.Credentials(doc["username"], doc["password"])


def check_bmc_access(cluster_path: Path, cluster: Cluster, nodes: list[str]) -> redfish.Credentials:
    """Every node in scope has a BMC address, and the credentials can be had (UsageError)."""
    where = {n.name: n.bmc_address for n in cluster_nodes(cluster)}
    missing = [n for n in nodes if not where.get(n)]
    if missing:
        raise UsageError(
            f"no BMC address for {', '.join(missing)}: set node_groups[].bmc_addresses"
        )
    if cluster.bmc.ca_bundle is not None:
        ca = _resolve(cluster.bmc.ca_bundle)
        if not ca.is_file():
            raise UsageError(f"bmc.ca_bundle: {ca} is not a file")
    return load_credentials(cluster_path, cluster)


def bmc_url(address: str, port: int) -> str:
    try:
        host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        host = address
    return f"https://{host}" if port == 443 else f"https://{host}:{port}"


class BmcAccess:
    """Redfish clients for the nodes' BMCs and the component steps done through them."""

    def __init__(
        self,
        cluster_path: Path,
        cluster: Cluster,
        *,
        credentials: Callable[[], redfish.Credentials] | None = None,
        allow_plain_http: bool = False,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.cluster_path = cluster_path
        self.settings = cluster.bmc
        self.address = {n.name: n.bmc_address for n in cluster_nodes(cluster)}
        self._cluster = cluster
        self._credentials_fn = credentials
        self._credentials: redfish.Credentials | None = None
        self._plain = allow_plain_http
        self._clients: dict[str, redfish.RedfishClient] = {}
        self._lock = threading.Lock()
        self._wait_kwargs: dict[str, Any] = {}
        if clock is not None:
            self._wait_kwargs["clock"] = clock
        if sleep is not None:
            self._wait_kwargs["sleep"] = sleep

    def _creds(self) -> redfish.Credentials:
        with self._lock:
            if self._credentials is None:
                try:
                    self._credentials = (
                        self._credentials_fn()
                        if self._credentials_fn is not None
                        else load_credentials(self.cluster_path, self._cluster)
                    )
                except UsageError as exc:
                    raise BackendError(str(exc)) from None
            return self._credentials

    def client(self, node: str) -> redfish.RedfishClient:
        with self._lock:
            cached = self._clients.get(node)
        if cached is not None:
            return cached
        address = self.address.get(node)
        if not address:
            raise BackendError(f"{node}: no BMC address (node_groups[].bmc_addresses)")
        s = self.settings
        url = bmc_url(address, s.port)
        if self._plain:
            url = url.replace("https://", "http://", 1)
        endpoint = redfish.BmcEndpoint(
            url,
            verify_tls=s.verify_tls,
            ca_bundle=(str(_resolve(s.ca_bundle)) if s.ca_bundle is not None else None),
            allow_plain_http=self._plain,
        )
        client = redfish.RedfishClient(endpoint, self._creds(), timeout_s=s.request_timeout_s)
        with self._lock:
            return self._clients.setdefault(node, client)

    # -- versions --------------------------------------------------------------------------

    def gpu_versions(self, node: str) -> Versions:
        """The GPUs' firmware (FirmwareInventory members with the prefix): one version when all
        agree, ``mixed: a, b`` when they do not (then not the target: it is applied again)."""
        items = self._gpu_items(node)
        found = sorted({i.version for i in items if i.version is not None})
        if any(i.version is None for i in items):
            no_version = ", ".join(i.id for i in items if i.version is None)
            raise BackendError(f"{node}: BMC reports no Version for {no_version}")
        running = found[0] if len(found) == 1 else f"{MIXED}: {', '.join(found)}"
        return Versions(running=running, pending=None, pending_known=False)

    def _gpu_items(self, node: str) -> list[redfish.SoftwareInventory]:
        prefix = self.settings.gpu_inventory_prefix
        inventory = redfish.firmware_inventory(self.client(node))
        items = [i for i in inventory if i.id.startswith(prefix)]
        if not items:
            raise BackendError(
                f"{node}: the BMC's FirmwareInventory has no member starting with {prefix} "
                "(bmc.gpu_inventory_prefix)"
            )
        return items

    def bmc_versions(self, node: str) -> Versions:
        return redfish.bmc_versions(self.client(node), self.settings.manager_id)

    # -- updates ---------------------------------------------------------------------------

    def update_gpus(self, node: str, image: Path) -> None:
        client = self.client(node)
        targets = [i.odata_id for i in self._gpu_items(node)]
        task = redfish.multipart_update(client, image, targets=targets)
        self._wait(client, task)

    def update_bmc(self, node: str, image: Path) -> None:
        client = self.client(node)
        targets: list[str] = []
        if self.settings.bmc_inventory_id is not None:
            wanted = self.settings.bmc_inventory_id
            found = [i for i in redfish.firmware_inventory(client) if i.id == wanted]
            if not found:
                raise BackendError(f"{node}: FirmwareInventory has no {wanted} (bmc_inventory_id)")
            targets = [found[0].odata_id]
        task = redfish.multipart_update(client, image, targets=targets, apply_time="Immediate")
        self._wait(client, task)

    def _wait(self, client: redfish.RedfishClient, task: redfish.TaskRef | None) -> None:
        if task is None:
            return
        redfish.wait_for_task(
            client, task, timeout_s=float(self.settings.update_timeout_s), **self._wait_kwargs
        )

    def power_cycle(self, node: str) -> None:
        """``ComputerSystem.Reset`` with ``bmc.power_cycle``; returns once it is accepted."""
        client = self.client(node)
        system = self.settings.system_id or self._only_system(client)
        redfish.reset_system(client, system, self.settings.power_cycle)

    def _only_system(self, client: redfish.RedfishClient) -> str:
        members = redfish.collection_members(client, f"{redfish.SERVICE_ROOT}/Systems")
        if len(members) != 1:
            raise BackendError(
                client.redact(
                    f"{client.endpoint.url}: {len(members)} systems "
                    f"({', '.join(members) or 'none'}): set bmc.system_id"
                )
            )
        return members[0].rstrip("/").rsplit("/", 1)[-1]
