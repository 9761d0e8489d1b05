"""`gpuctl lab`: bring a cluster of systemd-nspawn nodes up and down (library side).

Layout (``GPUCTL_LAB_DIR``, default /var/lib/gpuctl-lab):

- ``base/``: the cached Debian 12 root (debootstrap), never changed while nodes use it
- ``nodes/<name>/{upper,work,root}``: each node's overlay (its own writable disk) and mount
- ``run/<name>.pid``, ``run/<name>.nspawn``, ``run/<name>.log``: supervisor, nspawn, console
- ``ssh/id_ed25519``, ``ssh/known_hosts``: the lab's key and the nodes' recorded host keys
- ``cluster.yml``: the running lab as gpuctl sees it; ``lab.json``: what `down` must remove
- ``repo/``: the lab's package repository (stand-ins under NVIDIA's names, see repo.py)
- ``wheelhouse/``: gpuctl's wheel and what its node check needs (gpuctl/provision/wheelhouse.py),
  for ``package_sources.gpuctl_wheelhouse`` of the lab's cluster.yml
- ``apt-cache/``: the apt proxy's cache (apt-cacher-ng), ``apt-proxy/acng.conf`` its config;
  kept by `down`, like ``base/``
- ``run/apt-proxy.{pid,log}``, ``run/repo-http.{pid,log}``: the two package servers
- ``bmc/``: the SIMULATED BMCs' CA, certificate and Ansible Vault credentials (kept by `down`)
  and their state (``bmc/state``, removed by `down`); ``run/bmc.{pid,log,json}``: their server
  (gpuctl/lab/sim/bmc/), one HTTPS Redfish service per GPU node on its ``bmc_addresses`` address
  (198.18.1.x/32 on the bridge, reachable from this host only)

Network: a bridge ``gpuctl-br0`` holding 198.18.0.1/24 (RFC 2544 benchmarking range, routed
nowhere), one network namespace ``gpuctl-<node>`` per node with a veth pair, no default route.
Packages reach the nodes only over the bridge: Debian's through the apt proxy on
198.18.0.1:3142, the lab repository's from 198.18.0.1:8081 (both bound to the bridge address).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ClusterShell.NodeSet import NodeSet

from gpuctl.config.derived import nodes as cluster_nodes
from gpuctl.config.loader import load_cluster_text
from gpuctl.lab import cluster_text, repo, slurm_repo, supervisor
from gpuctl.lab.cluster_text import DEFAULT_OS as DEFAULT_OS
from gpuctl.lab.cluster_text import DEFAULT_PROFILE as DEFAULT_PROFILE
from gpuctl.lab.cluster_text import OS_RELEASES as OS_RELEASES
from gpuctl.lab.cluster_text import parse_profiles as parse_profiles
from gpuctl.lab.sim import bmc
from gpuctl.lab.sim import faults as sim_faults
from gpuctl.lab.sim import kernel as sim_kernel
from gpuctl.lab.sim import profiles as sim_profiles
from gpuctl.lab.sim import sysroot as sim_sysroot
from gpuctl.lab.system import LabError, require_root, run, wheelhouse_dir
from gpuctl.lab.system import lab_dir as lab_dir
from gpuctl.lab.system import run_dir as _run_dir
from gpuctl.provision import wheelhouse

BRIDGE = "gpuctl-br0"
HOST_ADDRESS = "198.18.0.1"
PREFIX = 24
# python3-apt: Ansible's apt module needs it for check mode (Debian and Ubuntu servers ship it)
BASE_PACKAGES = (
    "openssh-server,python3,python3-apt,iproute2,sudo,systemd,systemd-sysv,dbus,iputils-ping"
)
DEBIAN_MIRROR = os.environ.get("GPUCTL_LAB_MIRROR", "http://deb.debian.org/debian")
BOOT_TIMEOUT_S = 120


@dataclass(frozen=True, slots=True)
class LabNode:
    name: str
    address: str
    roles: tuple[str, ...]
    state: str  # running | stopped


@dataclass(frozen=True, slots=True)
class LabStatus:
    nodes: tuple[LabNode, ...]
    cluster_yml: Path | None

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": [
                {"name": n.name, "address": n.address, "state": n.state, "roles": list(n.roles)}
                for n in self.nodes
            ],
            "cluster_yml": str(self.cluster_yml) if self.cluster_yml else None,
        }


@dataclass(frozen=True, slots=True)
class UpResult:
    status: LabStatus
    started: tuple[str, ...]
    base_built: bool
    seconds: float


# ------------------------------------------------------------------------------------------
# Base image


def base_dir(os_name: str = DEFAULT_OS) -> Path:
    """The cached root of one node OS (Debian 12's keeps its old name, ``base``)."""
    return lab_dir() / ("base" if os_name == DEFAULT_OS else f"base-{os_name}")


def ensure_base(os_name: str = DEFAULT_OS) -> bool:
    """Build the cached base root of ``os_name`` once; True when it was built now."""
    base = base_dir(os_name)
    stamp = base / ".gpuctl-base-ok"
    if stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == BASE_PACKAGES:
        return False
    tmp = base.with_name(base.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    lab_dir().mkdir(parents=True, exist_ok=True)
    run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={BASE_PACKAGES}",
            OS_RELEASES[os_name],
            str(tmp),
            DEBIAN_MIRROR,
        ],
        timeout=900,
    )
    # every node must get its own SSH host keys and machine id
    for key in (tmp / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    (tmp / "etc" / "machine-id").write_text("", encoding="utf-8")
    run(["chroot", str(tmp), "apt-get", "clean"], timeout=120)
    (tmp / ".gpuctl-base-ok").write_text(BASE_PACKAGES + "\n", encoding="utf-8")
    shutil.rmtree(base, ignore_errors=True)
    tmp.rename(base)  # a whole directory, swapped in by one rename (write_atomic is for files)
    return True


# ------------------------------------------------------------------------------------------
# Network


def _link_exists(name: str) -> bool:
    return run(["ip", "link", "show", "dev", name], check=False).rc == 0


def _netns_exists(name: str) -> bool:
    return name in run(["ip", "netns", "list"], check=False).stdout.split()


def ensure_bridge() -> None:
    if not _link_exists(BRIDGE):
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        run(["ip", "addr", "add", f"{HOST_ADDRESS}/{PREFIX}", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


def _veth(name: str) -> str:
    return f"gl-{name}"[:15]


def ensure_node_network(name: str, address: str) -> None:
    ns = supervisor.netns_name(name)
    if not _netns_exists(ns):
        run(["ip", "netns", "add", ns])
    if not _link_exists(_veth(name)):
        run(["ip", "link", "add", _veth(name), "type", "veth", "peer", "name", "eth0", "netns", ns])
        run(["ip", "-n", ns, "addr", "add", f"{address}/{PREFIX}", "dev", "eth0"])
    run(["ip", "link", "set", _veth(name), "master", BRIDGE, "up"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    run(["ip", "-n", ns, "link", "set", "eth0", "up"])


# ------------------------------------------------------------------------------------------
# Node roots


def _node_dir(name: str) -> Path:
    return lab_dir() / "nodes" / name


def _mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        return any(line.split()[1] == target for line in fh if len(line.split()) > 1)


def prepare_root(
    name: str, hosts: list[tuple[str, str]], pubkey: str, os_name: str = DEFAULT_OS
) -> Path:
    d = _node_dir(name)
    root = d / "root"
    for sub in ("upper", "work", "root"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    if not _mounted(root):
        run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={base_dir(os_name)},upperdir={d / 'upper'},workdir={d / 'work'}",
                str(root),
            ]
        )
    (root / "etc" / "hostname").write_text(f"{name}\n", encoding="utf-8")
    lines = ["127.0.0.1 localhost", f"127.0.1.1 {name}"] + [f"{a} {n}" for n, a in hosts]
    (root / "etc" / "hosts").write_text("\n".join(lines) + "\n", encoding="utf-8")
    ssh_dir = root / "root" / ".ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(ssh_dir, 0o700)
    keys = ssh_dir / "authorized_keys"
    keys.write_text(pubkey, encoding="utf-8")
    os.chmod(keys, 0o600)
    (root / "var" / "log" / "journal").mkdir(parents=True, exist_ok=True)  # persistent journal
    _install_kernel_boot_log(root)
    if not (root / "etc" / "ssh" / "ssh_host_ed25519_key").exists():
        run(["chroot", str(root), "ssh-keygen", "-A"])
    return root


# A container has no kernel log of its own. At every boot this unit puts the first lines a
# booting kernel logs into the node's journal under the kernel's identifier, so that
# `journalctl -t kernel -b` on a healthy node shows this boot's kernel log, as on a real node
# (an empty answer means a journal that does not see the kernel; gpuctl validate fails it).
KERNEL_BOOT_UNIT = "gpuctl-lab-kernel-boot.service"
_KERNEL_BOOT_LINES = (
    "Linux version 6.1.0-31-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14) "
    "12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian 6.1.128-1",
    "Command line: BOOT_IMAGE=/boot/vmlinuz-6.1.0-31-amd64 root=/dev/sda1 ro quiet iommu=pt",
    # the IOMMU mode a GPU node should boot with (gpuctl validate's pcie.iommu); 5.x/6.x print it
    # as tests/fixtures/kernel-xid/dmesg-grep-iommu-passthrough-cmdline-amd-vi-5.4.txt shows
    "iommu: Default domain type: Passthrough (set via kernel command line)",
)


def _install_kernel_boot_log(root: Path) -> None:
    units = root / "etc" / "systemd" / "system"
    lines = "".join(
        f'ExecStart=-/usr/bin/logger -t kernel -- "{line}"\n' for line in _KERNEL_BOOT_LINES
    )
    (units / "multi-user.target.wants").mkdir(parents=True, exist_ok=True)
    (units / KERNEL_BOOT_UNIT).write_text(
        "[Unit]\n"
        "Description=gpuctl lab: the kernel's boot lines in the journal (no kernel log in a "
        "container)\n"
        "After=systemd-journald.service\n\n"
        "[Service]\n"
        "Type=oneshot\n"
        f"{lines}\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n",
        encoding="utf-8",
    )
    link = units / "multi-user.target.wants" / KERNEL_BOOT_UNIT
    if not link.is_symlink():
        link.symlink_to(f"../{KERNEL_BOOT_UNIT}")


def host_key(name: str) -> str:
    pub = _node_dir(name) / "root" / "etc" / "ssh" / "ssh_host_ed25519_key.pub"
    parts = pub.read_text(encoding="utf-8").split()
    return f"{parts[0]} {parts[1]}"


# ------------------------------------------------------------------------------------------
# Processes


def node_running(name: str) -> bool:
    return supervisor.live_pid(_run_dir() / f"{name}.pid") is not None


def start_node(name: str) -> None:
    supervisor.start(name, _node_dir(name) / "root", _run_dir())


def stop_node(name: str, timeout: float = 30) -> None:
    pidfile = _run_dir() / f"{name}.pid"
    pid = supervisor.live_pid(pidfile)
    nspawn = supervisor.live_pid(pidfile.with_suffix(".nspawn"))
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (supervisor.alive(pid) or supervisor.alive(nspawn)):
        time.sleep(0.2)
    for leftover in (nspawn, pid):
        if supervisor.alive(leftover):
            os.kill(leftover, signal.SIGKILL)  # type: ignore[arg-type]
    pidfile.unlink(missing_ok=True)
    pidfile.with_suffix(".nspawn").unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------
# SSH


def ssh_key() -> Path:
    key = lab_dir() / "ssh" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuctl-lab", "-f", str(key)])
    return key


def known_hosts() -> Path:
    return lab_dir() / "ssh" / "known_hosts"


def ssh_argv(address: str, command: list[str] | None = None, *, tty: bool = False) -> list[str]:
    argv = [
        "ssh",
        "-i",
        str(ssh_key()),
        "-o",
        f"UserKnownHostsFile={known_hosts()}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "LogLevel=ERROR",
    ]
    if tty:
        argv.append("-t")
    argv.append(f"root@{address}")
    if command:
        argv += ["--", *command]
    return argv


def wait_running(name: str, address: str, timeout: float = BOOT_TIMEOUT_S) -> str:
    """Wait until SSH answers and systemd reports `running`; return the node's boot id."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if not node_running(name):
            raise LabError(f"{name} stopped while booting (see {_run_dir()}/{name}.log)")
        res = run(
            ssh_argv(
                address,
                [
                    "systemctl",
                    "is-system-running",
                    "--wait",
                    ";",
                    "cat",
                    "/proc/sys/kernel/random/boot_id",
                ],
            ),
            check=False,
            timeout=60,
        )
        last = (res.stdout + res.stderr).strip()
        lines = res.stdout.split()
        if len(lines) >= 2 and lines[0] in ("running", "degraded"):
            return lines[-1]
        time.sleep(1)
    raise LabError(f"{name} did not become ready in {timeout:g} s: {last[-200:]}")


# ------------------------------------------------------------------------------------------
# The commands


def _state_file() -> Path:
    return lab_dir() / "lab.json"


def _load_state() -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(_state_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data


def profile_names() -> list[str]:
    """The hardware profiles a lab node can have (gpuctl/lab/profiles/<name>.yml)."""
    return sim_profiles.names()


def lab_cluster_text(
    compute_nodes: int,
    profile: str,
    os_name: str = DEFAULT_OS,
    groups: list[tuple[str, int]] | None = None,
) -> str:
    """The running lab's cluster.yml (cluster_text.py), with this lab's key and known_hosts."""
    return cluster_text.lab_cluster_text(
        compute_nodes, profile, os_name, groups, key=ssh_key(), known_hosts=known_hosts()
    )


def _write_hardware(name: str, profile: str) -> None:
    """The simulated hardware of a GPU node: read by its stand-in tools (JSON: the node has only
    python3's standard library)."""
    target = _node_dir(name) / "root" / "etc" / "gpuctl-lab" / "hardware.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(sim_profiles.profile_json(profile), encoding="utf-8")
    # RoCE ports: a simulated sysfs for the QoS script, and the lab-only files that point it there
    hardware = sim_profiles.load(profile)
    sim_sysroot.write(_node_dir(name) / "root", hardware)
    if sim_sysroot.roce_ports(hardware):
        # their hw counters (`rdma statistic`): a lab-only launcher before iproute2's
        # /usr/bin/rdma in PATH, which finds no RDMA device in a container
        rdma = _node_dir(name) / "root" / RDMA_STANDIN.lstrip("/")
        rdma.parent.mkdir(parents=True, exist_ok=True)
        rdma.write_text(repo.standin_launcher("rdma"), encoding="utf-8")
        rdma.chmod(0o755)


RDMA_STANDIN = "/usr/local/bin/rdma"


FIRMWARE_COMPONENTS = ("nic-firmware", bmc.GPU_COMPONENT, bmc.BMC_COMPONENT)


def firmware_image(node: str, version: str, out: Path, component: str = "nic-firmware") -> str:
    """Write a lab-only firmware image carrying ``version``; returns what it is built for.

    ``nic-firmware``: a ConnectX image for ``node``'s simulated adapters (their PSID, returned;
    the format of gpuctl/lab/sim/mft.py; a real image is a binary .bin/.mfa).
    ``gpu-firmware``: a package for ``node``'s GPU model (returned), ``bmc-firmware``: a BMC
    package (``node`` unused; returns ""), both taken by the lab's simulated BMCs only
    (gpuctl/lab/sim/bmc/; a real one is a PLDM .fwpkg)."""
    if component not in FIRMWARE_COMPONENTS:
        raise LabError(f"unknown component {component!r}: {', '.join(FIRMWARE_COMPONENTS)}")
    hardware = _node_dir(node) / "root" / "etc" / "gpuctl-lab" / "hardware.json"
    if component == bmc.BMC_COMPONENT:
        try:
            bmc.write_package(out, component, version)
        except bmc.PackageError as exc:
            raise LabError(str(exc)) from None
        return ""
    try:
        profile = json.loads(hardware.read_text(encoding="utf-8"))
        target = str(
            profile["model"] if component == bmc.GPU_COMPONENT else profile["nics"]["board_id"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        what = "GPUs" if component == bmc.GPU_COMPONENT else "adapters"
        raise LabError(f"{node}: no simulated {what} (is the lab up, is it a GPU node?)") from None
    if component == bmc.GPU_COMPONENT:
        try:
            bmc.write_package(out, component, version, target)
        except bmc.PackageError as exc:
            raise LabError(str(exc)) from None
        return target
    from gpuctl.lab.sim import mft as sim_mft

    out.parent.mkdir(parents=True, exist_ok=True)
    sim_mft.write_image(str(out), target, version)
    return target


def _faults_file(name: str) -> Path:
    return _node_dir(name) / "root" / "var" / "lib" / "gpuctl-lab-sim" / "faults.json"


def faults_of(name: str) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(_faults_file(name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data


def inject_fault(name: str, fault: str, value: str = "") -> dict[str, Any]:
    """Add a fault to a node's simulated hardware; it lives on the node's disk (survives reboot)."""
    require_root()
    address_of(name)
    try:
        faults = dict(sim_faults.apply(faults_of(name), fault, value))
        problem = _hardware_problem(name, fault, sim_faults.parse_value(fault, value))
    except sim_faults.FaultError as exc:
        raise LabError(str(exc)) from None
    if problem is not None:  # it would change nothing: the next validation would pass
        raise LabError(problem)
    before = faults_of(name)
    path = _faults_file(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(faults, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    _log_kernel_lines(name, before, faults)
    return faults


def _hardware_problem(name: str, fault: str, parsed: Any) -> str | None:
    """Why fault ``fault`` (its parsed value) names hardware node ``name`` lacks, or None."""
    hardware = _node_dir(name) / "root" / "etc" / "gpuctl-lab" / "hardware.json"
    try:
        profile = json.loads(hardware.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        profile = None
    if not isinstance(profile, dict):
        if sim_faults.names_hardware(fault, parsed):
            return f"{fault}: {name} has no simulated GPUs or HCAs (not a GPU node?)"
        return None
    return sim_faults.hardware_problem(fault, parsed, profile, name)


def _log_kernel_lines(name: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    """Put the kernel lines a new fault causes (NVRM Xid 79, 48, ...) into the node's journal.

    A container has no kernel log of its own, and the host's must never be touched, so the
    lines go to the node's journal with the kernel's identifier: `journalctl -t kernel` shows
    them there exactly as it shows real kernel messages on a real node.
    """
    hardware = _node_dir(name) / "root" / "etc" / "gpuctl-lab" / "hardware.json"
    if not hardware.is_file():
        return
    profile = json.loads(hardware.read_text(encoding="utf-8"))
    old = sim_kernel.kernel_log_lines(profile, before, name)
    new = [line for line in sim_kernel.kernel_log_lines(profile, after, name) if line not in old]
    for line in new:
        run(ssh_argv(address_of(name), ["logger", "-t", "kernel", "--", _quote(line)]), timeout=30)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def clear_faults(name: str, fault: str | None = None) -> dict[str, Any]:
    require_root()
    address_of(name)
    try:
        faults = dict(sim_faults.clear(faults_of(name), fault))
    except sim_faults.FaultError as exc:
        raise LabError(str(exc)) from None
    path = _faults_file(name)
    if faults:
        path.write_text(json.dumps(faults, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    else:
        path.unlink(missing_ok=True)
    return faults


def up(
    compute_nodes: int = 2,
    profile: str = DEFAULT_PROFILE,
    os_name: str = DEFAULT_OS,
    profiles: list[str] | None = None,
) -> UpResult:
    """Start the lab: ``compute_nodes`` of ``profile``, or the node groups of ``profiles``
    (``NAME:COUNT`` each, parse_profiles), on ``os_name`` (OS_RELEASES)."""
    require_root()
    if os_name not in OS_RELEASES:
        raise LabError(f"unknown node OS {os_name!r}; choose one of: {', '.join(OS_RELEASES)}")
    groups = parse_profiles(compute_nodes, profiles or [profile])
    start = time.monotonic()
    text = lab_cluster_text(sum(n for _, n in groups), groups[0][0], os_name, groups)
    cluster = load_cluster_text(text, "lab")
    nodes = [(n.name, n.address or "", n.roles) for n in cluster_nodes(cluster)]
    hardware = _hardware_of(cluster, groups)
    state = _load_state()
    previous = {n["name"] for n in state.get("nodes", [])}
    extra = previous - {n for n, _, _ in nodes}
    if extra:
        raise LabError(
            f"the lab runs {', '.join(sorted(extra))}, which --nodes "
            f"{len(nodes)} would drop; run gpuctl lab down first"
        )
    if previous and state.get("os", DEFAULT_OS) != os_name:
        raise LabError(
            f"the lab runs {state.get('os', DEFAULT_OS)}, not {os_name}; run gpuctl lab down first"
        )
    built = ensure_base(os_name)
    pub = Path(f"{ssh_key()}.pub").read_text(encoding="utf-8")
    ensure_bridge()
    hosts = [(n, a) for n, a, _ in nodes]
    started: list[str] = []
    _save_state(nodes, os_name)  # before anything is started: `down` must know what to remove
    repo.start_services()  # the apt proxy and the lab repository, on the bridge address
    if os_name != DEFAULT_OS:
        slurm_repo.build(OS_RELEASES[os_name])  # Debian's Slurm, served apart (cached)
    # gpuctl for the nodes' node check (they have no internet); cached
    wheelhouse.build(wheelhouse_dir())
    for name, address, _roles in nodes:
        ensure_node_network(name, address)
        repo.configure_node_apt(prepare_root(name, hosts, pub, os_name))
        if name in hardware:
            _write_hardware(name, hardware[name])
        if not node_running(name):
            start_node(name)
            started.append(name)
    entries = sorted({f"{a},{n} {host_key(n)}" for n, a, _ in nodes})
    known_hosts().write_text("\n".join(entries) + "\n", encoding="utf-8")
    for name, address, _ in nodes:
        wait_running(name, address)
    # the GPU nodes' simulated BMCs (gpuctl/lab/sim/bmc/), on their own addresses on the bridge
    bmcs = [
        bmc.BmcSpec(n.name, n.bmc_address, _node_dir(n.name) / "root")
        for n in cluster_nodes(cluster)
        if n.bmc_address
    ]
    if bmcs:
        bmc.start(bmcs, BRIDGE)
    (lab_dir() / "cluster.yml").write_text(text, encoding="utf-8")
    return UpResult(status(), tuple(started), built, time.monotonic() - start)


def _hardware_of(cluster: Any, groups: list[tuple[str, int]]) -> dict[str, str]:
    """Compute node -> its simulated profile: the compute groups in order, one per profile."""
    compute = [g for g in cluster.node_groups if "compute" in {r.value for r in g.roles}]
    out: dict[str, str] = {}
    for group, (profile, _count) in zip(compute, groups, strict=True):
        for name in NodeSet(group.nodes):
            out[name] = profile
    return out


def _save_state(nodes: list[tuple[str, str, tuple[str, ...]]], os_name: str) -> None:
    data = {
        "nodes": [{"name": n, "address": a, "roles": list(r)} for n, a, r in nodes],
        "os": os_name,
        "bridge": BRIDGE,
    }
    _state_file().write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def status() -> LabStatus:
    state = _load_state()
    nodes = tuple(
        LabNode(
            n["name"],
            n["address"],
            tuple(n.get("roles", [])),
            "running" if node_running(n["name"]) else "stopped",
        )
        for n in state.get("nodes", [])
    )
    cluster_yml = lab_dir() / "cluster.yml"
    return LabStatus(nodes, cluster_yml if cluster_yml.is_file() else None)


def address_of(name: str) -> str:
    for node in status().nodes:
        if node.name == name:
            return node.address
    raise LabError(f"no lab node named {name!r}; see gpuctl lab status")


def reboot(name: str, timeout: float = BOOT_TIMEOUT_S) -> tuple[str, str]:
    """Reboot a node from inside (systemctl reboot) and wait for it; (old, new) boot ids."""
    require_root()
    address = address_of(name)
    before = wait_running(name, address, timeout=30)
    run(ssh_argv(address, ["systemctl", "reboot"]), check=False, timeout=30)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1)
        try:
            after = wait_running(name, address, timeout=max(5.0, deadline - time.monotonic()))
        except LabError:
            continue
        if after != before:
            return before, after
    raise LabError(f"{name} did not come back from reboot within {timeout:g} s")


def down() -> list[str]:
    """Remove every container, mount, namespace, veth, bridge and process the lab made.

    The caches stay: the base image, the lab repository and the apt proxy's cache; so do the
    simulated BMCs' CA, certificate and credentials (their state goes, with the nodes' disks).
    """
    require_root()
    state = _load_state()
    removed: list[str] = []
    bmc.stop()  # first: a BMC must not power a node on again while the nodes go
    for node in state.get("nodes", []):
        name = node["name"]
        stop_node(name)
        root = _node_dir(name) / "root"
        if _mounted(root):
            run(["umount", str(root)])
        if _netns_exists(supervisor.netns_name(name)):
            run(["ip", "netns", "delete", supervisor.netns_name(name)])
        if _link_exists(_veth(name)):
            try:
                run(["ip", "link", "delete", _veth(name)])
            except LabError:
                # deleting the namespace takes its veth peer with it, asynchronously
                if _link_exists(_veth(name)):
                    raise
        shutil.rmtree(_node_dir(name), ignore_errors=True)
        for suffix in (".log",):
            (_run_dir() / f"{name}{suffix}").unlink(missing_ok=True)
        removed.append(name)
    repo.stop_services()
    if _link_exists(BRIDGE):
        run(["ip", "link", "delete", BRIDGE])
    for path in (_state_file(), lab_dir() / "cluster.yml", known_hosts()):
        path.unlink(missing_ok=True)
    return removed
