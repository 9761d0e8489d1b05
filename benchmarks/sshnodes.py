"""Lightweight SSH nodes for benchmarks: one sshd per network namespace, simulated GPU tools.

    with SshNodes(64) as nodes:        # root; tears everything down on exit, error or Ctrl-C
        nodes.cluster_yml()            # a cluster.yml gpuctl can run on
        nodes.ssh_options()            # ssh options for clush / ansible (host keys checked)

Each node is a network namespace on the bridge ``gpuctl-bench0`` (198.19.0.1/24, a benchmarking
range that is routed nowhere; the lab uses 198.18.0.0/24 on gpuctl-br0 and is never touched)
with one ``/usr/sbin/sshd -D`` bound to the node's address: GPU nodes ``gpu001``... at
198.19.0.11 upwards, and a controller ``ctl01`` at 198.19.0.10 (cluster.yml needs one; it has no
GPU tools). Everything else is the host's: file system, users, python3. That is enough to
measure how fast a tool runs commands on many nodes over SSH, and nothing more.

- SSH: each sshd has its own ed25519 host key; root logs in with the benchmark's key only
  (``PermitRootLogin prohibit-password``, no passwords, no PAM); ``known_hosts`` lists every
  node (``ADDRESS,NAME TYPE KEY``), so host key checking stays on for every client.
- Simulated tools: ``bin/`` holds launchers of the lab simulator (gpuctl/lab/sim, copied as the
  package ``benchsim`` under ``lib/``) for every stand-in tool (``nvidia-smi``, ``ibstat``, ...),
  plus two of the harness's own: ``journalctl`` (``-t kernel`` / ``-k``: the simulated kernel log
  in journal form) and ``systemctl`` (``status nvidia-fabricmanager``), because the host runs no
  systemd. sshd puts them first on the sessions' PATH with ``SetEnv`` in each node's
  sshd_config, together with ``GPUCTL_SIM_PROFILE`` (the profile, JSON), ``GPUCTL_SIM_FAULTS``
  (the node's faults file, absent = healthy) and ``GPUCTL_SIM_NODE`` (the node's name). No
  ``~/.ssh/environment``, no ForceCommand: the client's command runs as it would on a node.
- State lives in ``/run/gpuctl-bench`` (not /tmp: sshd's StrictModes refuses an
  AuthorizedKeysFile below a world-writable directory); ``/run/gpuctl-bench.lock`` keeps a
  second harness out. A harness killed with SIGKILL leaves its namespaces behind; the next one
  removes them (it holds the lock, so they are not someone else's).
"""

from __future__ import annotations

import compileall
import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TextIO

import yaml

BRIDGE = "gpuctl-bench0"
NETWORK = ipaddress.IPv4Network("198.19.0.0/24")
BRIDGE_ADDRESS = "198.19.0.1"
CONTROLLER_HOST = 10  # ctl01 = 198.19.0.10
FIRST_GPU_HOST = 11  # gpu001 = 198.19.0.11
MAX_NODES = 254 - FIRST_GPU_HOST + 1
NETNS_PREFIX = "gpuctl-bench-"
VETH_PREFIX = "gbv-"
STATE_DIR = Path("/run/gpuctl-bench")
LOCK_FILE = Path("/run/gpuctl-bench.lock")
SSHD = "/usr/sbin/sshd"
SIM_PACKAGE = "benchsim"
DEFAULT_PROFILE = "hgx-h100-ndr"
START_TIMEOUT_S = 30.0
ROOT = Path(__file__).resolve().parents[1]
SIM_SOURCE = ROOT / "gpuctl" / "lab" / "sim"


class HarnessError(Exception):
    """The harness cannot run (not root, sshd missing, a node that did not start, ...)."""


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    address: str
    gpu: bool  # False for the controller: no simulated tools on its PATH

    @property
    def netns(self) -> str:
        return f"{NETNS_PREFIX}{self.name}"

    @property
    def veth(self) -> str:
        return f"{VETH_PREFIX}{self.name}"


def plan(count: int) -> list[Node]:
    """The controller and ``count`` GPU nodes, with their addresses in 198.19.0.0/24."""
    if not 1 <= count <= MAX_NODES:
        raise HarnessError(f"--nodes takes 1 to {MAX_NODES}, not {count}")
    base = int(NETWORK.network_address)
    nodes = [Node("ctl01", str(ipaddress.IPv4Address(base + CONTROLLER_HOST)), gpu=False)]
    nodes += [
        Node(f"gpu{i + 1:03d}", str(ipaddress.IPv4Address(base + FIRST_GPU_HOST + i)), gpu=True)
        for i in range(count)
    ]
    return nodes


