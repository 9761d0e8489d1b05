"""The collector without SSH: a fake transport that answers with the lab's hardware simulator
(the same stand-in code lab nodes run), or with scripted results for timeouts, exit codes,
unreachable nodes and concurrency. What the bundle holds and how the core judges it."""

from __future__ import annotations

import io
import itertools
import json
import os
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import paramiko  # type: ignore[import-untyped]
import pytest
from helpers import ROOT

from gpuctl.cli.validate_cmd import default_out
from gpuctl.config import load_cluster
from gpuctl.errors import EnvironmentProblem, UsageError
from gpuctl.lab import repo as lab_repo
from gpuctl.lab.sim import fabric as sim_fabric
from gpuctl.lab.sim import faults as sim_faults
from gpuctl.lab.sim import kernel as sim_kernel
from gpuctl.lab.sim import perf as sim_perf
from gpuctl.lab.sim import profiles as sim_profiles
from gpuctl.lab.sim import standin
from gpuctl.remote import ExecResult, Target, Unreachable, command_line, ssh
from gpuctl.validation import gpudirect, scope
from gpuctl.validation.api import judge_bundle, validate
from gpuctl.validation.bundle import load_node_bundle, write_atomic
from gpuctl.validation.capture import capture_output
from gpuctl.validation.collector import Collector
from gpuctl.validation.expect import expectations
from gpuctl.validation.results import Verdict
from gpuctl.validation.scope import select_nodes

PROFILE: dict[str, Any] = json.loads(sim_profiles.profile_json("hgx-h100-ndr"))
# stand-ins a lab package installs outside /usr/bin, by their path (DCGM's nvbandwidth): a
# command by another path is not found, as on a lab node
STANDIN_PATHS = {
    tool: os.path.basename(tool)
    for spec in lab_repo.load_specs()
    for tool in spec.bin
    if tool.startswith("/")
}
BOOT_LINES = (
    "Linux version 6.1.0-31-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14) "
    "12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian 6.1.128-1",
    "Command line: BOOT_IMAGE=/boot/vmlinuz-6.1.0-31-amd64 root=/dev/sda1 ro quiet",
)


# ------------------------------------------------------------------------------------------
# A fake transport


@dataclass
class FakeRunning:
    result: ExecResult
    delay: float = 0.0
    banner: str | None = None  # what wait_for finds at once (an ib_write_bw server)

    def wait_for(self, text: str, timeout: float) -> bool:
        return self.banner is not None and text in self.banner

    def finish(self, timeout: float) -> ExecResult:
        if self.delay > timeout:
            time.sleep(timeout)
            return ExecResult(self.result.stdout, b"", None, timed_out=True, seconds=timeout)
        time.sleep(self.delay)
        return self.result


Answer = Callable[[str, list[str]], FakeRunning]


@dataclass
class FakeSession:
    node: str
    answer: Answer
    log: list[tuple[str, str]]
    on_close: Callable[[], None] = lambda: None

    def start(self, command: str) -> FakeRunning:
        self.log.append((self.node, command))
        words = shlex.split(command)
        if words[:1] == ["timeout"]:
            words = words[4:]  # timeout -k KILL T argv...
        return self.answer(self.node, words)

    def close(self) -> None:
        self.on_close()


@dataclass
class FakeConnector:
    answer: Answer
    unreachable: Mapping[str, str] = field(default_factory=dict)
    connect_delay: float = 0.0
    log: list[tuple[str, str]] = field(default_factory=list)
    active: int = 0
    most_active: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def connect(self, target: Target) -> FakeSession:
        if target.node in self.unreachable:
            raise Unreachable(self.unreachable[target.node])
        with self.lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        time.sleep(self.connect_delay)
        return FakeSession(target.node, self.answer, self.log, self._closed)

    def _closed(self) -> None:
        with self.lock:
            self.active -= 1

    def close(self) -> None:
        pass


def done(stdout: str, rc: int = 0, stderr: str = "") -> FakeRunning:
    return FakeRunning(ExecResult(stdout.encode(), stderr.encode(), rc))


# what `uname -r` prints on every simulated node unless a test gives a node its own ("kernel")
KERNEL = "6.1.0-31-amd64"


def slurmd_c(node: str, cpus: tuple[int, int, int] = (1, 2, 1), memory_mb: int = 24105) -> str:
    """`slurmd -C` as Slurm prints it (tests/fixtures/slurm/slurmd-C-*.txt): by default the lab
    starter's compute layout (1 socket x 2 cores x 1 thread) with more memory than its
    RealMemory=1024; a test gives a node its own with the fault key "slurmd"."""
    s, c, t = cpus
    return (
        f"NodeName={node} CPUs={s * c * t} Boards=1 SocketsPerBoard={s} CoresPerSocket={c} "
        f"ThreadsPerCore={t} RealMemory={memory_mb}\nUpTime=0-01:02:03\n"
    )


