"""The roce_qos role's apply script, run for real against a fake root.

playbooks/roles/roce_qos/files/gpuctl-roce-qos runs as a subprocess with
GPUCTL_ROCE_QOS_ROOT pointing at a temporary tree that stands in for /sys (netdevs under
/sys/class/infiniband/<dev>/device/net, ECN under /sys/class/net/<if>/ecn, configfs rdma_cm
under /sys/kernel/config), a settings file rendered from the role's own template and vars, and
a fake ``mlnx_qos`` first on PATH that keeps per-interface trust and PFC state, prints what the
real ``mlnx_qos -i <if>`` prints and logs every argument vector it is called with.

The contract the role relies on (tasks/configure.yml): ``check`` exits 0 when all is as wanted,
1 with one "drift:" line per setting that is not (then the role runs ``apply``), anything else
fails the play; ``apply`` prints one "applied:" line per setting it set and exits 0, or 2 when it
cannot read or set something.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from helpers import ROOT

ROLE = ROOT / "playbooks" / "roles" / "roce_qos"
SCRIPT = ROLE / "files" / "gpuctl-roce-qos"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

# A fixed mtime for every file of the fake tree, so that any write shows (the coarse kernel
# clock could otherwise give a rewrite the same mtime as the setup).
OLD_MTIME_NS = 1_000_000_000 * 1_000_000_000
# What the role's defaults ask for: trust dscp, PFC and ECN on priority 3, DSCP 26 -> ToS 104.
WANTED_PFC = [0, 0, 0, 1, 0, 0, 0, 0]

# The fake mlnx_qos. Its output copies pretty_print() of mlnx_qos in mlnx-tools
# (https://github.com/Mellanox/mlnx-tools, python/mlnx_qos, commit 227c7ab1), on a driver with
# the qos/trust and buffer sysfs files: "DCBX mode: ...", "Priority trust state: <trust>", the
# dscp2prio block only when trust is dscp, "default priority:", "Receive buffer size (bytes):
# ...", "Cable len: N", then
#     print("PFC configuration:")
#     print("\tpriority    0   1   2   3   4   5   6   7")
#     msg = "\tenabled     "
#     for up in range(8):
#         msg += "%1d   " % ((pfc_en >> up) & 0x01)
# (each digit followed by three spaces, so the line ends in blanks), a "\tbuffer      ..." line,
# and "tc: N ratelimit: unlimited, tsa: vendor" / "\t priority:  N" per TC. Captured output
# with the same layout: att/netarbiter, nvmf/OUTPUTSAMPLE.setup-nic-lossless-layer3.sh.md, and
# a copy of the Mellanox community article "mlnx_qos" (MLNX_OFED 4.2) at
# https://www.cnblogs.com/bandaoyu/p/16752209.html. With --trust or --pfc it sets first and then
# prints the same report, as the real tool does.
FAKE_MLNX_QOS = '''\
#!{python}
"""Fake mlnx_qos for tests/unit/test_roce_qos_script.py."""
import json
import sys
from pathlib import Path

STATE = Path({state!r})
LOG = Path({log!r})

argv = sys.argv[1:]
with LOG.open("a") as f:
    f.write(json.dumps(argv) + "\\n")

opts = {{}}
i = 0
while i < len(argv):
    arg = argv[i]
    if "=" in arg and arg.startswith("--"):
        key, value = arg.split("=", 1)
        i += 1
    elif arg in ("-i", "--interface", "--trust", "-f", "--pfc") and i + 1 < len(argv):
        key, value = arg, argv[i + 1]
        i += 2
    else:
        print("Bad arguments")
        sys.exit(1)
    opts[{{"--interface": "-i", "-f": "--pfc"}}.get(key, key)] = value

if "-i" not in opts:
    print("Interface name is required")
    sys.exit(1)
state_file = STATE / (opts["-i"] + ".json")
if not state_file.exists():
    print("No such device: " + opts["-i"])
    sys.exit(1)
state = json.loads(state_file.read_text())

if "--pfc" in opts:
    items = opts["--pfc"].split(",")
    if len(items) != 8:
        print("pfc list must have 8 items")
        sys.exit(1)
    if any(t not in ("0", "1") for t in items):
        print("Bad value for PFC")
        sys.exit(1)
    state["pfc"] = [int(t) for t in items]
if "--trust" in opts:
    if opts["--trust"] not in ("dscp", "pcp"):
        print("Invalid trust state command. Refer to the help.")
        sys.exit(1)
    state["trust"] = opts["--trust"]
state_file.write_text(json.dumps(state))

print("DCBX mode: OS controlled")
print("Priority trust state: " + state["trust"])
if state["trust"] == "dscp":
    print("dscp2prio mapping:")
    for prio in range(8):
        dscps = "".join("%02d," % d for d in range(prio * 8 + 7, prio * 8 - 1, -1))
        print("\\tprio:%d dscp:%s" % (prio, dscps))
print("default priority:")
print("Receive buffer size (bytes): 130944,130944,0,0,0,0,0,0,max_buffer_size=262016")
print("Cable len: 7")
print("PFC configuration:")
print("\\tpriority    0   1   2   3   4   5   6   7")
msg = "\\tenabled     "
for up in range(8):
    msg += "%1d   " % state["pfc"][up]
msg += "\\n\\tbuffer      "
for up in range(8):
    msg += "%1d   " % state["pfc"][up]
print(msg)
for tc, up in enumerate([1, 0, 2, 3, 4, 5, 6, 7]):
    print("tc: %d ratelimit: unlimited, tsa: vendor" % tc)
    print("\\t priority:  %d" % up)
'''


# Stand-ins for the tools that change the real host, first on PATH in every test: they log
# their arguments and fail, so no test can load a module or mount anything.
FAKE_SYSTEM_TOOL = """\
#!/bin/sh
printf '%s\\n' "$(basename "$0") $*" >> {log}
exit 1
"""
SYSTEM_TOOLS = ("modprobe", "mount", "mountpoint")


def _bool(value: object) -> bool:
    """Ansible's ``bool`` filter, for the values a settings file can hold."""
    return str(value).strip().lower() in ("1", "true", "yes", "on", "y")


