"""The rollout backend for a real cluster: Slurm through ``scontrol``/``squeue`` on the
controller, the nodes over SSH (the same paramiko transport and host key rules as
`gpuctl validate`), the vendor tools of :mod:`gpuctl.rollout.tools`, validation through
:func:`gpuctl.validation.api.validate`.

Components this backend can apply:

- ``nic-firmware``: the image (a local file, ``--image``) is copied to the node
  (``/var/tmp/gpuctl-rollout/``, mode 0600, its SHA-256 checked on the node), burned with
  ``mlxfwmanager -u -i IMAGE -y`` and loaded by the reboot that follows.
- ``driver``: `gpuctl provision --limit NODE --tags preflight_versions,nvidia_driver,
  fabric_manager` (:data:`DRIVER_TAGS`: the preflight role's version gate first, as a full
  `gpuctl provision` runs it, so a driver that the compatibility rules refuse is never
  installed) with cluster.yml's pinned version, which must be the rollout's target (one source
  of truth: a rollout never installs a version that a later `gpuctl provision` would undo).

- ``gpu-firmware`` and ``bmc-firmware``: through the node's BMC over Redfish
  (:mod:`gpuctl.rollout.bmc`): the package (``--image``) is pushed to the BMC, GPU firmware is
  activated by a power cycle (``ComputerSystem.Reset``), BMC firmware by the BMC's own reset.
  Every node in scope needs ``bmc_addresses`` and the credentials must load, checked up front
  (:func:`check_supported`) instead of failing node after node.

Nothing here logs or returns credentials; the SSH key path stays in the SSH settings.
"""

from __future__ import annotations

import contextlib
import hashlib
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpuctl.config.derived import nodes as cluster_nodes
from gpuctl.config.model import Cluster
from gpuctl.errors import UsageError
from gpuctl.remote import Connector, ExecResult, LinkSession, Target, Unreachable, connect
from gpuctl.remote.ssh import ParamikoConnector, ssh_settings
from gpuctl.rollout import tools
from gpuctl.rollout.backend import BackendError, ValidationOutcome, Versions
from gpuctl.rollout.bmc import BmcAccess, check_bmc_access
from gpuctl.rollout.model import Component, Restart
from gpuctl.slurm import (
    NotUnderstood,
    SlurmNode,
    failure_text,
    read_nodes,
    show_argv,
    update_argv,
)

REMOTE_DIR = "/var/tmp/gpuctl-rollout"  # noqa: S108 - root-owned dir made 0700 on the node
COMMAND_TIMEOUT_S = 120
FLASH_TIMEOUT_S = 1800  # mlxfwmanager burns one image per adapter; minutes each
BOOT_ID = "/proc/sys/kernel/random/boot_id"
IMAGE_COMPONENTS = (Component.NIC_FIRMWARE, Component.GPU_FIRMWARE, Component.BMC_FIRMWARE)
BMC_COMPONENTS = (Component.GPU_FIRMWARE, Component.BMC_FIRMWARE)


def check_supported(
    cluster_path: Path,
    cluster: Cluster,
    component: Component,
    target: str,
    image: Path | None,
    nodes: Sequence[str],
) -> None:
    """Refuse what this backend cannot do before anything is touched (UsageError, exit 2)."""
    if component in IMAGE_COMPONENTS:
        if image is None:
            raise UsageError(f"{component}: give the firmware image with --image FILE")
        if not image.is_file():
            raise UsageError(f"--image: {image} is not a file")
    elif image is not None:
        raise UsageError(f"--image applies to firmware components, not {component}")
    if component in BMC_COMPONENTS:
        check_bmc_access(cluster_path, cluster, list(nodes))
    if component is Component.DRIVER and cluster.software.driver.version != target:
        raise UsageError(
            f"driver: --to {target} but cluster.yml pins software.driver.version "
            f"{cluster.software.driver.version}; set it to {target} first (gpuctl provision "
            "and the rollout install the version cluster.yml pins)"
        )


@dataclass(frozen=True, slots=True)
class Probe:
    """What one command printed (for messages)."""

    host: str
    argv: tuple[str, ...]
    result: ExecResult

    @property
    def ok(self) -> bool:
        r = self.result
        return r.rc == 0 and r.error is None and not r.timed_out

    @property
    def stdout(self) -> str:
        return self.result.stdout.decode("utf-8", errors="replace")

    def failure(self) -> str:
        r = self.result
        why = "timed out" if r.timed_out else r.error
        return failure_text(f"{shlex.join(self.argv[:3])} on {self.host}", r.rc, r.stderr, why)


ProvisionFn = Callable[[str], str | None]  # node -> None on success, else why it failed
ValidateFn = Callable[[str, str], ValidationOutcome]  # (node, level) -> outcome