# df on a lab node (tests/fixtures/node/, a real capture): its rows by the path asked for
DF_FIXTURE = ROOT / "tests/fixtures/node/df-output-file-debian13-lab-node-overlay-tmpfs.txt"


def df_text(paths: list[str], rows: Mapping[str, str]) -> tuple[str, int, str]:
    """What df prints for ``paths`` on a lab node (stdout, exit status, stderr): the captured
    row of each path (``rows``, by path, replace or add rows: "" is a path df cannot stat), in
    the order asked; exit 1 and df's message for a path without a row, as df does."""
    header, *captured = capture_output(DF_FIXTURE).splitlines()
    known = {line.split()[0]: line for line in captured} | dict(rows)
    out, err = [header], ""
    for path in paths:
        if known.get(path):
            out.append(known[path])
        else:
            err += f"df: {path}: No such file or directory\n"
    return "\n".join(out) + "\n", 1 if err else 0, err


def df_rows(paths: list[str], rows: Mapping[str, str]) -> FakeRunning:
    return done(*df_text(paths, rows))


class Sim:
    """Answers like a lab node: the stand-in tools of gpuctl.lab.sim, faults per node."""

    def __init__(self, faults: Mapping[str, dict[str, Any]] | None = None) -> None:
        self.faults = dict(faults or {})

    def __call__(self, node: str, argv: list[str]) -> FakeRunning:
        faults = self.faults.get(node, {})
        if argv[:1] == ["env"]:  # env NAME=VALUE ... argv (the GPUDirect runs' CUDA_DEVICE_ORDER)
            argv = list(itertools.dropwhile(lambda w: "=" in w, argv[1:]))
        tool, args = argv[0], argv[1:]
        if tool == "journalctl":
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S+0000")
            # boot lines as a kernel logs them; fault lines as the lab logs them (a process
            # under the kernel's identifier: "kernel[PID]:")
            text = "".join(f"{stamp} {node} kernel: {line}\n" for line in BOOT_LINES)
            for line in sim_kernel.kernel_log_lines(PROFILE, faults, node):
                text += f"{stamp} {node} kernel[4711]: {line}\n"
            return done(text)
        if tool == "systemctl":
            text, rc = sim_fabric.systemctl_status(PROFILE, faults, node)
            return done(text, rc)
        if tool == "uname":  # a real tool on lab nodes (the host's kernel), not a stand-in
            return done(f"{faults.get('kernel', KERNEL)}\n")
        if tool == "slurmd" and args == ["-C"]:  # real Slurm on provisioned lab nodes
            return done(faults.get("slurmd") or slurmd_c(node))
        if tool == "date" and args == ["-u", "+%s.%N"]:  # the node's clock: the test host's
            return done(f"{time.time() + faults.get('clock_offset', 0.0):.9f}\n")
        if tool == "df":  # a real tool on lab nodes; a test gives a node its own rows ("df")
            return df_rows(args[args.index("--") + 1 :], faults.get("df", {}))
        if tool in ("ib_write_bw", gpudirect.PERFTEST_CUDA_BIN):
            server = args[-1] if not args[-1].startswith("-") and args[-2] != "-d" else None
            hca = args[args.index("-d") + 1]
            # software.perftest's build with CUDA: its GPU buffer (--use_cuda=N, DMA-BUF)
            gpu = next((int(a[11:]) for a in args if a.startswith("--use_cuda=")), None)
            options = sim_perf.PerftestArgs(
                server=server,
                device=hca,
                size=8 << 20,
                gbits=True,
                port=18515,
                cuda=gpu if tool != "ib_write_bw" else None,
                dmabuf="--use_cuda_dmabuf" in args,
            )
            try:
                text = sim_perf.ib_write_bw(PROFILE, faults, node, options)
            except sim_perf.ToolFailure as exc:
                return FakeRunning(ExecResult(exc.stdout.encode(), exc.output.encode(), 1))
            if server is None:
                return FakeRunning(ExecResult(text.encode(), b"", 0), banner=sim_perf.WAITING)
            return done(text)
        if tool == "ib_write_lat":  # the latency test on the same pair (both sides' table)
            server = args[-1] if not args[-1].startswith("-") and args[-2] != "-d" else None
            hca = args[args.index("-d") + 1]
            lat = sim_perf.PerftestArgs(server=server, device=hca, title="RDMA_Write Latency Test")
            try:
                text = sim_perf.ib_write_lat(PROFILE, faults, node, lat)
            except sim_perf.ToolFailure as exc:
                return FakeRunning(ExecResult(b"", exc.output.encode(), 1))
            if server is None:
                return FakeRunning(ExecResult(text.encode(), b"", 0), banner=sim_perf.WAITING)
            return done(text)
        out, err = io.StringIO(), io.StringIO()
        handler = standin._HANDLERS.get(STANDIN_PATHS.get(tool, tool))
        if handler is None:
            return done("", 127, f"sh: 1: {tool}: not found\n")
        rc = handler(PROFILE, faults, node, args, standin._Out(out, err))
        return done(out.getvalue(), rc, err.getvalue())