def _comment(text: str) -> str:
    """Ansible's ``comment`` filter with its defaults: a "#" block around the text."""
    return "#\n" + "".join(f"# {line}\n" for line in text.splitlines()) + "#"


def render_conf(**overrides: Any) -> str:
    """templates/roce-qos.conf.j2 rendered with the role's defaults, vars and ``overrides``."""
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - a shell settings file, not HTML
    )
    env.filters["bool"] = _bool
    env.filters["comment"] = _comment
    context: dict[str, Any] = dict(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()))
    context.update(overrides)
    context["ansible_managed"] = "Ansible managed"
    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    assert isinstance(role_vars, dict)
    for name, value in role_vars.items():
        context[name] = env.from_string(str(value)).render(context)
    template = (ROLE / "templates" / "roce-qos.conf.j2").read_text()
    return env.from_string(template).render(context)


@dataclass
class Device:
    """One RDMA device as sysfs, configfs and mlnx_qos show it; defaults are the wanted state."""

    name: str = "mlx5_0"
    netdev: str | None = "eth0"
    ports: tuple[int, ...] = (1,)
    trust: str = "dscp"
    pfc: list[int] = field(default_factory=lambda: list(WANTED_PFC))
    ecn_np: list[int] = field(default_factory=lambda: [0, 0, 0, 1, 0, 0, 0, 0])
    ecn_rp: list[int] = field(default_factory=lambda: [0, 0, 0, 1, 0, 0, 0, 0])
    ecn_sysfs: bool = True
    # DCQCN's congestion notifications: DSCP 48 on priority 6 (the role's defaults)
    cnp_dscp: int = 48
    cnp_prio: int = 6
    tos: int = 104
    roce_mode: str = "RoCE v2"
    cm_entry: bool = True