def gpu_nodeset(count: int) -> str:
    """``gpu[001-064]`` (ClusterShell / cluster.yml notation)."""
    return "gpu001" if count == 1 else f"gpu[001-{count:03d}]"


def address_nodeset(count: int) -> str:
    """``198.19.0.[11-74]``: the GPU nodes' addresses, folded."""
    last = FIRST_GPU_HOST + count - 1
    prefix = str(NETWORK.network_address).rsplit(".", 1)[0]
    if count == 1:
        return f"{prefix}.{FIRST_GPU_HOST}"
    return f"{prefix}.[{FIRST_GPU_HOST}-{last}]"


# ------------------------------------------------------------------------------------------
# Files the harness writes (pure functions of the layout; unit tested)


def sshd_config(node: Node, state: Path, path_dirs: list[str]) -> str:
    """One node's sshd_config: its address, its host key, key-only root, the simulator's env."""
    node_dir = state / "nodes" / node.name
    env = [f"PATH={':'.join(path_dirs)}"]
    if node.gpu:
        env += [
            f"GPUCTL_SIM_PROFILE={state / 'hardware.json'}",
            f"GPUCTL_SIM_FAULTS={node_dir / 'faults.json'}",
            f"GPUCTL_SIM_NODE={node.name}",
        ]
    return "\n".join(
        [
            f"# benchmarks/sshnodes.py: node {node.name} (sshd in network namespace {node.netns})",
            f"ListenAddress {node.address}:22",
            f"HostKey {node_dir / 'ssh_host_ed25519_key'}",
            f"PidFile {node_dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {state / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes yes",
            "PermitUserEnvironment no",
            "X11Forwarding no",
            "AllowAgentForwarding no",
            "PrintMotd no",
            "PrintLastLog no",
            "UseDNS no",
            "AcceptEnv LANG LC_*",
            f"SetEnv {' '.join(env)}",
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


def known_hosts_line(node: Node, public_key: str) -> str:
    """``ADDRESS,NAME TYPE KEY`` (the lab's format): clients connect by address or by name."""
    kind, key = public_key.split()[:2]
    return f"{node.address},{node.name} {kind} {key}\n"


def cluster_doc(count: int, key: Path, known_hosts: Path) -> dict[str, Any]:
    """cluster.yml for the harness: ``count`` HGX H100 nodes (8 GPUs, NVSwitch, 8 NDR HCAs)."""
    leaves: list[dict[str, str]] = []
    for start in range(0, count, 16):
        end = min(start + 16, count)
        members = f"gpu{start + 1:03d}" if end - start == 1 else f"gpu[{start + 1:03d}-{end:03d}]"
        leaves.append({"name": f"leaf{len(leaves) + 1:02d}", "nodes": members})
    topology: dict[str, Any] = {"leaves": leaves}
    if len(leaves) > 1:
        topology["spines"] = [{"name": "spine01", "switches": f"leaf[01-{len(leaves):02d}]"}]
    return {
        "schema_version": 1,
        "name": "bench",
        "ssh": {
            "user": "root",
            "private_key": str(key),
            "known_hosts": str(known_hosts),
            "connect_timeout_s": 10,
        },
        "package_sources": {"cuda": None},
        "software": {
            "driver": {"branch": "570", "version": "570.172.08"},
            "cuda": "12.8",
            "nccl": "2.26.2-1+cuda12.8",
            "nccl_tests": "2.14.1",
            "dcgm": "4.4.1",
        },
        "fabrics": [
            {
                "name": "ib",
                "kind": "infiniband",
                "generation": "ndr",
                "subnet_manager": "switch",
                "topology": topology,
            }
        ],
        "node_groups": [
            {
                "name": "ctl",
                "nodes": "ctl01",
                "addresses": plan(count)[0].address,
                "roles": ["controller"],
            },
            {
                "name": "gpu",
                "nodes": gpu_nodeset(count),
                "addresses": address_nodeset(count),
                "roles": ["compute"],
                "gpus": {"model": "h100-sxm", "count": 8, "interconnect": "nvswitch"},
                # what the in-process SSH nodes report (Slurm needs both: cluster-yml.md)
                "cpu": {"sockets": 1, "cores_per_socket": 2, "threads_per_core": 1},
                "memory_mb": 1024,
                "nics": [{"devices": "mlx5_[0-7]", "fabric": "ib"}],
            },
        ],
        "slurm": {
            "controller": "ctl01",
            "partitions": [{"name": "gpu", "node_groups": ["gpu"], "default": True}],
        },
    }


def ansible_inventory(nodes: list[Node], key: Path, known_hosts: Path) -> dict[str, Any]:
    """An inventory of the GPU nodes (YAML dict): the same user, key and host key checking."""
    hosts = {n.name: {"ansible_host": n.address} for n in nodes if n.gpu}
    return {
        "all": {
            "hosts": hosts,
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(key),
                "ansible_ssh_common_args": " ".join(ssh_options(key, known_hosts)),
            },
        }
    }


def ssh_options(key: Path, known_hosts: Path) -> list[str]:
    """OpenSSH client options for clush and ansible: the benchmark key, host keys checked."""
    return [
        "-o",
        f"IdentityFile={key}",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
    ]


# --- the harness's own stand-ins: the host has no systemd, so journalctl and systemctl are
# --- answered from the simulator (kernel log lines of faults, Fabric Manager's unit status)

_PRELUDE = """\
#!/usr/bin/python3
# {tool}: benchmarks/sshnodes.py stand-in (simulated node; see docs/validate-benchmark.md)
import sys
import time

sys.path.insert(0, {lib!r})
from {package} import standin

try:
    PROFILE, FAULTS = standin.load_state()
except Exception as exc:  # noqa: BLE001 - the real tool's way: message and status
    sys.stderr.write(f"{tool}: cannot read the simulated node: {{exc}}\\n")
    sys.exit(1)
NODE = standin.node_name()
"""

_JOURNALCTL = """\
import re

from {package} import kernel

BOOT = re.compile(r"[+-]?[0-9]+|[0-9a-f]{{32}}([+-]?[0-9]+)?|all")
args = sys.argv[1:]
output = "short"
kernel_only = False
i = 0
while i < len(args):
    arg = args[i]
    value = args[i + 1] if i + 1 < len(args) else None
    if arg in ("-k", "--dmesg"):
        kernel_only = True
    elif arg in ("-t", "--identifier"):
        kernel_only = kernel_only or value == "kernel"
        i += 1
    elif arg.startswith("--identifier="):
        kernel_only = kernel_only or arg.split("=", 1)[1] == "kernel"
    elif arg in ("-o", "--output"):
        output = value or ""
        i += 1
    elif arg.startswith("--output="):
        output = arg.split("=", 1)[1]
    elif arg in ("-S", "--since", "-U", "--until"):
        i += 1  # every simulated line is from this boot, within the last hour
    elif arg in ("-b", "--boot"):  # an optional boot ID or offset follows
        if value is not None and BOOT.fullmatch(value):
            i += 1
    elif arg.startswith(("--since=", "--until=", "--boot=")) or arg in ("--no-pager", "-q"):
        pass
    else:
        sys.stderr.write(f"journalctl: unsupported option {{arg!r}} (benchmark stand-in)\\n")
        sys.exit(1)
    i += 1
if output not in ("short", "short-iso"):
    sys.stderr.write(f"journalctl: unsupported output {{output!r}} (benchmark stand-in)\\n")
    sys.exit(1)
if not kernel_only:
    print("-- No entries --")
    sys.exit(0)
for line in kernel.dmesg(PROFILE, FAULTS, NODE, iso=True).splitlines():
    stamp, message = line.split(" ", 1)
    when = time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")
    layout = "%Y-%m-%dT%H:%M:%S+0000" if output == "short-iso" else "%b %d %H:%M:%S"
    shown = time.strftime(layout, when)
    print(f"{{shown}} {{NODE}} kernel: {{message}}")
"""

_SYSTEMCTL = """\
from {package} import fabric

args = [a for a in sys.argv[1:] if a not in ("--no-pager", "-l", "--full", "-q", "--quiet")]
units = {{"nvidia-fabricmanager", "nvidia-fabricmanager.service"}}
if len(args) == 2 and args[0] in ("status", "is-active") and args[1] in units:
    text, rc = fabric.systemctl_status(PROFILE, FAULTS, NODE)
    if args[0] == "status":
        sys.stdout.write(text)
        sys.exit(rc)
    state = {{0: "active", 3: "failed"}}.get(rc, "inactive")
    if "-q" not in sys.argv and "--quiet" not in sys.argv:
        print(state)
    sys.exit(0 if rc == 0 else 3)
sys.stderr.write(f"systemctl: benchmark stand-in answers only status/is-active "
                 f"nvidia-fabricmanager, not {{' '.join(sys.argv[1:])!r}}\\n")
sys.exit(1)
"""


def harness_standin(tool: str, lib: Path) -> str:
    """Text of the harness's own ``journalctl`` or ``systemctl`` stand-in."""
    body = {"journalctl": _JOURNALCTL, "systemctl": _SYSTEMCTL}[tool]
    return (_PRELUDE + body).format(tool=tool, lib=str(lib), package=SIM_PACKAGE)


def sim_tools() -> tuple[str, ...]:
    from gpuctl.lab.sim import standin

    return standin.TOOLS


# ------------------------------------------------------------------------------------------
# Processes and the network


def _run(argv: list[str], *, check: bool = True, timeout: float = 30) -> str:
    res = subprocess.run(  # noqa: S603 - argv list, our own tools
        argv, capture_output=True, text=True, check=False, timeout=timeout
    )
    if check and res.returncode != 0:
        raise HarnessError(f"{' '.join(argv)}: exit {res.returncode}: {res.stderr.strip()}")
    return res.stdout


def _links() -> set[str]:
    out = _run(["ip", "-o", "link", "show"], check=False)
    names = set()
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.add(parts[1].strip().split("@", 1)[0])
    return names


def _namespaces() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pids_in(netns: str) -> list[int]:
    out = _run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def _kill_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if Path(f"/proc/{p}").exists() and not _zombie(p)]
        if alive:
            time.sleep(0.05)
    return alive


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _sshd_ready(address: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, 22), timeout=1) as sock:
                sock.settimeout(2)
                if sock.recv(64).startswith(b"SSH-2.0-"):
                    return True
        except OSError:
            time.sleep(0.05)
    return False