def fault(name: str, value: str = "") -> dict[str, Any]:
    return dict(sim_faults.apply({}, name, value))


def fails_only(
    cluster_yml: Path, out: Path, faults: dict[str, Any], check: str, level: str = "quick"
) -> Any:
    """Validate the simulated cluster at ``level`` with ``faults`` on gpu002: asserts that
    gpu002 is the only failed node, on ``check`` alone, and that gpu001 and gpu003 pass that
    check (OK); returns the report."""
    sim = Sim({"gpu002": faults})
    res = validate(load_cluster(cluster_yml), level=level, out=out, connector=FakeConnector(sim))
    failed = {n.node: sorted({c.check for c in n.problems()}) for n in res.report.nodes if n.failed}
    assert failed == {"gpu002": [check]}
    for other in ("gpu001", "gpu003"):
        assert set(verdicts(res.report, other, check)) == {Verdict.OK}, other
    return res.report


def verdicts(report: Any, node: str, check: str) -> list[Verdict]:
    nr = next(n for n in report.nodes if n.node == node)
    return [c.verdict for c in nr.checks if c.check == check]


# ------------------------------------------------------------------------------------------
# The whole run against simulated nodes


def test_quick_on_healthy_nodes_passes_and_runs_only_the_quick_probes(cluster_yml: Path) -> None:
    conn = FakeConnector(Sim())
    res = validate(
        load_cluster(cluster_yml), level="quick", out=cluster_yml.parent / "b", connector=conn
    )
    problems = {n.node: [(c.check, c.message) for c in n.problems()] for n in res.report.nodes}
    assert not res.failed, problems
    assert res.report.level == "quick"
    tools = {shlex.split(cmd)[4] for node, cmd in conn.log if node == "gpu001"}
    assert tools == {"nvidia-smi", "journalctl", "systemctl", "ibstat", "uname", "df"}
    assert {node for node, _ in conn.log} == {"gpu001", "gpu002", "gpu003"}  # ctl01: no probe
    assert verdicts(res.report, "ctl01", "node.reachable") == [Verdict.OK]
    folder = res.bundle / "gpu001"
    assert sorted(p.name for p in folder.iterdir()) == [
        "df.txt",
        "fabricmanager.txt",
        "ibstat.txt",
        "meta.json",
        "nvlink.txt",
        "smi-xml.txt",
        "topo.txt",
        "uname.txt",
        "xid.txt",
    ]
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["probes"]["smi-xml"]["rc"] == 0
    assert meta["probes"]["smi-xml"]["command"] == "nvidia-smi -q -x"
    assert meta["probes"]["xid"]["timed_out"] is False
    header = json.loads((res.bundle / "bundle.json").read_text())
    assert header["complete"] is True
    assert header["nodes"] == ["ctl01", "gpu001", "gpu002", "gpu003"]
    assert json.loads((res.bundle / "results.json").read_text())["summary"]["failed"] == 0


def test_gpu_lost_fails_exactly_that_node_on_gpu_count(cluster_yml: Path) -> None:
    conn = FakeConnector(Sim({"gpu002": fault("gpu_lost", "3")}))
    res = validate(
        load_cluster(cluster_yml), level="quick", out=cluster_yml.parent / "b", connector=conn
    )
    assert res.failed_nodes == ["gpu002"]
    gpu002 = next(n for n in res.report.nodes if n.node == "gpu002")
    count = next(c for c in gpu002.checks if c.check == "gpu.count")
    assert (count.verdict, count.measured, count.expected) == (Verdict.FAIL, 7, 8)
    # the kernel log says which GPU fell off the bus (GPU 3 of the profile: 0000:5d:00)
    assert count.message == "7 GPUs visible, expected 8; missing: 0000:5d:00 (fallen off the bus)"
    assert verdicts(res.report, "gpu002", "xid.fallen_off_bus") == [Verdict.FAIL]


