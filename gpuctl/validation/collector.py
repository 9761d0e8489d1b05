"""`gpuctl validate`'s collection: run the probes on every node, write the bundle.

One connection per node (:mod:`gpuctl.remote`: SSH, or a fake in the unit tests), a bounded
pool of worker threads across nodes, every probe with its timeout, in three phases: each node's
own probes (light ones at once on a few channels, then the exclusive ones one by one),
ib_write_bw between pairs of nodes of each fabric (with retests of suspects), and at level long
the multi-node nccl-tests through Slurm (:mod:`gpuctl.validation.multinode`). What each probe
gave is written into a bundle directory (:mod:`gpuctl.validation.bundle`).

A node that cannot be reached (refused, timed out, authentication failed, host key unknown or
different) is a failed node with the reason, never skipped. A probe that timed out is recorded
as timed out, one that could not be started with its error, and every exit status is kept: the
judges turn each of them into UNKNOWN or FAIL, never OK.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from gpuctl.config.derived import nodes as cluster_nodes
from gpuctl.config.model import Cluster
from gpuctl.errors import UsageError
from gpuctl.remote import (
    GRACE_S,
    KILL_AFTER_S,
    Connector,
    ExecResult,
    LinkSession,
    Target,
    Unreachable,
    connect,
)
from gpuctl.slurm import show_argv
from gpuctl.validation import multinode, multinode_collect
from gpuctl.validation import pairs as pairing
from gpuctl.validation.bundle import (
    NodeFolder,
    PairRun,
    iso,
    new_header,
    said,
    write_header,
)
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.infiniband import judge_ib_write_bw
from gpuctl.validation.probes import (
    IB_WRITE_BW_BASE_PORT,
    IB_WRITE_BW_SERVER_START_S,
    IB_WRITE_BW_TIMEOUT_S,
    SERVER_READY,
    Probe,
    ib_write_bw_client,
    ib_write_bw_server,
    perftest_kind,
    probes_for,
    wants_ib_write_bw,
)
from gpuctl.validation.results import Verdict

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_PARALLEL = 64
RETEST_PASSES = 2  # rounds of retests of ib_write_bw suspects
# Light probes of one node run at once on this many SSH channels of its connection (sshd's
# MaxSessions is 10 by default).
CHANNELS_PER_NODE = 3


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    kind: str  # "node" (a node's probes are done), "pair" (an ib_write_bw pair is done),
    # "multinode" (a multi-node run of node group ``node`` is done)
    node: str = ""
    status: str = ""  # node: "ok" | "unreachable"; pair: "ok" | "failed"
    done: int = 0
    total: int = 0


@dataclass(frozen=True, slots=True)
class CollectResult:
    bundle: Path
    unreachable: dict[str, str]
    pairs: tuple[PairRun, ...]
    collected_at: str
    seconds: float


@dataclass(frozen=True, slots=True)
class MultinodePlan:
    """Where and how phase 3 starts the multi-node runs (level long)."""

    controller: Target
    options: multinode.SrunOptions = field(default_factory=multinode.SrunOptions)


def multinode_plan(cluster: Cluster) -> MultinodePlan:
    """srun runs on ``validation.multinode.launch_node`` (default ``slurm.controller``) with
    cluster.yml's ``validation.multinode``."""
    address = {n.name: n.address or n.name for n in cluster_nodes(cluster)}
    mn = cluster.validation.multinode
    name = mn.launch_node or cluster.slurm.controller
    return MultinodePlan(
        Target(name, address.get(name, name)),
        multinode.SrunOptions(mn.mpi, mn.partition, mn.reservation, mn.max_runs, mn.rank_per),
    )


@dataclass(kw_only=True)
class _NodeState(NodeFolder):
    """A node's folder being written, and its connection while the collector needs it."""

    target: Target
    session: LinkSession | None = None  # open from the node's probes until no longer needed
    reached: bool = False  # phase 1 connected to it