def remove_leftovers() -> list[str]:
    """Remove every namespace, veth and bridge of this harness (and the processes in them).

    Only call it holding the lock: then whatever carries the harness's names is a leftover.
    """
    removed: list[str] = []
    for ns in _namespaces():
        if not ns.startswith(NETNS_PREFIX):
            continue
        pids = _pids_in(ns)
        _kill_pids(pids, signal.SIGTERM)
        _kill_pids(_wait_gone(pids, 5), signal.SIGKILL)
        _wait_gone(pids, 5)
        _run(["ip", "netns", "delete", ns], check=False)
        removed.append(ns)
    links = _links()
    for link in sorted(links):
        if link.startswith(VETH_PREFIX):
            _run(["ip", "link", "delete", link], check=False)
            removed.append(link)
    if BRIDGE in links:
        _run(["ip", "link", "delete", BRIDGE], check=False)
        removed.append(BRIDGE)
    return removed


class _Deferred:
    """While the nodes are up, SIGTERM and SIGHUP raise KeyboardInterrupt (so teardown runs)."""

    def __init__(self) -> None:
        self.saved: dict[int, Any] = {}

    def raise_on_term(self) -> None:
        if not _main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self.saved[sig] = signal.signal(sig, _to_interrupt)

    def restore(self) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        self.saved.clear()


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _to_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _no_interrupts() -> Iterator[None]:
    """Teardown runs to the end: Ctrl-C and SIGTERM wait until it is done."""
    if not _main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