def test_standard_runs_nccl_dcgm_and_ib_write_bw_between_pairs(cluster_yml: Path) -> None:
    conn = FakeConnector(Sim())
    res = validate(
        load_cluster(cluster_yml), level="standard", out=cluster_yml.parent / "b", connector=conn
    )
    problems = {n.node: [(c.check, c.message) for c in n.problems()] for n in res.report.nodes}
    assert not res.failed, problems
    for node in ("gpu001", "gpu002", "gpu003"):
        assert verdicts(res.report, node, "nccl.busbw") == [Verdict.OK]
        assert verdicts(res.report, node, "ib.write_bw") == [Verdict.OK] * 8
        assert verdicts(res.report, node, "ib.write_lat") == [Verdict.OK] * 8
        cmds = [c for n, c in conn.log if n == node]
        assert any("all_reduce_perf -b 8 -e 8G -f 2 -g 8" in c for c in cmds)
        assert any("dcgmi diag -r 2" in c for c in cmds)
        # GPUDirect RDMA: each GPU's memory through the adapter behind its PCIe switch
        assert verdicts(res.report, node, "gpudirect.write_bw") == [Verdict.OK] * 8
        gdr = [c for c in cmds if "--use_cuda=5" in c]
        assert len(gdr) == 2, gdr
        assert all("-d mlx5_5 " in c for c in gdr), gdr
    # three nodes: two rounds (one node sits out each), every node tested at least once
    assert len(res.pairs) == 2
    assert {n for p in res.pairs for n in (p.server, p.client)} == {"gpu001", "gpu002", "gpu003"}
    meta = json.loads((res.bundle / "gpu001" / "meta.json").read_text())
    side = meta["probes"]["perftest-mlx5_0"]
    assert side["role"] in ("server", "client")
    assert "-s 8388608 -F --report_gbits" in side["command"]


def test_gpu_memory_an_adapter_cannot_register_fails_that_node_on_gpudirect_alone(
    cluster_yml: Path, tmp_path: Path
) -> None:
    report = fails_only(
        cluster_yml,
        tmp_path / "b",
        fault("gpudirect_broken", "5"),
        "gpudirect.write_bw",
        "standard",
    )
    node = next(n for n in report.nodes if n.node == "gpu002")
    bad = [c for c in node.checks if c.check == "gpudirect.write_bw"]
    assert [(c.subject, c.verdict) for c in bad if c.verdict is not Verdict.OK] == [
        ("GPU5", Verdict.FAIL)
    ]
    assert "could not register GPU5's memory (Couldn't allocate MR" in bad[5].message


def test_a_slow_adapter_fails_its_node_on_ib_write_lat_and_its_partner_is_cleared(
    cluster_yml: Path, tmp_path: Path
) -> None:
    """ib_write_lat runs on every pair after ib_write_bw (the default 4.2 us limit); 5 us more
    on gpu002's mlx5_2 fails both sides of its first pair, the retests clear the partner."""
    report = fails_only(
        cluster_yml, tmp_path / "b", fault("ib_latency", "mlx5_2:5"), "ib.write_lat", "standard"
    )
    node = next(n for n in report.nodes if n.node == "gpu002")
    lat = {c.subject: c for c in node.checks if c.check == "ib.write_lat"}
    assert lat["mlx5_2"].verdict is Verdict.FAIL
    assert lat["mlx5_2"].message.startswith("99th percentile 6.2 us > 4.2 us (2 B writes)")
    assert [s for s, c in lat.items() if c.verdict is not Verdict.OK] == ["mlx5_2"]


def test_a_failed_pair_is_retested_against_a_good_node(cluster_yml: Path, tmp_path: Path) -> None:
    doc = cluster_yml.read_text().replace('nodes: "gpu[001-003]"', 'nodes: "gpu[001-004]"')
    doc = doc.replace('addresses: "198.18.0.[11-13]"', 'addresses: "198.18.0.[11-14]"')
    doc = doc.replace('addresses: "198.18.1.[11-13]"', 'addresses: "198.18.1.[11-14]"')
    cluster_yml.write_text(doc)
    conn = FakeConnector(Sim({"gpu004": fault("slow_node", "0.5")}))
    res = validate(load_cluster(cluster_yml), level="standard", out=tmp_path / "b", connector=conn)
    first = [p for p in res.pairs if not p.retest]
    again = [p for p in res.pairs if p.retest]
    assert len(first) == 2  # four nodes: one round of two pairs
    bad_pair = next(p for p in first if "gpu004" in (p.server, p.client))
    assert not bad_pair.passed
    partner = bad_pair.server if bad_pair.client == "gpu004" else bad_pair.client
    assert {p.client for p in again} == {"gpu004", partner}
    assert "gpu004" in res.failed_nodes
    assert partner not in res.failed_nodes  # its retest against a good node passed
    assert verdicts(res.report, "gpu004", "ib.write_bw")[0] is Verdict.FAIL