@dataclass
class FakeHost:
    """A fake root, a fake mlnx_qos on PATH and a settings file, for one run of the script."""

    base: Path

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def bin(self) -> Path:
        return self.base / "bin"

    @property
    def state(self) -> Path:
        return self.base / "mlnx_qos_state"

    @property
    def log(self) -> Path:
        return self.base / "mlnx_qos_calls.jsonl"

    @property
    def conf(self) -> Path:
        return self.base / "roce-qos.conf"

    @property
    def system_log(self) -> Path:
        return self.base / "system_tool_calls.log"

    def setup(self, devices: list[Device], *, configfs: bool = True, **settings: Any) -> None:
        for d in (self.root / "sys" / "class" / "net", self.bin, self.state):
            d.mkdir(parents=True, exist_ok=True)
        (self.root / "sys" / "kernel" / "config").mkdir(parents=True)
        if configfs:
            (self.root / "sys" / "kernel" / "config" / "rdma_cm").mkdir()
        fake = self.bin / "mlnx_qos"
        fake.write_text(
            FAKE_MLNX_QOS.format(python=sys.executable, state=str(self.state), log=str(self.log))
        )
        fake.chmod(0o755)
        self.log.write_text("")
        for tool in SYSTEM_TOOLS:
            (self.bin / tool).write_text(
                FAKE_SYSTEM_TOOL.format(log=shlex.quote(str(self.system_log)))
            )
            (self.bin / tool).chmod(0o755)
        self.system_log.write_text("")
        for dev in devices:
            self._add(dev, configfs=configfs)
        settings.setdefault("roce_qos_devices", [dev.name for dev in devices])
        self.conf.write_text(render_conf(**settings))
        for path in self.root.rglob("*"):
            os.utime(path, ns=(OLD_MTIME_NS, OLD_MTIME_NS), follow_symlinks=False)

    def _add(self, dev: Device, *, configfs: bool) -> None:
        ib = self.root / "sys" / "class" / "infiniband" / dev.name
        (ib / "device" / "net").mkdir(parents=True)
        for port in dev.ports:
            (ib / "ports" / str(port)).mkdir(parents=True)
        if dev.netdev is None:
            return
        (ib / "device" / "net" / dev.netdev).mkdir()
        (self.state / f"{dev.netdev}.json").write_text(
            json.dumps({"trust": dev.trust, "pfc": dev.pfc})
        )
        net = self.root / "sys" / "class" / "net" / dev.netdev
        net.mkdir()
        if dev.ecn_sysfs:
            for point, values in (("roce_np", dev.ecn_np), ("roce_rp", dev.ecn_rp)):
                enable = net / "ecn" / point / "enable"
                enable.mkdir(parents=True)
                for prio, value in enumerate(values):
                    (enable / str(prio)).write_text(f"{value}\n")
            (net / "ecn" / "roce_np" / "cnp_dscp").write_text(f"{dev.cnp_dscp}\n")
            (net / "ecn" / "roce_np" / "cnp_802p_prio").write_text(f"{dev.cnp_prio}\n")
        if configfs and dev.cm_entry:
            for port in dev.ports:
                cm = self.cm_port(dev.name, port)
                cm.mkdir(parents=True)
                (cm / "default_roce_tos").write_text(f"{dev.tos}\n")
                (cm / "default_roce_mode").write_text(f"{dev.roce_mode}\n")

    def cm_port(self, dev: str, port: int) -> Path:
        return self.root / "sys" / "kernel" / "config" / "rdma_cm" / dev / "ports" / str(port)

    def ecn(self, netdev: str, point: str, prio: int) -> Path:
        return self.root / "sys" / "class" / "net" / netdev / "ecn" / point / "enable" / str(prio)

    def run(
        self, *args: str, path: str | None = None, wait_s: int = 0
    ) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": path if path is not None else f"{self.bin}:{SYSTEM_PATH}",
            "LC_ALL": "C",
            "GPUCTL_ROCE_QOS_ROOT": str(self.root),
            "GPUCTL_ROCE_QOS_CONF": str(self.conf),
            "GPUCTL_ROCE_QOS_WAIT_S": str(wait_s),
        }
        return subprocess.run(
            [str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30, check=False
        )

    def calls(self) -> list[list[str]]:
        """mlnx_qos argument vectors since the last call of this method."""
        lines = self.log.read_text().splitlines()
        self.log.write_text("")
        return [json.loads(line) for line in lines]

    def qos(self, netdev: str) -> dict[str, Any]:
        state = json.loads((self.state / f"{netdev}.json").read_text())
        assert isinstance(state, dict)
        return state

    def snapshot(self) -> dict[str, tuple[str, int]]:
        """Every file of the fake root: its content and mtime."""
        return {
            str(p.relative_to(self.root)): (p.read_text(), p.stat().st_mtime_ns)
            for p in sorted(self.root.rglob("*"))
            if p.is_file()
        }

    def changed_since(self, before: dict[str, tuple[str, int]]) -> dict[str, str]:
        """Files written (or added) since ``before``, with their content now."""
        after = self.snapshot()
        assert set(before) <= set(after), "files vanished"
        return {k: v[0] for k, v in after.items() if before.get(k) != v}


def lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path)


