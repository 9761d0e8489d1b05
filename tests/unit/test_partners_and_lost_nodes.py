"""ib_write_bw for `validate --limit` (partners outside the limit, else a loopback), a node whose
connection dies during the run (lost: noticed at once, its peers paired again), and how long a
timed-out probe ran. The transport is the fake of test_collect (the lab's simulator answers);
the controller answers `scontrol show node`."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko  # type: ignore[import-untyped]
from test_collect import (
    FakeConnector,
    FakeRunning,
    FakeSession,
    Sim,
    _connector,
    _ExecServer,
    _exps,
    _Iface,
    _scripted,
    verdicts,
)

from gpuctl.config import load_cluster
from gpuctl.config.derived import nodes as cluster_nodes
from gpuctl.lab.sim.perf import WAITING
from gpuctl.remote import ExecResult, Target
from gpuctl.remote.ssh import tune_socket
from gpuctl.validation.api import validate
from gpuctl.validation.collector import Collector
from gpuctl.validation.results import Verdict


def scontrol_text(states: Mapping[str, tuple[str, str | None]]) -> str:
    """`scontrol show node` records: node -> (State, Reason)."""
    out = []
    for node, (state, reason) in states.items():
        out.append(f"NodeName={node} Arch=x86_64 CoresPerSocket=2 \n   State={state} "
                   "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A\n"
                   "   Partitions=gpu \n")  # fmt: skip
        if reason:
            out.append(f"   Reason={reason} [root@2026-12-01T05:00:00]\n")
        out.append("\n")
    return "".join(out)


class WithSlurm:
    """The simulator, and `scontrol show node` on the controller."""

    def __init__(self, states: Mapping[str, tuple[str, str | None]]) -> None:
        self.sim = Sim()
        self.states = dict(states)

    def __call__(self, node: str, argv: list[str]) -> FakeRunning:
        if argv[:3] == ["scontrol", "show", "node"]:
            return FakeRunning(ExecResult(scontrol_text(self.states).encode(), b"", 0))
        return self.sim(node, argv)


IDLE = ("IDLE", None)


def _standard(cluster_yml: Path, tmp_path: Path, conn: Any, limit: str, **kw: Any) -> Any:
    """`validate --level standard --limit LIMIT` over ``conn`` into tmp_path/b."""
    return validate(
        load_cluster(cluster_yml),
        level="standard",
        limit=limit,
        out=tmp_path / "b",
        connector=conn,
        **kw,
    )


def _bw(res: Any, node: str) -> list[Any]:
    return [
        c for c in next(n for n in res.report.nodes if n.node == node).checks
        if c.check == "ib.write_bw"
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------
# Partners outside --limit


def test_a_limited_node_is_measured_against_an_idle_partner_outside_the_limit(
    cluster_yml: Path, tmp_path: Path
) -> None:
    """Old code: `--limit gpu001` at standard gave UNKNOWN 'no other reachable node'."""
    states = {
        "gpu001": IDLE,
        "gpu002": ("IDLE+DRAIN", "maintenance"),  # drained by someone else: never a partner
        "gpu003": ("MIXED", None),
    }
    conn = FakeConnector(WithSlurm(states))
    res = _standard(cluster_yml, tmp_path, conn, "gpu001", history=tmp_path / "validated.json")
    assert [n.node for n in res.report.nodes] == ["gpu001"]  # the partner is not judged
    bw = _bw(res, "gpu001")
    assert [c.verdict for c in bw] == [Verdict.OK] * 8, [c.message for c in bw]
    assert all(c.message.endswith("(with partner gpu003 (outside --limit))") for c in bw)
    assert [(p.server, p.client, p.passed) for p in res.pairs] == [("gpu003", "gpu001", True)]
    header = json.loads((res.bundle / "bundle.json").read_text())
    assert header["pairs"][0]["partner"] == "gpu003"
    assert not (res.bundle / "gpu003").exists()  # the partner's side is not recorded
    assert {n for n, _ in conn.log} == {"ctl01", "gpu001", "gpu003"}  # gpu002 never touched
    assert [n for n, c in conn.log if "scontrol show node" in c] == ["ctl01"]  # read once
    # the history now says gpu001 passed
    history = json.loads((tmp_path / "validated.json").read_text())
    assert history["nodes"]["gpu001"]["passed"] is True
    assert history["nodes"]["gpu001"]["level"] == "standard"


def test_idle_partners_come_first(cluster_yml: Path, tmp_path: Path) -> None:
    states = {"gpu001": IDLE, "gpu002": ("ALLOCATED", None), "gpu003": IDLE}
    res = _standard(cluster_yml, tmp_path, FakeConnector(WithSlurm(states)), "gpu001")
    assert [p.server for p in res.pairs] == ["gpu003"]


def test_no_partner_means_a_loopback_between_the_nodes_own_hcas_said_in_the_verdict(
    cluster_yml: Path, tmp_path: Path
) -> None:
    """The rollout batch (exclude) and a failed last validation keep nodes out; then the node
    is measured against itself (server on HCA i+4, client on HCA i), and the verdict says why."""
    history = tmp_path / "validated.json"
    history.write_text(json.dumps({"nodes": {"gpu002": {"passed": False}}}))
    conn = FakeConnector(WithSlurm({"gpu001": IDLE, "gpu002": IDLE, "gpu003": IDLE}))
    res = _standard(
        cluster_yml, tmp_path, conn, "gpu001", exclude={"gpu001", "gpu003"}, history=history
    )
    bw = _bw(res, "gpu001")
    assert [c.verdict for c in bw] == [Verdict.OK] * 8, [c.message for c in bw]
    assert "(loopback: server on mlx5_4 of the same node; no partner outside --limit: " in (
        bw[0].message
    )
    assert "gpu002 failed its last validation" in bw[0].message
    assert "gpu003 in the same rollout batch" in bw[0].message
    assert [(p.server, p.client) for p in res.pairs] == [("gpu001", "gpu001")]
    # (the GPUDirect RDMA loopbacks, one per GPU, run before: left out here)
    ib = [c for n, c in conn.log if n == "gpu001" and "ib_write_bw" in c and "--use_cuda" not in c]
    assert "ib_write_bw -d mlx5_4 -p 18515" in ib[0]  # server
    assert "ib_write_bw -d mlx5_0 -p 18515" in ib[1]  # client, to the node's own address
    assert ib[1].endswith("198.18.0.11")
    assert not any(n in ("gpu002", "gpu003") for n, _ in conn.log)
    assert json.loads(history.read_text())["nodes"]["gpu002"] == {"passed": False}  # kept


def test_slurm_that_cannot_be_read_gives_no_partner(cluster_yml: Path, tmp_path: Path) -> None:
    sim = Sim()

    def answer(node: str, argv: list[str]) -> FakeRunning:
        if argv[:3] == ["scontrol", "show", "node"]:
            return FakeRunning(ExecResult(b"", b"slurm_load_node error: Unable to contact\n", 1))
        return sim(node, argv)

    res = _standard(cluster_yml, tmp_path, FakeConnector(answer), "gpu002")
    bw = _bw(res, "gpu002")
    assert all("loopback" in c.message and "Unable to contact" in c.message for c in bw)


# ------------------------------------------------------------------------------------------
# A node lost during the run


class Hanging(FakeRunning):
    """A command that runs until ``until`` is set or its ``delay`` passes; it can say whether
    it is done (as the SSH transport can). ``lost``: it ended because its node died."""

    def __init__(
        self,
        result: ExecResult,
        delay: float,
        until: threading.Event,
        *,
        lost: bool = False,
        banner: str | None = None,
    ) -> None:
        super().__init__(result, delay, banner)
        self.until = until
        self.lost = lost
        self.started = time.monotonic()

    def done(self) -> bool:
        return self.until.is_set() or time.monotonic() - self.started >= self.delay

    def wait_for(self, text: str, timeout: float) -> bool:
        if self.banner is not None and text in self.banner:
            return True
        time.sleep(min(timeout, 0.05))
        return False

    def finish(self, timeout: float) -> ExecResult:
        end = time.monotonic() + timeout
        while not self.done() and time.monotonic() < end:
            time.sleep(0.02)
        if self.until.is_set() and self.lost:
            return ExecResult(error="ssh: the connection to the node was lost")
        if not self.done():
            return ExecResult(timed_out=True)
        return self.result if self.until.is_set() else ExecResult(timed_out=True)


@dataclass
class PowerCut:
    """The simulator, where ``node`` loses power ``after_s`` seconds into its first ib_write_bw:
    its commands end with an error, its connection says it is lost. As the real tool, an
    ib_write_bw server waits until its client has run, and a client pointing at a server that
    is gone hangs."""

    node: str
    address: Mapping[str, str]
    after_s: float = 0.3
    sim: Sim = field(default_factory=Sim)
    dead: threading.Event = field(default_factory=threading.Event)
    timer: threading.Timer | None = None
    served: dict[tuple[str, str], threading.Event] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _served(self, address: str, port: str) -> threading.Event:
        with self.lock:
            return self.served.setdefault((address, port), threading.Event())

    def __call__(self, node: str, argv: list[str]) -> FakeRunning:
        if node == self.node and self.dead.is_set():
            return FakeRunning(ExecResult(error="ssh: the connection is closed"))
        if argv[0] != "ib_write_bw":
            return self.sim(node, argv)
        port = argv[argv.index("-p") + 1]
        is_server = argv[-1].startswith("-")
        if node == self.node:
            if self.timer is None:
                self.timer = threading.Timer(self.after_s, self.dead.set)
                self.timer.start()
            banner = WAITING if is_server else None
            return Hanging(ExecResult(), 30, self.dead, lost=True, banner=banner)
        if is_server:
            text = self.sim(node, argv).result
            served = self._served(self.address[node], port)
            served.clear()
            return Hanging(text, 30, served, banner=WAITING)
        if argv[-1] == self.address[self.node]:  # a client of the node that dies
            return Hanging(ExecResult(timed_out=True), 30, threading.Event())
        self._served(argv[-1], port).set()
        return self.sim(node, argv)


@dataclass
class LossySession(FakeSession):
    cut: PowerCut | None = None

    def lost(self) -> str | None:
        if self.cut is not None and self.node == self.cut.node and self.cut.dead.is_set():
            return "ssh: the connection to the node was lost"
        return None


@dataclass
class LossyConnector(FakeConnector):
    cut: PowerCut | None = None

    def connect(self, target: Target) -> FakeSession:
        plain = super().connect(target)
        return LossySession(plain.node, plain.answer, plain.log, plain.on_close, cut=self.cut)


def test_a_node_that_loses_power_is_lost_at_once_and_its_peers_are_paired_again(
    cluster_yml: Path, tmp_path: Path
) -> None:
    """Old code: the healthy peers' ib_write_bw waited out their timeouts (the run stalled for
    minutes), they failed for it, and the lost node was not counted unreachable."""
    address = {n.name: n.address for n in cluster_nodes(load_cluster(cluster_yml))}
    cut = PowerCut("gpu002", {n: str(a) for n, a in address.items()})
    conn = LossyConnector(cut, cut=cut)
    started = time.monotonic()
    res = validate(load_cluster(cluster_yml), level="standard", out=tmp_path / "b", connector=conn)
    assert time.monotonic() - started < 15
    assert res.failed_nodes == ["gpu002"]
    assert res.unreachable["gpu002"].startswith("lost: ssh: ")
    reach = next(n for n in res.report.nodes if n.node == "gpu002").checks
    assert [(c.check, c.verdict) for c in reach] == [("node.reachable", Verdict.FAIL)]
    assert "lost" in reach[0].message
    for node in ("gpu001", "gpu003"):  # never failed for it: paired again, measured
        assert verdicts(res.report, node, "ib.write_bw") == [Verdict.OK] * 8, node
    header = json.loads((res.bundle / "bundle.json").read_text())
    assert set(header["lost"]) == {"gpu002"}
    assert any(p.get("lost") == ["gpu002"] for p in header["pairs"])


# ------------------------------------------------------------------------------------------
# How long a timed-out probe ran


def test_a_timed_out_probe_records_how_long_it_ran(cluster_yml: Path, tmp_path: Path) -> None:
    """Old code: a transport that reports a timeout without a duration left 0.0 s in
    meta.json."""

    class Slow(FakeRunning):
        def finish(self, timeout: float) -> ExecResult:
            time.sleep(0.3)
            return ExecResult(timed_out=True)  # no duration, as a transport may say it

    conn = FakeConnector(_scripted({"nvidia-smi -q -x": Slow(ExecResult())}))
    Collector(conn, _exps(cluster_yml), level="quick").collect(
        [Target("gpu001", "198.18.0.11")], tmp_path / "b"
    )
    probe = json.loads((tmp_path / "b" / "gpu001" / "meta.json").read_text())["probes"]["smi-xml"]
    assert probe["timed_out"] is True
    assert probe["seconds"] >= 0.3


# ------------------------------------------------------------------------------------------
# The SSH transport: a connection that dies under a command is lost, at once


class _Hold(_Iface):
    """Accepts every command and runs nothing: the command 'runs' until the node dies."""

    def check_channel_exec_request(self, channel: Any, command: bytes) -> bool:
        return True


class _HoldServer(_ExecServer):
    def interface(self) -> paramiko.ServerInterface:
        return _Hold(self.client_key)


def test_paramiko_a_connection_that_dies_under_a_command_is_lost_not_timed_out(
    tmp_path: Path,
) -> None:
    """Old code: the result said 'ended without an exit status (killed by a signal?)', not
    told apart from a command that died on a node that is still there; the socket had no
    user timeout (a node that loses power sends nothing: minutes of TCP retransmissions)."""
    host_key, client_key = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
    key = tmp_path / "id_ecdsa"
    client_key.write_private_key_file(str(key))
    server = _HoldServer(host_key, client_key)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{server.port} {host_key.get_name()} {host_key.get_base64()}\n")
    link = _connector(known, key, server.port).connect(Target("n1", "127.0.0.1"))
    try:
        sock = link.client.get_transport().sock
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 8000
        assert link.lost() is None
        running = link.start("ib_write_bw -d mlx5_0")
        threading.Timer(0.3, server.close).start()  # the node loses power
        started = time.monotonic()
        res = running.finish(30)
        assert time.monotonic() - started < 5
        assert res.lost is True
        assert res.timed_out is False
        assert "lost" in (res.error or "")
        assert res.seconds > 0.2
        assert link.lost() is not None
        again = link.start("true").finish(5)  # the next command: lost at once
        assert again.lost is True
    finally:
        link.close()


def test_tune_socket_leaves_what_is_not_a_tcp_socket() -> None:
    assert tune_socket(object()) is False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        assert tune_socket(s, 5) is True
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 5000


def test_a_node_lost_during_its_own_probes_is_lost_and_left_out_of_the_pairs(
    cluster_yml: Path, tmp_path: Path
) -> None:
    """Power lost in the first seconds (its own probes): lost, counted unreachable, and the two
    others pair with each other."""
    address = {n.name: str(n.address) for n in cluster_nodes(load_cluster(cluster_yml))}
    cut = PowerCut("gpu002", address)
    cut.dead.set()  # gone before its first command ends
    conn = LossyConnector(cut, cut=cut)
    res = validate(load_cluster(cluster_yml), level="standard", out=tmp_path / "b", connector=conn)
    assert res.failed_nodes == ["gpu002"]
    assert res.unreachable["gpu002"].startswith("lost: ")
    assert {frozenset((p.server, p.client)) for p in res.pairs} == {frozenset(("gpu001", "gpu003"))}
    for node in ("gpu001", "gpu003"):
        assert verdicts(res.report, node, "ib.write_bw") == [Verdict.OK] * 8