def test_three_nodes_one_bad_hca_only_the_bad_node_fails(cluster_yml: Path) -> None:
    """Every first-round pair involves the bad node; the two others never met: they are
    retested with each other, pass, and only the bad node keeps the failure."""
    conn = FakeConnector(Sim({"gpu003": fault("ib_port_down", "mlx5_2")}))
    res = validate(
        load_cluster(cluster_yml), level="standard", out=cluster_yml.parent / "b", connector=conn
    )
    assert res.failed_nodes == ["gpu003"]
    retests = [(p.server, p.client) for p in res.pairs if p.retest]
    assert retests in ([("gpu001", "gpu002")], [("gpu002", "gpu001")])
    bw = [c for c in next(n for n in res.report.nodes if n.node == "gpu003").checks
          if c.check == "ib.write_bw" and c.subject == "mlx5_2"]  # fmt: skip
    assert bw[0].verdict is Verdict.UNKNOWN
    assert "Port number 1 state is Down" in bw[0].message


def test_unreachable_node_is_a_failed_node_with_its_reason(cluster_yml: Path) -> None:
    conn = FakeConnector(Sim(), unreachable={"gpu003": "ssh: connection to 198.18.0.13:22 refused"})
    res = validate(
        load_cluster(cluster_yml), level="quick", out=cluster_yml.parent / "b", connector=conn
    )
    assert res.failed_nodes == ["gpu003"]
    assert res.unreachable == {"gpu003": "ssh: connection to 198.18.0.13:22 refused"}
    meta = json.loads((res.bundle / "gpu003" / "meta.json").read_text())
    assert meta == {"unreachable": "ssh: connection to 198.18.0.13:22 refused"}
    check = next(n for n in res.report.nodes if n.node == "gpu003").checks
    assert [(c.check, c.verdict) for c in check] == [("node.reachable", Verdict.FAIL)]
    assert "refused" in check[0].message


def test_unreachable_nodes_are_left_out_of_the_pairs(cluster_yml: Path) -> None:
    conn = FakeConnector(Sim(), unreachable={"gpu003": "ssh: timed out"})
    res = validate(
        load_cluster(cluster_yml), level="standard", out=cluster_yml.parent / "b", connector=conn
    )
    assert [(p.server, p.client) for p in res.pairs] in (
        [("gpu001", "gpu002")],
        [("gpu002", "gpu001")],
    )
    assert res.failed_nodes == ["gpu003"]


def test_a_node_alone_on_its_fabric_is_measured_against_itself_and_says_so(
    cluster_yml: Path,
) -> None:
    """No other reachable node (and no --limit, so no partner): a loopback between the node's
    own HCAs (as AzureHPC's health checks), named in each verdict."""
    conn = FakeConnector(Sim(), unreachable={"gpu002": "x", "gpu003": "y"})
    res = validate(
        load_cluster(cluster_yml), level="standard", out=cluster_yml.parent / "b", connector=conn
    )
    bw = [c for c in next(n for n in res.report.nodes if n.node == "gpu001").checks
          if c.check == "ib.write_bw"]  # fmt: skip
    assert len(bw) == 8
    assert {c.verdict for c in bw} == {Verdict.OK}
    assert "(loopback: server on mlx5_4 of the same node)" in bw[0].message
    assert "(loopback: server on mlx5_0 of the same node)" in bw[4].message
    assert res.failed_nodes == ["gpu002", "gpu003"]


def test_limit_collects_and_judges_only_the_selected_nodes(cluster_yml: Path) -> None:
    conn = FakeConnector(Sim())
    res = validate(
        load_cluster(cluster_yml),
        level="quick",
        limit="gpu[001-002]",
        out=cluster_yml.parent / "b",
        connector=conn,
    )
    assert [n.node for n in res.report.nodes] == ["gpu001", "gpu002"]
    assert {node for node, _ in conn.log} == {"gpu001", "gpu002"}
    assert not (res.bundle / "gpu003").exists()


def test_judging_the_bundle_again_gives_the_same_verdicts(cluster_yml: Path) -> None:
    conn = FakeConnector(Sim({"gpu001": fault("xid", "48:2")}))
    res = validate(
        load_cluster(cluster_yml), level="quick", out=cluster_yml.parent / "b", connector=conn
    )
    again = judge_bundle(load_cluster(cluster_yml), res.bundle)
    assert again.report.to_json() == res.report.to_json()
    assert again.level == "quick"
    assert again.failed_nodes == ["gpu001"]


def test_output_dir_must_be_new_or_empty(cluster_yml: Path) -> None:
    out = cluster_yml.parent / "b"
    out.mkdir()
    (out / "x").write_text("x")
    with pytest.raises(UsageError, match="not an empty directory"):
        validate(load_cluster(cluster_yml), level="quick", out=out, connector=FakeConnector(Sim()))