# --- the rendered settings -----------------------------------------------------------------


def test_settings_rendered_from_the_role_hold_what_the_script_reads() -> None:
    conf = render_conf(roce_qos_devices=["mlx5_0", "mlx5_1"])
    values = dict(
        line.split("=", 1) for line in conf.splitlines() if line and not line.startswith("#")
    )
    assert values == {
        "ROCE_QOS_DEVICES": '"mlx5_0 mlx5_1"',
        "ROCE_QOS_TRUST": '"dscp"',
        "ROCE_QOS_PFC_PRIORITY": '"3"',
        "ROCE_QOS_TOS": '"104"',
        "ROCE_QOS_ECN": '"1"',
        "ROCE_QOS_CNP_DSCP": '"48"',
        "ROCE_QOS_CNP_PRIORITY": '"6"',
    }


@pytest.mark.parametrize(("dscp", "tos"), [(0, 0), (26, 104), (46, 184), (63, 252)])
def test_tos_is_dscp_shifted_left_by_two(dscp: int, tos: int) -> None:
    assert f'ROCE_QOS_TOS="{tos}"' in render_conf(roce_qos_devices=["x"], roce_qos_dscp=dscp)
    assert tos == dscp << 2


# --- the wanted state: nothing to do --------------------------------------------------------


@pytest.mark.parametrize("mode", ["check", "apply"])
def test_wanted_state_reports_nothing_and_writes_nothing(host: FakeHost, mode: str) -> None:
    host.setup([Device()])
    before = host.snapshot()
    result = host.run(mode)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr == ""
    assert host.calls() == [["-i", "eth0"]]  # read only
    assert host.changed_since(before) == {}
    assert host.system_log.read_text() == ""


def test_default_mode_is_check(host: FakeHost) -> None:
    host.setup([Device(trust="pcp")])
    before = host.snapshot()
    result = host.run()
    assert result.returncode == 1
    assert lines(result.stdout, "drift:") == ["drift: mlx5_0 (eth0) trust is 'pcp', wants 'dscp'"]
    assert host.calls() == [["-i", "eth0"]]
    assert host.changed_since(before) == {}


# --- drift in one setting: check reports exactly it, apply sets exactly it ------------------

ECN_NP_3 = "sys/class/net/eth0/ecn/roce_np/enable/3"
ECN_RP_3 = "sys/class/net/eth0/ecn/roce_rp/enable/3"
CM_TOS = "sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos"
CM_MODE = "sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_mode"


@dataclass(frozen=True)
class Drift:
    device: Device
    drift: str
    applied: str
    qos_call: list[str] | None = None  # the mlnx_qos call that sets it, if any
    written: dict[str, str] = field(default_factory=dict)  # the sysfs files it writes


DRIFTS = {
    "trust": Drift(
        Device(trust="pcp"),
        "drift: mlx5_0 (eth0) trust is 'pcp', wants 'dscp'",
        "applied: mlx5_0 (eth0) trust 'pcp' -> 'dscp'",
        qos_call=["-i", "eth0", "--trust", "dscp"],
    ),
    "pfc-off": Drift(
        Device(pfc=[0] * 8),
        "drift: mlx5_0 (eth0) pfc is '0,0,0,0,0,0,0,0', wants '0,0,0,1,0,0,0,0'",
        "applied: mlx5_0 (eth0) pfc '0,0,0,0,0,0,0,0' -> '0,0,0,1,0,0,0,0'",
        qos_call=["-i", "eth0", "--pfc", "0,0,0,1,0,0,0,0"],
    ),
    "pfc-other-priority": Drift(
        Device(pfc=[0, 0, 0, 1, 1, 0, 0, 0]),
        "drift: mlx5_0 (eth0) pfc is '0,0,0,1,1,0,0,0', wants '0,0,0,1,0,0,0,0'",
        "applied: mlx5_0 (eth0) pfc '0,0,0,1,1,0,0,0' -> '0,0,0,1,0,0,0,0'",
        qos_call=["-i", "eth0", "--pfc", "0,0,0,1,0,0,0,0"],
    ),
    "ecn-np": Drift(
        Device(ecn_np=[0] * 8),
        "drift: mlx5_0 (eth0) ecn roce_np prio 3 is '0', wants '1'",
        "applied: mlx5_0 (eth0) ecn roce_np prio 3 '0' -> '1'",
        written={ECN_NP_3: "1\n"},
    ),
    "ecn-rp": Drift(
        Device(ecn_rp=[0] * 8),
        "drift: mlx5_0 (eth0) ecn roce_rp prio 3 is '0', wants '1'",
        "applied: mlx5_0 (eth0) ecn roce_rp prio 3 '0' -> '1'",
        written={ECN_RP_3: "1\n"},
    ),
    "tos": Drift(
        Device(tos=0),
        "drift: mlx5_0 port 1 default_roce_tos is '0', wants '104'",
        "applied: mlx5_0 port 1 default_roce_tos '0' -> '104'",
        written={CM_TOS: "104\n"},
    ),
    "roce-mode": Drift(
        Device(roce_mode="IB/RoCE v1"),
        "drift: mlx5_0 port 1 default_roce_mode is 'IB/RoCE v1', wants 'RoCE v2'",
        "applied: mlx5_0 port 1 default_roce_mode 'IB/RoCE v1' -> 'RoCE v2'",
        written={CM_MODE: "RoCE v2\n"},
    ),
}