# ------------------------------------------------------------------------------------------
# The harness


class SshNodes:
    """``count`` GPU nodes and a controller, each an sshd in its own network namespace."""

    def __init__(
        self, count: int, *, profile: str = DEFAULT_PROFILE, log: TextIO | None = None
    ) -> None:
        self.count = count
        self.nodes = plan(count)
        self.profile = profile
        self.state = STATE_DIR
        self._log = log
        self._lock: int | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._signals = _Deferred()
        self._made_privsep_dir = False
        self.setup_s = 0.0

    # paths
    @property
    def key(self) -> Path:
        return self.state / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state / "known_hosts"

    @property
    def bin_dir(self) -> Path:
        return self.state / "bin"

    @property
    def lib_dir(self) -> Path:
        return self.state / "lib"

    @property
    def gpu_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.gpu]

    def faults_file(self, name: str) -> Path:
        return self.state / "nodes" / name / "faults.json"

    def set_faults(self, name: str, faults: dict[str, Any]) -> None:
        """Give node ``name`` simulated faults (gpuctl/lab/sim/faults.py's JSON form)."""
        path = self.faults_file(name)
        if faults:
            path.write_text(json.dumps(faults, sort_keys=True) + "\n", encoding="utf-8")
        else:
            path.unlink(missing_ok=True)

    def ssh_options(self) -> list[str]:
        return ssh_options(self.key, self.known_hosts)

    def cluster_yml(self, folder: Path | None = None) -> Path:
        """Write cluster.yml (absolute key and known_hosts paths) into ``folder``; its path."""
        folder = folder or self.state / "cluster"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "cluster.yml"
        text = (
            "# benchmarks/sshnodes.py: sshd-only nodes with simulated GPUs "
            f"(profile {self.profile}); written for one benchmark run\n"
        ) + yaml.safe_dump(cluster_doc(self.count, self.key, self.known_hosts), sort_keys=False)
        path.write_text(text, encoding="utf-8")
        return path

    def inventory(self, folder: Path | None = None) -> Path:
        folder = folder or self.state / "ansible"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "inventory.yml"
        doc = ansible_inventory(self.nodes, self.key, self.known_hosts)
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        return path

    # lifecycle
    def __enter__(self) -> SshNodes:
        self._signals.raise_on_term()
        try:
            self._take_lock()
            started = time.perf_counter()
            self._setup()
            self.setup_s = time.perf_counter() - started
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _say(self, text: str) -> None:
        if self._log is not None:
            self._log.write(text + "\n")
            self._log.flush()

    def _take_lock(self) -> None:
        if os.geteuid() != 0:
            raise HarnessError("the SSH node harness needs root (network namespaces, sshd)")
        for tool, hint in ((SSHD, "apt-get install openssh-server"), ("ip", "iproute2")):
            if shutil.which(tool) is None:
                raise HarnessError(f"{tool} is missing ({hint}; scripts/bootstrap.sh --test)")
        fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise HarnessError(f"another SSH node harness is running ({LOCK_FILE})") from None
        self._lock = fd

    def _setup(self) -> None:
        leftovers = remove_leftovers()
        if leftovers:
            self._say(f"sshnodes: removed leftovers of an earlier run: {len(leftovers)} items")
        shutil.rmtree(self.state, ignore_errors=True)
        self.state.mkdir(mode=0o700, parents=True)
        self._write_keys_and_tools()
        self._network()
        self._start_sshds()

    def _write_keys_and_tools(self) -> None:
        from gpuctl.lab.sim import profiles

        _run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "gpuctl-bench",
                "-f",
                str(self.key),
            ]
        )
        (self.state / "authorized_keys").write_text(
            Path(f"{self.key}.pub").read_text(encoding="utf-8"), encoding="utf-8"
        )
        os.chmod(self.state / "authorized_keys", 0o600)

        def host_key(node: Node) -> str:
            node_dir = self.state / "nodes" / node.name
            node_dir.mkdir(parents=True)
            key = node_dir / "ssh_host_ed25519_key"
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", node.name, "-f", str(key)])
            return known_hosts_line(node, Path(f"{key}.pub").read_text(encoding="utf-8"))

        with ThreadPoolExecutor(max_workers=8) as pool:
            lines = list(pool.map(host_key, self.nodes))
        self.known_hosts.write_text("".join(lines), encoding="utf-8")

        # the simulator, as the package `benchsim` (standard library, relative imports only)
        package = self.lib_dir / SIM_PACKAGE
        package.mkdir(parents=True)
        for source in sorted(SIM_SOURCE.glob("*.py")):
            shutil.copyfile(source, package / source.name)
        compileall.compile_dir(str(package), quiet=1)
        (self.state / "hardware.json").write_text(
            profiles.profile_json(self.profile), encoding="utf-8"
        )
        from gpuctl.lab.sim.standin import launcher

        self.bin_dir.mkdir()  # the launchers: 0755 like /usr/bin's
        texts = {tool: launcher(str(self.lib_dir), SIM_PACKAGE) for tool in sim_tools()}
        for tool in ("journalctl", "systemctl"):
            texts[tool] = harness_standin(tool, self.lib_dir)
        for tool, text in texts.items():
            path = self.bin_dir / tool
            path.write_text(text, encoding="utf-8")
            os.chmod(path, 0o755)  # noqa: S103 - executables run by the sessions

    def _network(self) -> None:
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "addr", "add", f"{BRIDGE_ADDRESS}/{NETWORK.prefixlen}", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])

        def one(node: Node) -> None:
            _run(["ip", "netns", "add", node.netns])
            _run(
                [
                    "ip",
                    "link",
                    "add",
                    node.veth,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    node.netns,
                ]
            )
            _run(["ip", "link", "set", node.veth, "master", BRIDGE, "up"])
            ns = ["ip", "-n", node.netns]
            _run([*ns, "addr", "add", f"{node.address}/{NETWORK.prefixlen}", "dev", "eth0"])
            _run([*ns, "link", "set", "lo", "up"])
            _run([*ns, "link", "set", "eth0", "up"])

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(one, self.nodes))

    def _start_sshds(self) -> None:
        privsep = Path("/run/sshd")  # sshd's privilege separation directory (Debian)
        if not privsep.is_dir():
            privsep.mkdir(mode=0o755)
            self._made_privsep_dir = True
        std = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        for node in self.nodes:
            node_dir = self.state / "nodes" / node.name
            dirs = ([str(self.bin_dir)] if node.gpu else []) + std.split(":")
            config = node_dir / "sshd_config"
            config.write_text(sshd_config(node, self.state, dirs), encoding="utf-8")
            if node is self.nodes[0]:
                _run([SSHD, "-t", "-f", str(config)])  # a config error, said plainly
            home = self._home(node_dir)
            # its own host name (UTS namespace) and its own /root (a bind mount in the mount
            # namespace `ip netns exec` makes), then sshd in the foreground
            script = 'hostname "$1" && mount --bind "$2" /root && exec "$3" -D -f "$4" -E "$5"'
            argv = ["ip", "netns", "exec", node.netns, "unshare", "--uts", "/bin/sh", "-c"]
            argv += [script, "sh", node.name, str(home), SSHD, str(config)]
            argv += [str(node_dir / "sshd.log")]
            self._procs[node.name] = subprocess.Popen(  # noqa: S603 - argv list
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )

        def ready(node: Node) -> tuple[Node, bool]:
            return node, _sshd_ready(node.address, START_TIMEOUT_S)

        with ThreadPoolExecutor(max_workers=16) as pool:
            failed = [node for node, ok in pool.map(ready, self.nodes) if not ok]
        if failed:
            log = self.state / "nodes" / failed[0].name / "sshd.log"
            detail = (
                log.read_text(encoding="utf-8", errors="replace")[-500:] if log.is_file() else ""
            )
            raise HarnessError(
                f"sshd did not answer on {len(failed)} node(s) within {START_TIMEOUT_S:.0f} s "
                f"({', '.join(n.name for n in failed[:5])}); {failed[0].name}: {detail.strip()}"
            )

    @staticmethod
    def _home(node_dir: Path) -> Path:
        """The node's /root: Debian's root dot files (base-files), nothing of the host's."""
        home = node_dir / "root"
        home.mkdir(mode=0o700)
        for name, source in ((".bashrc", "dot.bashrc"), (".profile", "dot.profile")):
            path = Path("/usr/share/base-files") / source
            if path.is_file():
                shutil.copyfile(path, home / name)
        return home

    def close(self) -> None:
        """Stop every sshd and session, remove namespaces, veths, bridge and state. Idempotent."""
        with _no_interrupts():
            try:
                procs = list(self._procs.values())
                for proc in procs:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
                for proc in procs:
                    try:
                        proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait(timeout=5)
                self._procs.clear()
                if self._lock is not None:
                    remove_leftovers()  # sessions still in the namespaces, namespaces, links
                    shutil.rmtree(self.state, ignore_errors=True)
                    if self._made_privsep_dir:
                        with contextlib.suppress(OSError):
                            Path("/run/sshd").rmdir()
                        self._made_privsep_dir = False
            finally:
                if self._lock is not None:
                    os.close(self._lock)
                    self._lock = None
                self._signals.restore()


def residue() -> list[str]:
    """What of the harness is still on this machine (empty after a clean teardown)."""
    left = [ns for ns in _namespaces() if ns.startswith(NETNS_PREFIX)]
    left += sorted(n for n in _links() if n.startswith(VETH_PREFIX) or n == BRIDGE)
    if STATE_DIR.exists():
        left.append(str(STATE_DIR))
    return left


if __name__ == "__main__":  # smoke test: bring nodes up, run one command, tear down
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with SshNodes(count, log=sys.stderr) as up:
        print(f"{count} nodes up in {up.setup_s:.2f} s; cluster.yml: {up.cluster_yml()}")
        first = up.gpu_nodes[0]
        out = _run(
            [
                "ssh",
                *up.ssh_options(),
                "-o",
                "BatchMode=yes",
                f"root@{first.address}",
                "nvidia-smi",
                "-L",
            ]
        )
        print(out, end="")
    print("residue:", residue() or "none")