def test_default_bundle_dir_is_beside_cluster_yml(cluster_yml: Path) -> None:
    res = validate(
        load_cluster(cluster_yml),
        level="quick",
        limit="gpu001",
        out=default_out(cluster_yml),
        connector=FakeConnector(Sim()),
    )
    assert res.bundle.parent == cluster_yml.parent / ".gpuctl" / "validate"


# ------------------------------------------------------------------------------------------
# Bookkeeping: timeouts, exit codes, errors, atomic writes, the concurrency bound


def _scripted(table: Mapping[str, FakeRunning]) -> Answer:
    def answer(node: str, argv: list[str]) -> FakeRunning:
        for key, value in table.items():
            if " ".join(argv).startswith(key):
                return value
        return Sim()(node, argv)

    return answer


def _exps(cluster_yml: Path) -> dict[str, Any]:
    return expectations(scope.with_level(load_cluster(cluster_yml), "quick"))


def test_a_timed_out_probe_is_recorded_timed_out_not_an_empty_success(
    cluster_yml: Path, tmp_path: Path
) -> None:
    slow = FakeRunning(ExecResult(b"<?xml", b"", 0), delay=100)
    conn = FakeConnector(_scripted({"nvidia-smi -q -x": slow}))
    collector = Collector(conn, _exps(cluster_yml), level="quick")
    collector._run = _short(collector._run)  # type: ignore[method-assign]
    collector.collect([Target("gpu001", "198.18.0.11")], tmp_path / "b")
    meta = json.loads((tmp_path / "b" / "gpu001" / "meta.json").read_text())
    assert meta["probes"]["smi-xml"]["timed_out"] is True
    assert meta["probes"]["smi-xml"]["rc"] is None
    assert meta["probes"]["smi-xml"]["error"] == "timed out after 60 s"
    bundle = load_node_bundle("gpu001", tmp_path / "b" / "gpu001")
    assert bundle.outputs["smi-xml"].failure() is not None


def _short(run: Callable[..., ExecResult]) -> Callable[..., ExecResult]:
    """The collector's _run with every probe's wait shortened to 0.05 s."""

    def wrapped(session: Any, argv: Any, timeout_s: float) -> ExecResult:
        result: ExecResult = session.start(command_line(argv, timeout_s, become=False)).finish(0.05)
        return result

    return wrapped


def test_the_node_side_timeout_exit_124_counts_as_timed_out(
    cluster_yml: Path, tmp_path: Path
) -> None:
    conn = FakeConnector(_scripted({"ibstat": done("", 124)}))
    Collector(conn, _exps(cluster_yml), level="quick").collect(
        [Target("gpu001", "a")], tmp_path / "b"
    )
    probe = json.loads((tmp_path / "b" / "gpu001" / "meta.json").read_text())["probes"]["ibstat"]
    assert (probe["rc"], probe["timed_out"]) == (124, True)


def test_exit_codes_and_errors_are_kept(cluster_yml: Path, tmp_path: Path) -> None:
    conn = FakeConnector(
        _scripted(
            {
                "nvidia-smi -q -x": done("", 6, "No devices were found\n"),
                "ibstat": done("", 127, "sh: 1: ibstat: not found\n"),
                "nvidia-smi topo": FakeRunning(ExecResult(error="ssh: connection lost")),
            }
        )
    )
    Collector(conn, _exps(cluster_yml), level="quick").collect(
        [Target("gpu001", "a")], tmp_path / "b"
    )
    probes = json.loads((tmp_path / "b" / "gpu001" / "meta.json").read_text())["probes"]
    assert probes["smi-xml"]["rc"] == 6
    assert probes["smi-xml"]["stderr"] == "No devices were found\n"
    assert probes["smi-xml"]["error"] == (
        "nvidia-smi exited with 6, nothing on stdout; stderr: No devices were found"
    )
    assert probes["ibstat"]["error"] == "ibstat: command not found (exit 127)"
    assert probes["topo"]["error"] == "ssh: connection lost"
    assert not (tmp_path / "b" / "gpu001" / "topo.txt").exists()
    assert (tmp_path / "b" / "gpu001" / "smi-xml.txt").read_bytes() == b""


def test_probe_commands_are_quoted_and_bounded_on_the_node() -> None:
    line = command_line(("journalctl", "--since", "-2h"), 30, become=False)
    assert line == "timeout -k 10 30 journalctl --since -2h"
    line = command_line(("scontrol", "update", "reason=gpuctl: x y"), 60, become=True)
    assert line == "sudo -n -- timeout -k 10 60 scontrol update 'reason=gpuctl: x y'"