@pytest.mark.parametrize("case", DRIFTS.values(), ids=DRIFTS.keys())
def test_check_reports_exactly_the_drifting_setting(host: FakeHost, case: Drift) -> None:
    host.setup([case.device])
    before = host.snapshot()
    result = host.run("check")
    assert result.returncode == 1, result.stderr
    assert lines(result.stdout, "drift:") == [case.drift]
    assert lines(result.stdout, "applied:") == []
    assert host.calls() == [["-i", "eth0"]]  # check never sets
    assert host.changed_since(before) == {}


@pytest.mark.parametrize("case", DRIFTS.values(), ids=DRIFTS.keys())
def test_apply_sets_exactly_the_drifting_setting(host: FakeHost, case: Drift) -> None:
    host.setup([case.device])
    before = host.snapshot()
    result = host.run("apply")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert lines(result.stdout, "applied:") == [case.applied]
    assert lines(result.stdout, "drift:") == []
    expected_calls = [["-i", "eth0"]] + ([case.qos_call] if case.qos_call else [])
    assert host.calls() == expected_calls
    assert host.changed_since(before) == case.written
    assert host.qos("eth0") == {"trust": "dscp", "pfc": WANTED_PFC}

    again = host.run("check")  # converged: a second run of the role changes nothing
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout == ""
    assert host.calls() == [["-i", "eth0"]]


def test_every_setting_drifting_at_once(host: FakeHost) -> None:
    host.setup(
        [
            Device(
                trust="pcp",
                pfc=[0] * 8,
                ecn_np=[0] * 8,
                ecn_rp=[0] * 8,
                tos=0,
                roce_mode="IB/RoCE v1",
            )
        ]
    )
    check = host.run("check")
    assert check.returncode == 1
    one_each = [c.drift for name, c in DRIFTS.items() if name != "pfc-other-priority"]
    assert lines(check.stdout, "drift:") == one_each
    host.calls()

    applied = host.run("apply")
    assert applied.returncode == 0, applied.stderr
    assert len(lines(applied.stdout, "applied:")) == 6
    assert host.calls() == [
        ["-i", "eth0"],
        ["-i", "eth0", "--trust", "dscp"],
        ["-i", "eth0", "--pfc", "0,0,0,1,0,0,0,0"],
    ]
    assert host.run("check").returncode == 0