class ClusterBackend:
    """:class:`gpuctl.rollout.backend.Backend` for a cluster described by cluster.yml."""

    def __init__(
        self,
        cluster_path: Path,
        cluster: Cluster,
        *,
        image: Path | None = None,
        provision_fn: ProvisionFn | None = None,
        validate_fn: ValidateFn | None = None,
        connector: Connector | None = None,
        bmc: BmcAccess | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleeper: Callable[[float], None] = time.sleep,
    ) -> None:
        self.cluster_path = cluster_path
        self.cluster = cluster
        self.image = image
        self._image_sha = sha256_of(image) if image is not None else None
        self.controller = cluster.slurm.controller
        self.address = {n.name: n.address or n.name for n in cluster_nodes(cluster)}
        self.become = False
        if connector is None:
            settings = ssh_settings(cluster)
            self.become = settings.become
            connector = ParamikoConnector(settings)
        self.connector = connector
        self.bmc = bmc if bmc is not None else BmcAccess(cluster_path, cluster)
        self._provision = provision_fn
        self._validate = validate_fn
        self._clock = clock
        self._sleeper = sleeper
        self._sessions: dict[str, LinkSession] = {}
        self._host_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._provision_lock = threading.Lock()
        self._boot_ids: dict[str, str] = {}

    # -- transport -----------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            with contextlib.suppress(Exception):
                s.close()
        with contextlib.suppress(Exception):
            self.connector.close()

    def _host_lock(self, host: str) -> threading.Lock:
        with self._lock:
            return self._host_locks.setdefault(host, threading.Lock())

    def _session(self, host: str) -> LinkSession:
        with self._lock:
            cached = self._sessions.get(host)
        if cached is not None:
            return cached
        try:
            target = Target(host, self.address.get(host, host))
            session = connect(self.connector, target, become=self.become)
        except Unreachable as exc:
            raise BackendError(f"cannot reach {host}: {exc.reason}") from None
        with self._lock:
            self._sessions[host] = session
        return session

    def _forget(self, host: str) -> None:
        with self._lock:
            session = self._sessions.pop(host, None)
        if session is not None:
            with contextlib.suppress(Exception):
                session.close()

    def run(self, host: str, argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> Probe:
        """Run ``argv`` on ``host`` (sudo when the SSH user is not root); a lost connection is
        retried once on a fresh one (a node that rebooted keeps no session)."""
        with self._host_lock(host):
            for attempt in (1, 2):
                session = self._session(host)
                res = session.run(argv, timeout_s)
                if res.error is not None and res.rc is None and attempt == 1:
                    self._forget(host)
                    continue
                return Probe(host, tuple(argv), res)
        raise AssertionError("unreachable")  # pragma: no cover

    def _checked(self, host: str, argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        probe = self.run(host, argv, timeout_s)
        if not probe.ok:
            raise BackendError(probe.failure())
        return probe.stdout

    # -- Slurm ---------------------------------------------------------------------------

    def slurm_node(self, node: str) -> SlurmNode:
        text = self._checked(self.controller, show_argv(node))
        try:
            record = read_nodes(text).get(node)
        except NotUnderstood as exc:
            raise BackendError(
                f"scontrol show node {node}: output not understood ({exc})"
            ) from None
        if record is None:
            raise BackendError(f"Slurm does not know {node} (scontrol show node {node})")
        return SlurmNode.from_record(record)

    def _update(self, node: str, state: Literal["drain", "resume"], reason: str | None) -> None:
        try:
            argv = update_argv(node, state, reason)
        except ValueError as exc:
            raise BackendError(str(exc)) from None
        self._checked(self.controller, argv)

    def drain(self, node: str, reason: str) -> None:
        self._update(node, "drain", reason)

    def resume(self, node: str) -> None:
        self._update(node, "resume", None)

    def jobs_on(self, node: str) -> int:
        # running, completing and suspended jobs all hold the node (squeue(1) --states)
        argv = ["squeue", "--noheader", f"--nodelist={node}", "--states=R,CG,S", "--format=%A"]
        text = self._checked(self.controller, argv)
        ids = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if any(not i.isdigit() for i in ids):
            raise BackendError(f"squeue on {self.controller}: unexpected output {text[:120]!r}")
        return len(ids)

    # -- versions and updates ------------------------------------------------------------

    def versions(self, node: str, component: Component) -> Versions:
        if component is Component.NIC_FIRMWARE:
            probe = self.run(node, tools.nic_query_argv())
            if not probe.ok:
                raise BackendError(probe.failure())
            return tools.nic_versions(tools.parse_mlxfwmanager_query(probe.stdout))
        if component is Component.DRIVER:
            smi = self.run(node, tools.driver_running_argv())
            if smi.result.error is not None or smi.result.timed_out:
                raise BackendError(smi.failure())
            running = tools.parse_driver_running(smi.stdout, smi.result.rc or 0)
            installed = self._driver_installed(node)
            return Versions(running=running, pending=installed if installed != running else None)
        if component is Component.GPU_FIRMWARE:
            return self.bmc.gpu_versions(node)
        if component is Component.BMC_FIRMWARE:
            return self.bmc.bmc_versions(node)
        raise BackendError(f"{component}: not supported by this backend")

    def _driver_installed(self, node: str) -> str:
        """The installed driver packages' version: dpkg-query, or rpm where there is no dpkg
        (exit 127 under `timeout`: command not found). The packages every flavour installs
        (nvidia_driver role, vars/<OS>.yml)."""
        for family, pkgs in (
            ("deb", ["nvidia-driver", "nvidia-smi"]),
            ("rpm", ["nvidia-driver-cuda"]),
        ):
            fam: tools.PackageFamily = "deb" if family == "deb" else "rpm"
            probe = self.run(node, tools.driver_installed_argv(pkgs, fam))
            if probe.result.rc == 127:
                continue
            if probe.result.error is not None or probe.result.timed_out:
                raise BackendError(probe.failure())
            return tools.parse_driver_installed(probe.stdout, probe.result.rc or 0, pkgs, fam)
        raise BackendError(f"{node}: neither dpkg-query nor rpm is there")

    def apply(self, node: str, component: Component, version: str) -> None:
        if component is Component.NIC_FIRMWARE:
            remote = self._upload_image(node)
            probe = self.run(node, tools.nic_update_argv(remote), FLASH_TIMEOUT_S)
            if probe.result.error is not None or probe.result.timed_out:
                raise BackendError(probe.failure())
            tools.parse_mlxfwmanager_update(probe.stdout, probe.result.rc or 0)
            return
        if component is Component.DRIVER:
            if self._provision is None:
                raise BackendError("driver: no provisioning run configured")
            with self._provision_lock:  # one provisioning run per cluster at a time
                why = self._provision(node)
            if why is not None:
                raise BackendError(f"driver: gpuctl provision of {node}: {why}")
            return
        if component in BMC_COMPONENTS:
            if self.image is None:
                raise BackendError(f"{component}: no image given")
            if component is Component.GPU_FIRMWARE:
                self.bmc.update_gpus(node, self.image)
            else:
                self.bmc.update_bmc(node, self.image)
            return
        raise BackendError(f"{component}: not supported by this backend")

    def _upload_image(self, node: str) -> str:
        if self.image is None or self._image_sha is None:
            raise BackendError("nic-firmware: no image given")
        remote = f"{REMOTE_DIR}/{self._image_sha[:16]}-{self.image.name}"
        have = self.run(node, ["sha256sum", "--", remote])
        if have.ok and have.stdout.split()[:1] == [self._image_sha]:
            return remote
        self._checked(node, ["install", "-d", "-m", "0700", REMOTE_DIR])
        data = self.image.read_bytes()
        self._put(node, remote, data)
        got = self._checked(node, ["sha256sum", "--", remote]).split()[:1]
        if got != [self._image_sha]:
            raise BackendError(f"{node}: the copied image's SHA-256 does not match {self.image}")
        return remote

    def _put(self, node: str, remote: str, data: bytes) -> None:
        """Copy over SFTP: straight to ``remote`` as root; as another user (sudo) to the login's
        home first, then moved into place by root."""
        session = self._session(node)
        staging = f"{remote}.part" if not self.become else f"gpuctl-upload-{self._image_sha}"
        try:
            staging = session.put(data, staging)
        except OSError as exc:
            raise BackendError(f"{node}: copying {self.image} failed: {exc}") from None
        self._checked(node, ["mv", "-f", "--", staging, remote])
        self._checked(node, ["chown", "root:root", "--", remote])

    # -- restart -------------------------------------------------------------------------

    def restart(self, node: str, kind: Restart) -> None:
        if kind is Restart.NONE:
            return
        if kind is Restart.POWER_CYCLE:
            # the boot id tells wait_up the cycle happened; a node whose OS does not answer
            # is power cycled all the same (then "back" means reachable again)
            try:
                self._boot_ids[node] = self._checked(node, ["cat", BOOT_ID], 15).strip()
            except BackendError:
                self._boot_ids.pop(node, None)
            self.bmc.power_cycle(node)
            self._forget(node)
            return
        self._boot_ids[node] = self._checked(node, ["cat", BOOT_ID]).strip()
        # the reboot ends the connection: its exit status is not awaited; wait_up checks the
        # boot id changed
        self.run(node, ["systemctl", "reboot"], 30)
        self._forget(node)

    def wait_up(self, node: str, timeout_s: float) -> bool:
        """Back = reachable over SSH with a boot id other than before the reboot (when this
        process issued it), and ``systemctl is-system-running --wait`` done booting."""
        deadline = self._clock() + timeout_s
        before = self._boot_ids.get(node)
        while self._clock() < deadline:
            try:
                boot = self._checked(node, ["cat", BOOT_ID], 15).strip()
                if before is None or boot != before:
                    self.run(node, ["systemctl", "is-system-running", "--wait"], 120)
                    self._boot_ids.pop(node, None)
                    return True
            except BackendError:
                self._forget(node)
            self._sleeper(min(5.0, max(0.0, deadline - self._clock())))
        return False

    # -- validation, clock ---------------------------------------------------------------

    def validate(self, node: str, level: str) -> ValidationOutcome:
        if self._validate is None:
            raise BackendError("no validation configured")
        return self._validate(node, level)

    def now(self) -> float:
        return self._clock()

    def sleep(self, seconds: float) -> None:
        self._sleeper(seconds)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def validate_with_gpuctl(cluster: Cluster, out_root: Path) -> ValidateFn:
    """`gpuctl validate --limit NODE --level LEVEL` of the loaded ``cluster`` (read once per
    rollout) into ``out_root/<node>-<n>``: passed when the node has no failed check; the reason
    names the failed checks."""
    from gpuctl.validation.api import validate
    from gpuctl.validation.reports.drain import drain_reason

    counter = {"n": 0}
    lock = threading.Lock()

    def run(node: str, level: str) -> ValidationOutcome:
        with lock:
            counter["n"] += 1
            out = out_root / f"{node}-{time.strftime('%Y%m%dT%H%M%S')}-{counter['n']}"
        try:
            # ib_write_bw partners outside the node: never one of its batch (being updated too)
            result = validate(
                cluster,
                level=level,
                limit=node,
                out=out,
                exclude=_batch_of(out_root.parent, node),
                history=_history_of(out_root),
            )
        except Exception as exc:  # the validation could not run: fail closed
            return ValidationOutcome(False, f"validation could not run: {exc}")
        verdicts = [n for n in result.report.nodes if n.node == node]
        if not verdicts:
            return ValidationOutcome(False, "validation returned no verdict for the node")
        if verdicts[0].failed:
            return ValidationOutcome(False, drain_reason(verdicts[0], level) or "validation failed")
        return ValidationOutcome(True, f"validation {level} passed ({out.name})")

    return run


def _batch_of(rollout_dir: Path, node: str) -> frozenset[str]:
    """The nodes of ``node``'s batch in the rollout kept in ``rollout_dir`` (``node`` alone
    when its plan cannot be read: then Slurm's drains keep the batch out, as the executor
    drains each node before it updates it)."""
    from gpuctl.rollout.store import RolloutStore

    try:
        batches = RolloutStore(rollout_dir).load().plan.batches
    except Exception:  # no state (tests, a hand-made backend): the drains decide
        return frozenset({node})
    return next((frozenset(b) for b in batches if node in b), frozenset({node}))


def _history_of(out_root: Path) -> Path | None:
    """The validation history of the state dir that holds the rollout (``<state dir>/rollouts/
    <id>/validate``), None elsewhere."""
    from gpuctl.validation.history import history_path

    rollouts = out_root.parent.parent
    return history_path(rollouts.parent) if rollouts.name == "rollouts" else None


# The driver component's provisioning: the version gate (playbooks/roles/preflight/tasks/
# main.yml, tag preflight_versions: the compatibility rules of the whole version set), then
# the driver and Fabric Manager roles. The gate is pure evaluation on the controller; a refused
# version set fails the run before any package changes.
DRIVER_TAGS = "preflight_versions,nvidia_driver,fabric_manager"


def provision_with_gpuctl(cluster: Cluster, cluster_path: Path, state_dir: Path) -> ProvisionFn:
    """The driver's update: the version gate, then the nvidia_driver and fabric_manager roles
    on one node (:data:`DRIVER_TAGS`; runs under ``state_dir``, the loaded ``cluster`` rendered
    once per node)."""
    from gpuctl.provision import provision

    def run(node: str) -> str | None:
        try:
            result = provision(
                cluster,
                cluster_file=cluster_path,
                limit=node,
                tags=DRIVER_TAGS,
                state_dir=state_dir,
            )
        except Exception as exc:
            return str(exc)
        if result.success:
            return None
        return f"run {result.run_id} {result.record.status} (gpuctl logs {result.run_id})"

    return run