class Collector:
    """Runs the probes of each node's level on every target and writes the bundle."""

    def __init__(
        self,
        connector: Connector,
        exps: Mapping[str, NodeExpectation],
        *,
        level: str | None = None,
        parallel: int = DEFAULT_PARALLEL,
        channels: int = CHANNELS_PER_NODE,
        become: bool = False,
        pair_rounds: int | None = None,
        on_progress: Callable[[ProgressEvent], None] | None = None,
        multinode: MultinodePlan | None = None,
    ) -> None:
        if parallel < 1:
            raise UsageError("--parallel must be 1 or more")
        self.connector = connector
        self.exps = exps
        self.level = level
        self.parallel = parallel
        self.channels = max(1, channels)
        self.become = become
        self.pair_rounds = pair_rounds
        self.multinode = multinode
        self.on_progress = on_progress or (lambda _e: None)
        self._done = 0
        self._count_lock = threading.Lock()
        self._pair_nodes: set[str] = set()
        self._keep_open = True
        self._cancel = threading.Event()

    def _parallel(self, fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
        """``fn`` over ``items`` on ``workers`` threads. Ctrl-C (or any error) stops handing
        out work: what runs is abandoned (its sessions are closed by the caller), nothing new
        starts."""
        if not items:
            return []
        pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(items))))
        try:
            results = list(pool.map(fn, items))
        except BaseException:
            self._cancel.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return results

    # -- one command --------------------------------------------------------------------

    def _run(self, session: LinkSession, argv: Sequence[str], timeout_s: float) -> ExecResult:
        return session.run(argv, timeout_s)

    def _probe(self, state: _NodeState, probe: Probe) -> None:
        if self._cancel.is_set() or state.session is None:
            return  # stopped: meta.json keeps saying "not finished"
        exp = self.exps[state.target.node]
        argv = probe.command(exp)
        try:
            result = self._run(state.session, argv, probe.timeout_s)
        except Exception as exc:  # a transport bug must not lose the node
            result = ExecResult(error=f"could not run: {exc or type(exc).__name__}")
        state.record(probe.kind, result, argv, probe.timeout_s)

    # -- phase 1: every node's own probes -------------------------------------------------

    def _node(self, state: _NodeState, total: int) -> None:
        exp = self.exps[state.target.node]
        plan = probes_for(exp, self.level)
        state.folder.mkdir(parents=True, exist_ok=True)
        # until the probes are done, meta.json says they are not: a bundle left by a collector
        # that was stopped is judged UNKNOWN for what it lacks, never from half its outputs
        with state.lock:
            state.probes = {
                p.kind: {
                    "rc": None,
                    "timed_out": False,
                    "error": "not finished (the collection was stopped)",
                    "command": shlex.join(p.command(exp)),
                }
                for p in plan
            }
        state.write_meta()
        if self._cancel.is_set():
            return
        try:
            state.session = connect(self.connector, state.target, become=self.become)
        except Unreachable as exc:
            state.unreachable = exc.reason
        except Exception as exc:  # never lose a node to an unexpected error
            state.unreachable = f"ssh: {exc or type(exc).__name__}"
        if state.session is not None:
            state.reached = True
            light = [p for p in plan if not p.exclusive]
            heavy = [p for p in plan if p.exclusive]
            self._parallel(lambda p: self._probe(state, p), light, self.channels)
            for p in heavy:
                self._probe(state, p)
            if not (self._keep_open and state.target.node in self._pair_nodes):
                self._close(state)
        state.write_meta()
        with self._count_lock:
            self._done += 1
            done = self._done
        self.on_progress(
            ProgressEvent(
                "node",
                state.target.node,
                "unreachable" if state.unreachable else "ok",
                done,
                total,
            )
        )

    # -- phase 2: ib_write_bw between nodes -----------------------------------------------

    def _hcas(self, node: str, fabric: str) -> list[str]:
        return [n.device for n in self.exps[node].nics if n.fabric == fabric]

    @staticmethod
    def _close(state: _NodeState) -> None:
        if state.session is not None:
            with contextlib.suppress(Exception):
                state.session.close()
            state.session = None

    @contextlib.contextmanager
    def _borrow(self, state: _NodeState) -> Iterator[LinkSession]:
        """The node's open session, or a new connection for the time of one pair (when more
        nodes take part in ib_write_bw than --parallel, sessions are not kept between)."""
        if state.session is not None:
            yield state.session
            return
        session = connect(self.connector, state.target, become=self.become)
        try:
            yield session
        finally:
            with contextlib.suppress(Exception):
                session.close()

    def _pair(
        self,
        states: Mapping[str, _NodeState],
        fabric: str,
        server: str,
        client: str,
        retest: bool,
        record_server: bool = True,
    ) -> PairRun:
        srv, cli = states[server], states[client]
        try:
            with self._borrow(srv) as s_session, self._borrow(cli) as c_session:
                ok = self._pair_hcas(srv, cli, s_session, c_session, fabric, retest, record_server)
        except Unreachable as exc:
            for st, other in ((srv, cli), (cli, srv)):
                if st is srv and not record_server:
                    continue
                for hca in self._hcas(st.target.node, fabric):
                    st.record(
                        perftest_kind(hca),
                        ExecResult(
                            error=f"not measured: reconnecting for ib_write_bw with "
                            f"{other.target.node}: {exc.reason}"
                        ),
                        ("ib_write_bw",),
                        IB_WRITE_BW_TIMEOUT_S,
                    )
            ok = False
        return PairRun(fabric, server, client, ok, retest)

    def _pair_hcas(
        self,
        srv: _NodeState,
        cli: _NodeState,
        s_session: LinkSession,
        c_session: LinkSession,
        fabric: str,
        retest: bool,
        record_server: bool,
    ) -> bool:
        server, client = srv.target.node, cli.target.node
        server_hcas = self._hcas(server, fabric)
        ok = True
        for i, hca in enumerate(self._hcas(client, fabric)):
            peer_hca = hca if hca in server_hcas else server_hcas[i % len(server_hcas)]
            port = IB_WRITE_BW_BASE_PORT + i
            s_argv = ib_write_bw_server(peer_hca, port)
            c_argv = ib_write_bw_client(hca, port, srv.target.address)
            extra_s = {"role": "server", "peer": client, "peer_hca": hca, "retest": retest}
            extra_c = {"role": "client", "peer": server, "peer_hca": peer_hca, "retest": retest}
            t = IB_WRITE_BW_TIMEOUT_S
            running = s_session.spawn(s_argv, t)
            if not running.wait_for(SERVER_READY, IB_WRITE_BW_SERVER_START_S):
                s_res = running.finish(KILL_AFTER_S + GRACE_S)
                why = s_res.error or (
                    f"exit {s_res.rc}: {said(s_res.stderr)}"
                    if s_res.rc is not None
                    else f"no '{SERVER_READY}' within {IB_WRITE_BW_SERVER_START_S} s"
                )
                c_res = ExecResult(
                    error=f"not run: the ib_write_bw server on {server} ({peer_hca}) did not "
                    f"start: {why}"
                )
            else:
                c_res = self._run(c_session, c_argv, t)
                s_res = running.finish()
            # the server prints the same result table: each side's output goes to its own node,
            # except in a retest against a node that passed already, where only the node under
            # suspicion (the client) gets the new result
            if record_server:
                srv.record(perftest_kind(peer_hca), s_res, s_argv, t, **extra_s)
            cli.record(perftest_kind(hca), c_res, c_argv, t, **extra_c)
            ok = ok and self._passes(client, hca, c_res) and self._passes(server, peer_hca, s_res)
        return ok

    def _passes(self, node: str, hca: str, result: ExecResult) -> bool:
        exp = self.exps[node]
        only = tuple(n for n in exp.nics if n.device == hca)
        if not only:
            return True
        out = ProbeOutput(
            "perftest",
            result.stdout.decode("utf-8", errors="replace") if result.stdout else None,
            rc=result.rc,
            timed_out=result.timed_out,
            error=result.error,
        )
        verdicts = judge_ib_write_bw(dataclasses.replace(exp, nics=only), {hca: out})
        return all(r.verdict is Verdict.OK for r in verdicts)

    def _pairs(self, states: Mapping[str, _NodeState], total: int) -> list[PairRun]:
        by_fabric: dict[str, list[str]] = {}
        for node, st in states.items():
            exp = self.exps[node]
            if not st.reached or node not in self._pair_nodes:
                continue
            for fabric in dict.fromkeys(n.fabric for n in exp.nics):
                by_fabric.setdefault(fabric, []).append(node)
        runs: list[PairRun] = []
        done = 0

        def report(run: PairRun) -> None:
            nonlocal done
            done += 1
            status = "ok" if run.passed else "failed"
            self.on_progress(ProgressEvent("pair", run.client, status, done, total))

        # fabrics one after the other: a node on two fabrics never runs two tests at once
        # each pair holds two connections: without kept sessions, half as many pairs at once
        workers = self.parallel if self._keep_open else max(1, self.parallel // 2)
        for fabric, members in sorted(by_fabric.items()):
            runs += self._fabric_pairs(states, fabric, members, workers, report)
        return runs

    def _fabric_pairs(
        self,
        states: Mapping[str, _NodeState],
        fabric: str,
        members: list[str],
        workers: int,
        report: Callable[[PairRun], None],
    ) -> list[PairRun]:
        rounds = pairing.schedule(members, self.pair_rounds)
        status: dict[str, bool] = {}  # node -> whether its last recorded pair passed
        tested: set[frozenset[str]] = set()
        runs: list[PairRun] = []

        def play(rnd: pairing.Round, retest: bool, both: bool) -> list[PairRun]:
            got = self._parallel(
                lambda p: self._pair(states, fabric, p[0], p[1], retest, both), rnd, workers
            )
            for run in got:
                report(run)
                tested.add(frozenset((run.server, run.client)))
                status[run.client] = run.passed
                if both:
                    status[run.server] = run.passed
            return got

        for rnd in rounds:
            runs += play(rnd, False, True)
        # a failed pair does not say which node is at fault: each node whose last pair failed
        # is tested again with a node that passed (or, while none has, with another suspect it
        # has not met: a pair of those that passes clears both)
        for _ in range(RETEST_PASSES):
            suspects = [n for n in members if status.get(n) is False]
            good = [n for n in members if status.get(n) is True]
            again = pairing.retest(suspects, good, tested)
            for rnd in again:
                runs += play(rnd, True, not good)
            if not again:
                break
        covered = pairing.covered(rounds)
        for node in members:
            if node in covered:
                continue
            for hca in self._hcas(node, fabric):
                states[node].record(
                    perftest_kind(hca),
                    ExecResult(
                        error=f"not measured: no other reachable node on fabric {fabric} "
                        "to run ib_write_bw with"
                    ),
                    ("ib_write_bw",),
                    IB_WRITE_BW_TIMEOUT_S,
                )
        return runs

    # -- phase 3: multi-node nccl-tests through Slurm (level long; gpuctl/validation/multinode.py)

    def _multinode(self, states: Mapping[str, _NodeState], out: Path) -> None:
        plan = self.multinode
        if plan is None or self._cancel.is_set():
            return
        reached = [n for n, st in states.items() if st.reached and st.unreachable is None]
        groups = multinode_collect.participants(self.exps, reached, self.level)
        if not groups:
            return
        controller = plan.controller.node
        try:
            session = connect(self.connector, plan.controller, become=self.become)
        except Unreachable as exc:
            why = f"{controller}, where srun runs, cannot be reached: {exc.reason}"
            multinode_collect.write_not_measured(out, groups, why)
            return
        try:
            argv = show_argv()
            res = self._run(session, argv, multinode.SCONTROL_TIMEOUT_S)
            slurm: dict[str, dict[str, Any]] | str
            if res.rc != 0 or res.error is not None or res.timed_out:
                said_ = res.error or ("timed out" if res.timed_out else said(res.stderr))
                slurm = f"scontrol show node on {controller}: exit {res.rc}: {said_}"
            else:
                text = res.stdout.decode("utf-8", errors="replace")
                slurm = multinode_collect.slurm_records(text)
            if isinstance(slurm, str):
                multinode_collect.write_not_measured(out, groups, slurm)
                return
            for group, nodes in sorted(groups.items()):
                if self._cancel.is_set():
                    return
                done = 0

                def report(run: multinode.RunOutcome, group: str = group) -> None:
                    nonlocal done
                    done += 1
                    ok = run.busbw is not None and run.failure is None
                    self.on_progress(
                        ProgressEvent("multinode", group, "ok" if ok else "failed", done)
                    )

                multinode_collect.collect_group(
                    out,
                    group,
                    nodes,
                    self.exps,
                    lambda argv, timeout: self._run(session, argv, timeout),
                    slurm=slurm,
                    options=plan.options,
                    on_run=report,
                )
        finally:
            with contextlib.suppress(Exception):
                session.close()

    # -- the whole run ---------------------------------------------------------------------

    def collect(self, targets: Sequence[Target], out: Path) -> CollectResult:
        started = time.monotonic()
        collected_at = iso(datetime.now(UTC))
        out.mkdir(parents=True, exist_ok=True)
        header = new_header(collected_at, self.level, [t.node for t in targets])
        write_header(out, header)
        states = {t.node: _NodeState(out / t.node, target=t) for t in targets}
        self._pair_nodes = {
            t.node for t in targets if wants_ib_write_bw(self.exps[t.node], self.level)
        }
        # sessions stay open for ib_write_bw when that keeps within --parallel connections
        self._keep_open = len(self._pair_nodes) <= self.parallel
        try:
            self._parallel(
                lambda s: self._node(s, len(states)), list(states.values()), self.parallel
            )
            pair_total = sum(1 for n, s in states.items() if s.reached and n in self._pair_nodes)
            runs = self._pairs(states, max(1, pair_total // 2))
            self._multinode(states, out)
            for st in states.values():
                st.write_meta()
        finally:
            for st in states.values():
                self._close(st)
            with contextlib.suppress(Exception):
                self.connector.close()
        unreachable = {n: s.unreachable for n, s in states.items() if s.unreachable is not None}
        seconds = time.monotonic() - started
        write_header(
            out,
            {
                **header,
                "complete": True,
                "seconds": round(seconds, 3),
                "unreachable": unreachable,
                "pairs": [r.to_json() for r in runs],
            },
        )
        return CollectResult(out, unreachable, tuple(runs), collected_at, seconds)