def test_concurrency_is_bounded_by_parallel(cluster_yml: Path, tmp_path: Path) -> None:
    doc = cluster_yml.read_text().replace('nodes: "gpu[001-003]"', 'nodes: "gpu[001-024]"')
    doc = doc.replace('addresses: "198.18.0.[11-13]"', 'addresses: "198.18.0.[11-34]"')
    doc = doc.replace('addresses: "198.18.1.[11-13]"', 'addresses: "198.18.1.[11-34]"')
    cluster_yml.write_text(doc)
    conn = FakeConnector(Sim(), connect_delay=0.02)
    res = validate(
        load_cluster(cluster_yml), level="quick", out=tmp_path / "b", connector=conn, parallel=5
    )
    assert not res.failed
    assert conn.most_active <= 5
    assert conn.most_active >= 2  # it did run nodes at once
    assert conn.active == 0  # every connection closed


def test_a_stopped_collection_leaves_probes_marked_unfinished(
    cluster_yml: Path, tmp_path: Path
) -> None:
    def boom(node: str, argv: list[str]) -> FakeRunning:
        if argv[0] == "ibstat":
            raise KeyboardInterrupt
        return Sim()(node, argv)

    collector = Collector(FakeConnector(boom), _exps(cluster_yml), level="quick", channels=1)
    with pytest.raises(KeyboardInterrupt):
        collector.collect([Target("gpu001", "a")], tmp_path / "b")
    meta = json.loads((tmp_path / "b" / "gpu001" / "meta.json").read_text())
    assert meta["probes"]["ibstat"]["error"] == "not finished (the collection was stopped)"
    assert json.loads((tmp_path / "b" / "bundle.json").read_text())["complete"] is False
    bundle = load_node_bundle("gpu001", tmp_path / "b" / "gpu001")
    assert bundle.outputs["ibstat"].failure() is not None


def test_write_atomic_replaces_whole_files_and_leaves_no_temporaries(tmp_path: Path) -> None:
    target = tmp_path / "n" / "x.txt"
    write_atomic(target, b"one")
    write_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in target.parent.iterdir()] == ["x.txt"]


def test_write_atomic_keeps_the_old_file_when_writing_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "x.txt"
    write_atomic(target, b"old")

    def broken(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="No space"):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.txt"]


# ------------------------------------------------------------------------------------------
# Selection, levels, SSH settings


def test_limit_takes_node_sets_and_group_names(cluster_yml: Path) -> None:
    cluster = load_cluster(cluster_yml)
    assert select_nodes(cluster, "gpu[001,003]") == ["gpu001", "gpu003"]
    assert select_nodes(cluster, "ctl,gpu002") == ["ctl01", "gpu002"]
    with pytest.raises(UsageError, match=r"not in the cluster: gpu\[007-008\]"):
        select_nodes(cluster, "gpu[007-008]")


def test_level_override_reaches_every_group(cluster_yml: Path) -> None:
    cluster = scope.with_level(load_cluster(cluster_yml), "long")
    assert {e.level for e in expectations(cluster).values()} == {"long"}
    with pytest.raises(UsageError):
        scope.with_level(load_cluster(cluster_yml), "fast")


def test_ssh_settings_resolve_beside_cluster_yml_and_need_known_hosts(cluster_yml: Path) -> None:
    cluster = load_cluster(cluster_yml)
    key = cluster_yml.parent / ".gpuctl" / "lab" / "id_ed25519"
    key.write_text("not read here")
    s = ssh.ssh_settings(cluster)
    assert s.known_hosts == cluster_yml.parent / ".gpuctl" / "lab" / "known_hosts"
    assert s.private_key == key
    assert s.become is False  # root needs no sudo
    (cluster_yml.parent / ".gpuctl" / "lab" / "known_hosts").unlink()
    with pytest.raises(EnvironmentProblem, match="known_hosts"):
        ssh.ssh_settings(cluster)


# ------------------------------------------------------------------------------------------
# The paramiko transport against an in-process SSH server (paramiko's server side, commands
# run with /bin/sh on this machine): exit codes, stderr, timeouts and every refusal


class _ExecServer:
    """A tiny SSH server on 127.0.0.1 that runs exec requests with /bin/sh."""

    def __init__(self, host_key: Any, client_key: Any) -> None:
        self.host_key = host_key
        self.client_key = client_key
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.transports: list[Any] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = paramiko.Transport(conn)
            t.add_server_key(self.host_key)
            self.transports.append(t)
            # with an event start_server returns at once: a client that gave up on a
            # connection (a refused host key) never keeps the next one from being accepted
            t.start_server(event=threading.Event(), server=self.interface())

    def interface(self) -> paramiko.ServerInterface:
        """What answers the client's requests (a subclass answers otherwise)."""
        return _Iface(self.client_key)

    def close(self) -> None:
        self.sock.close()
        for t in self.transports:
            t.close()