def test_settings_other_than_the_defaults(host: FakeHost) -> None:
    """PFC/ECN priority 5, trust pcp, DSCP 46 (ToS 184), ECN off, from the default state."""
    host.setup(
        [Device()],
        roce_qos_trust="pcp",
        roce_qos_pfc_priority=5,
        roce_qos_dscp=46,
        roce_qos_ecn=False,
    )
    host.ecn("eth0", "roce_np", 5).write_text("1\n")
    host.ecn("eth0", "roce_rp", 5).write_text("1\n")
    os.utime(host.ecn("eth0", "roce_np", 5), ns=(OLD_MTIME_NS, OLD_MTIME_NS))
    os.utime(host.ecn("eth0", "roce_rp", 5), ns=(OLD_MTIME_NS, OLD_MTIME_NS))
    before = host.snapshot()
    result = host.run("apply")
    assert result.returncode == 0, result.stderr
    assert lines(result.stdout, "applied:") == [
        "applied: mlx5_0 (eth0) trust 'dscp' -> 'pcp'",
        "applied: mlx5_0 (eth0) pfc '0,0,0,1,0,0,0,0' -> '0,0,0,0,0,1,0,0'",
        "applied: mlx5_0 (eth0) ecn roce_np prio 5 '1' -> '0'",
        "applied: mlx5_0 (eth0) ecn roce_rp prio 5 '1' -> '0'",
        "applied: mlx5_0 port 1 default_roce_tos '104' -> '184'",
    ]
    assert host.changed_since(before) == {
        "sys/class/net/eth0/ecn/roce_np/enable/5": "0\n",
        "sys/class/net/eth0/ecn/roce_rp/enable/5": "0\n",
        CM_TOS: "184\n",
    }
    assert host.qos("eth0") == {"trust": "pcp", "pfc": [0, 0, 0, 0, 0, 1, 0, 0]}
    assert host.run("check").returncode == 0


def test_two_devices_and_two_ports(host: FakeHost) -> None:
    host.setup([Device(), Device(name="mlx5_1", netdev="eth1", ports=(1, 2), tos=0)])
    check = host.run("check")
    assert check.returncode == 1
    assert lines(check.stdout, "drift:") == [
        "drift: mlx5_1 port 1 default_roce_tos is '0', wants '104'",
        "drift: mlx5_1 port 2 default_roce_tos is '0', wants '104'",
    ]
    assert host.calls() == [["-i", "eth0"], ["-i", "eth1"]]
    assert host.run("apply").returncode == 0
    assert (host.cm_port("mlx5_1", 2) / "default_roce_tos").read_text() == "104\n"
    assert (host.cm_port("mlx5_0", 1) / "default_roce_tos").read_text() == "104\n"
    assert host.run("check").returncode == 0


# --- what the script cannot do: exit 2 -----------------------------------------------------


@pytest.mark.parametrize("mode", ["check", "apply"])
def test_device_without_netdev_is_an_error(host: FakeHost, mode: str) -> None:
    host.setup([Device(netdev=None)])
    before = host.snapshot()
    result = host.run(mode)
    assert result.returncode == 2
    assert (
        result.stderr == "error: mlx5_0: no netdev under /sys/class/infiniband/mlx5_0/device/net\n"
    )
    assert host.calls() == []
    assert host.changed_since(before) == {}


def test_check_does_not_wait_for_a_netdev(host: FakeHost) -> None:
    """Only apply (at boot, before udev is done) waits; the role's check answers at once."""
    host.setup([Device(netdev=None)])
    result = host.run("check", wait_s=600)  # subprocess timeout is 30 s
    assert result.returncode == 2


def test_apply_gets_on_with_the_other_devices_then_fails(host: FakeHost) -> None:
    host.setup([Device(netdev=None), Device(name="mlx5_1", netdev="eth1", trust="pcp")])
    result = host.run("apply")
    assert result.returncode == 2
    assert "error: mlx5_0: no netdev" in result.stderr
    assert lines(result.stdout, "applied:") == ["applied: mlx5_1 (eth1) trust 'pcp' -> 'dscp'"]
    assert host.calls() == [["-i", "eth1"], ["-i", "eth1", "--trust", "dscp"]]


@pytest.mark.parametrize("mode", ["check", "apply"])
def test_mlnx_qos_missing_is_an_error(host: FakeHost, mode: str) -> None:
    if shutil.which("mlnx_qos", path=SYSTEM_PATH):
        pytest.skip("this machine has a real mlnx_qos")
    host.setup([Device()])
    before = host.snapshot()
    result = host.run(mode, path=SYSTEM_PATH)
    assert result.returncode == 2
    assert "error: mlx5_0 (eth0): mlnx_qos -i eth0 failed" in result.stderr
    assert host.changed_since(before) == {}


def test_mlnx_qos_failing_is_an_error(host: FakeHost) -> None:
    host.setup([Device()])
    (host.state / "eth0.json").unlink()  # the fake then answers as for an unknown interface
    result = host.run("check")
    assert result.returncode == 2
    assert "error: mlx5_0 (eth0): mlnx_qos -i eth0 failed: No such device: eth0" in result.stderr