class _Iface(paramiko.ServerInterface):  # type: ignore[misc]
    def __init__(self, client_key: Any) -> None:
        self.client_key = client_key

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: Any) -> int:
        ok = key.asbytes() == self.client_key.asbytes()
        return int(paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED)

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return int(paramiko.OPEN_SUCCEEDED)

    def check_channel_exec_request(self, channel: Any, command: bytes) -> bool:
        threading.Thread(target=_serve, args=(channel, command), daemon=True).start()
        return True


def _serve(channel: Any, command: bytes) -> None:
    proc = subprocess.Popen(  # noqa: S602 - the test server runs the test's own commands
        command.decode(), shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out = proc.stdout
    assert out is not None
    for chunk in iter(lambda: os.read(out.fileno(), 4096), b""):
        channel.sendall(chunk)
    err = proc.stderr.read() if proc.stderr else b""
    if err:
        channel.sendall_stderr(err)
    channel.send_exit_status(proc.wait())
    channel.close()


@pytest.fixture
def ssh_server(tmp_path: Path) -> Any:
    host_key = paramiko.ECDSAKey.generate()
    client_key = paramiko.ECDSAKey.generate()
    key_file = tmp_path / "id_ecdsa"
    client_key.write_private_key_file(str(key_file))
    server = _ExecServer(host_key, client_key)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{server.port} {host_key.get_name()} {host_key.get_base64()}\n")
    yield server, known, key_file
    server.close()


def _connector(known: Path, key: Path, port: int) -> ssh.ParamikoConnector:
    return ssh.ParamikoConnector(ssh.SshSettings("root", port, 5.0, known, key, become=False))


def test_paramiko_runs_commands_with_exit_code_stdout_and_stderr(ssh_server: Any) -> None:
    server, known, key = ssh_server
    session = _connector(known, key, server.port).connect(Target("n1", "127.0.0.1"))
    try:
        res = session.start("echo out; echo err >&2; exit 3").finish(10)
        assert (res.stdout, res.stderr, res.rc, res.timed_out) == (b"out\n", b"err\n", 3, False)
        res = session.start(command_line(["printf", "%s", "a b"], 5, become=False)).finish(10)
        assert (res.stdout, res.rc) == (b"a b", 0)
        running = session.start("echo '* Waiting for client to connect... *'; sleep 0.3; echo x")
        assert running.wait_for("Waiting for client", 5)
        assert running.finish(5).stdout.endswith(b"x\n")
    finally:
        session.close()


def test_paramiko_reports_a_command_that_outlives_its_wait_as_timed_out(ssh_server: Any) -> None:
    server, known, key = ssh_server
    session = _connector(known, key, server.port).connect(Target("n1", "127.0.0.1"))
    try:
        started = time.monotonic()
        res = session.start("echo partial; sleep 5").finish(0.5)
        assert time.monotonic() - started < 3
        assert (res.timed_out, res.rc, res.stdout) == (True, None, b"partial\n")
        # the node's own `timeout` ends a command and says so with exit 124
        res = session.start(command_line(["sleep", "5"], 1, become=False)).finish(10)
        assert res.rc == 124
    finally:
        session.close()


def test_paramiko_refuses_an_unknown_or_changed_host_key(ssh_server: Any, tmp_path: Path) -> None:
    server, _, key = ssh_server
    other = tmp_path / "other_known_hosts"
    other.write_text("[127.0.0.1]:1 ecdsa-sha2-nistp256 " + server.host_key.get_base64() + "\n")
    with pytest.raises(Unreachable, match=r"is not in .*other_known_hosts"):
        _connector(other, key, server.port).connect(Target("n1", "127.0.0.1"))
    changed = tmp_path / "changed_known_hosts"
    imposter = paramiko.ECDSAKey.generate()
    changed.write_text(f"[127.0.0.1]:{server.port} {imposter.get_name()} {imposter.get_base64()}\n")
    with pytest.raises(Unreachable, match="differs from the one in"):
        _connector(changed, key, server.port).connect(Target("n1", "127.0.0.1"))


def test_paramiko_unreachable_reasons(ssh_server: Any, tmp_path: Path) -> None:
    server, known, _ = ssh_server
    wrong = tmp_path / "id_wrong"
    paramiko.ECDSAKey.generate().write_private_key_file(str(wrong))
    with pytest.raises(Unreachable, match=r"authentication failed for root@127\.0\.0\.1"):
        _connector(known, wrong, server.port).connect(Target("n1", "127.0.0.1"))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()[1]
    s.close()
    with pytest.raises(Unreachable, match="refused"):
        _connector(known, wrong, closed).connect(Target("n1", "127.0.0.1"))