@pytest.mark.parametrize("mode", ["check", "apply"])
def test_missing_settings_file_is_an_error(host: FakeHost, mode: str) -> None:
    host.setup([Device(trust="pcp")])
    host.conf.unlink()
    result = host.run(mode)
    assert result.returncode == 2  # not 1, which the role would take for drift
    assert f"error: cannot read {host.conf}" in result.stderr
    assert host.calls() == []


def test_incomplete_settings_file_is_an_error(host: FakeHost) -> None:
    host.setup([Device()])
    host.conf.write_text('ROCE_QOS_DEVICES="mlx5_0"\nROCE_QOS_TRUST="dscp"\n')
    result = host.run("check")
    assert result.returncode == 2
    assert "does not set ROCE_QOS_PFC_PRIORITY" in result.stderr
    assert host.calls() == []


def test_unknown_mode_is_a_usage_error(host: FakeHost) -> None:
    host.setup([Device()])
    result = host.run("dry-run")
    assert result.returncode == 2
    assert "usage:" in result.stderr
    assert host.calls() == []


# --- what the script leaves or reports without failing -------------------------------------


def test_no_ecn_sysfs_is_a_note_not_drift(host: FakeHost) -> None:
    """The inbox driver has no ecn/ directory; the firmware default stays."""
    host.setup([Device(ecn_sysfs=False)])
    for mode in ("check", "apply"):
        result = host.run(mode)
        assert result.returncode == 0, result.stderr
        assert lines(result.stdout, "drift:") == lines(result.stdout, "applied:") == []
        assert len(lines(result.stdout, "note: mlx5_0 (eth0): no roce_np ECN sysfs")) == 1
        assert len(lines(result.stdout, "note: mlx5_0 (eth0): no roce_rp ECN sysfs")) == 1


def test_check_without_rdma_cm_configfs_is_drift(host: FakeHost) -> None:
    host.setup([Device()], configfs=False)
    result = host.run("check")
    assert result.returncode == 1
    assert lines(result.stdout, "drift:") == ["drift: mlx5_0 rdma_cm configfs is not set up"]


def test_apply_under_a_fake_root_never_mounts_configfs(host: FakeHost) -> None:
    """Under GPUCTL_ROCE_QOS_ROOT the script neither loads rdma_cm nor mounts configfs; with no
    rdma_cm directory it can only fail (on a host it would modprobe and mount first)."""
    host.setup([Device()], configfs=False)
    result = host.run("apply")
    assert result.returncode == 2
    assert "error: mlx5_0: cannot mount configfs or load rdma_cm" in result.stderr
    assert host.system_log.read_text() == ""
    assert not (host.root / "sys" / "kernel" / "config" / "rdma_cm").exists()


def test_check_without_the_device_configfs_entry_is_drift(host: FakeHost) -> None:
    host.setup([Device(cm_entry=False)])
    before = host.snapshot()
    result = host.run("check")
    assert result.returncode == 1
    assert lines(result.stdout, "drift:") == ["drift: mlx5_0 has no rdma_cm configfs entry"]
    assert host.changed_since(before) == {}


# --- the role reads the exit codes as the script defines them ------------------------------


def test_role_runs_check_then_apply_on_exit_1_only() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "configure.yml").read_text())
    by_argv = {
        tuple(t["ansible.builtin.command"]["argv"]): t
        for t in tasks
        if "ansible.builtin.command" in t
    }
    check = by_argv[("{{ __roce_qos_script }}", "check")]
    apply = by_argv[("{{ __roce_qos_script }}", "apply")]
    assert check["register"] == "__roce_qos_state"
    assert check["failed_when"] == "__roce_qos_state.rc not in [0, 1]"
    assert check["changed_when"] == "ansible_check_mode and __roce_qos_state.rc == 1"
    assert apply["when"] == "__roce_qos_state.rc | default(0) == 1"
    unit = (ROLE / "templates" / "gpuctl-roce-qos.service.j2").read_text()
    assert "ExecStart={{ __roce_qos_script }} apply\n" in unit
    assert "GPUCTL_ROCE_QOS" not in unit + json.dumps(tasks)  # test hooks stay unset
