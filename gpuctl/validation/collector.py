"""`gpuctl validate`'s collection: run the probes on every node, write the bundle.

One connection per node (:mod:`gpuctl.remote`: SSH, or a fake in the unit tests), a bounded
pool of worker threads across nodes, every probe with its timeout, in four phases: each node's
own probes (light ones at once on a few channels, then the exclusive ones one by one, then the
second reads of counters after them), ib_write_bw between pairs of nodes of each fabric (with
retests of suspects), at level long the multi-node nccl-tests through Slurm
(:mod:`gpuctl.validation.multinode`), and the second reads of counters that must follow
ib_write_bw (InfiniBand port counters). What each probe
gave is written into a bundle directory (:mod:`gpuctl.validation.bundle`).

A node that cannot be reached (refused, timed out, authentication failed, host key unknown or
different) is a failed node with the reason, never skipped. A node whose connection dies during
the run (it lost power) is lost: noticed at once (:meth:`gpuctl.remote.LinkSession.lost`), a
failed node (``lost: ...``), its remaining pairs dropped and the nodes it was paired with paired
again, never failed for it.

ib_write_bw partners (``validate --limit``): a node under test with no other node of its fabric
in the run is the client of a pair with a partner, a node outside the limit that is known to be
good (chosen by :mod:`gpuctl.validation.api`); the partner's side is not recorded, its name is
(``pairing`` in each perftest record). With no partner, the node is measured against itself
(loopback between its own HCAs, :func:`gpuctl.validation.pairs.loopback_hcas`).

A probe that timed out is recorded as timed out (with how long it ran), one that could not be
started with its error, and every exit status is kept: the judges turn each of them into
UNKNOWN or FAIL, never OK.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
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
    Connector,
    ExecResult,
    LinkSession,
    Target,
    Unreachable,
    connect,
)
from gpuctl.slurm import show_argv
from gpuctl.validation import burn_collect, gpudirect_collect, multinode, multinode_collect
from gpuctl.validation import pairs as pairing
from gpuctl.validation.bundle import (
    NodeFolder,
    PairRun,
    iso,
    new_header,
    said,
    write_header,
)
from gpuctl.validation.expect import NodeExpectation, nic_named
from gpuctl.validation.gpudirect import Route
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.pair_run import BANDWIDTH, LATENCY, PairTest, lost_sides, run_sides
from gpuctl.validation.probes import (
    IB_WRITE_BW_BASE_PORT,
    IB_WRITE_BW_TIMEOUT_S,
    IB_WRITE_LAT_PORT_OFFSET,
    Probe,
    perftest_kind,
    perftest_options,
    phases,
    probes_for,
    wants_ib_write_bw,
    wants_ib_write_lat,
)
from gpuctl.validation.results import Verdict

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_PARALLEL = 64
# how a node whose connection died during the run is marked unreachable (the CLI counts them)
LOST_PREFIX = "lost: "
RETEST_PASSES = 3  # passes of retests of ib_write_bw suspects (and of re-pairs after a loss)
# Light probes of one node run at once on this many SSH channels of its connection (sshd's
# MaxSessions is 10 by default).
CHANNELS_PER_NODE = 3


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    kind: str  # "node" (a node's probes are done), "pair" (an ib_write_bw pair is done),
    # "multinode" (a multi-node run of node group ``node`` is done), "lost" (the connection to
    # ``node`` died: ``detail`` says how), "loopback" (``node`` measured against itself)
    node: str = ""
    status: str = ""  # node: "ok" | "unreachable"; pair: "ok" | "failed" | "partner lost"
    done: int = 0
    total: int = 0
    detail: str = ""


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
    lost: str | None = None  # its connection died during the run: why
    routes: dict[int, Route] | str | None = None  # GPUDirect: each GPU's adapter, or why not


@dataclass(frozen=True, slots=True)
class _Outcome:
    """One pair as phase 2 sees it: the run, and the nodes found lost (or that could not be
    reached again) while it ran; the other side then needs another pair."""

    run: PairRun
    lost: frozenset[str] = frozenset()


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
        partners: Sequence[Target] = (),
        no_partner: str = "",
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
        # ib_write_bw partners outside --limit (never judged), best first; why there are none
        self.partners = tuple(partners)
        self.no_partner = no_partner
        self._partner_states: dict[str, _NodeState] = {}
        self._gone: set[str] = set()  # partners that could not be used (unreachable, lost)
        self._port_shift = 0  # moves ib_write_bw ports past commands abandoned on a lost peer
        self._notes: list[dict[str, Any]] = []  # per pair run: how its sides were chosen

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

    def _probe(self, state: _NodeState, probe: Probe, session: LinkSession | None = None) -> None:
        session = session or state.session
        if self._cancel.is_set() or session is None:
            return  # stopped: meta.json keeps saying "not finished"
        exp = self.exps[state.target.node]
        if probe.per_gpu:  # GPUDirect RDMA: its adapter is read from this run's topo -m
            # (exclusive probes run one by one on the node: read once, after topo -m ran)
            routed = state.routes = state.routes or gpudirect_collect.routes(state, exp)
            node, address = state.target.node, state.target.address
            opts = functools.partial(self._perftest_options, node)
            gpudirect_collect.run_gpu(state, session, probe, exp, address, routed, opts)
            return
        if probe.burn:  # the burn loop, for the duration asked for (gpuctl/validation/burn.py)
            if exp.burn_s:
                burn_collect.run(state, session, exp, exp.burn_s, self._run, self._cancel.is_set)
            else:
                state.record(probe.kind, ExecResult(error="no --duration given"), (), 0)
            return
        run = functools.partial(self._run, session)
        state.run_recorded(probe.kind, probe.command(exp), probe.timeout_s, run)

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
            light, heavy, after_gpu, _after_pairs = phases(plan)  # those: phase 4
            self._parallel(lambda p: self._probe(state, p), light, self.channels)
            for p in heavy:
                self._probe(state, p)
            self._parallel(lambda p: self._probe(state, p), after_gpu, self.channels)
            why = state.session.lost()
            if why is not None:
                self._lose(state, why)
            elif not (self._keep_open and state.target.node in self._pair_nodes):
                self._close(state)
        state.write_meta()
        with self._count_lock:
            self._done += 1
            done = self._done
        self.on_progress(
            ProgressEvent(
                "node",
                state.target.node,
                "unreachable" if state.unreachable and not state.lost else "ok",
                done,
                total,
            )
        )

    # -- phase 2: ib_write_bw between nodes -----------------------------------------------

    def _hcas(self, node: str, fabric: str) -> list[str]:
        return [n.name for n in self.exps[node].nics if n.fabric == fabric]

    def _perftest_options(self, node: str, hca: str) -> tuple[str, ...]:
        """The addressing of ``hca`` on ``node`` (an adapter port's name; GPUDirect: a device,
        its first port): its port, RoCE's GID index and traffic class."""
        nics = self.exps[node].nics
        nic = nic_named(nics, hca) or next((n for n in nics if n.device == hca), None)
        return perftest_options(nic)

    @staticmethod
    def _close(state: _NodeState) -> None:
        if state.session is not None:
            with contextlib.suppress(Exception):
                state.session.close()
            state.session = None

    def _lose(self, state: _NodeState, why: str) -> None:
        """The connection to the node died (or it cannot be reached again): a node under test
        is a failed node, ``lost: why``; a partner is not used again. Said at once."""
        node = state.target.node
        partner = node in self._partner_states
        with state.lock:
            if state.lost is not None or (state.unreachable is not None and not partner):
                return
            state.lost = why
            if not partner:
                state.unreachable = f"{LOST_PREFIX}{why}"
        if partner:
            self._gone.add(node)
        self._close(state)
        self.on_progress(ProgressEvent("lost", node, "partner" if partner else "node", detail=why))

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

    def _pairing(self, server: str, client: str, peer_hca: str, hca: str) -> str | None:
        """How a pair's sides were chosen, for the verdict: a partner, a loopback (None: two
        nodes of the run)."""
        if server == client:
            why = f"; {self.no_partner}" if self.no_partner else ""
            if peer_hca == hca:
                return (
                    f"loopback on {hca} itself (the node's only HCA on this fabric: proves the "
                    f"adapter, not its cable){why}"
                )
            return f"loopback: server on {peer_hca} of the same node{why}"
        if server in self._partner_states:
            return f"with partner {server} (outside --limit)"
        return None

    def _pair(
        self,
        nodes: Mapping[str, _NodeState],
        fabric: str,
        server: str,
        client: str,
        retest: bool,
        record_server: bool = True,
    ) -> _Outcome:
        """One pair (``server == client``: a loopback on that node)."""
        srv, cli = nodes[server], nodes[client]
        with contextlib.ExitStack() as stack:
            sessions: dict[str, LinkSession] = {}
            for st, other in ((srv, cli), (cli, srv)):
                if st.target.node in sessions:
                    continue
                try:
                    sessions[st.target.node] = stack.enter_context(self._borrow(st))
                except Unreachable as exc:
                    why = f"cannot be reached again for ib_write_bw: {exc.reason}"
                    self._lose(st, why)
                    self._partner_gone(
                        other, fabric, st.target.node, why, 0, role_server=other is srv
                    )
                    return _Outcome(
                        PairRun(fabric, server, client, False, retest),
                        frozenset({st.target.node}),
                    )
            ok, lost = self._pair_hcas(
                srv, cli, sessions[server], sessions[client], fabric, retest, record_server
            )
        return _Outcome(PairRun(fabric, server, client, ok and not lost, retest), lost)

    def _plan(self, server: str, client: str, fabric: str) -> list[tuple[str, str]]:
        """(server HCA, client HCA) of each ib_write_bw run of a pair, in order."""
        if server == client:
            return pairing.loopback_hcas(self._hcas(client, fabric))
        server_hcas = self._hcas(server, fabric)
        return [
            (hca if hca in server_hcas else server_hcas[i % len(server_hcas)], hca)
            for i, hca in enumerate(self._hcas(client, fabric))
        ]

    def _partner_gone(
        self,
        survivor: _NodeState,
        fabric: str,
        gone: str,
        why: str,
        start: int,
        *,
        role_server: bool,
        plan: Sequence[tuple[str, str]] | None = None,
    ) -> None:
        """The runs of a pair left from ``start`` on, for the side that is still there: not
        measured, its peer was lost (never judged against the threshold; it is paired again)."""
        node = survivor.target.node
        if node in self._partner_states or node == gone:
            return  # a partner's side is never recorded; a loopback's node is lost itself
        if plan is None:
            plan = self._plan(node, gone, fabric) if role_server else self._plan(gone, node, fabric)
        for server_hca, client_hca in plan[start:]:
            hca = server_hca if role_server else client_hca
            survivor.record(
                perftest_kind(hca),
                ExecResult(
                    error=f"not measured: partner {gone} was lost during ib_write_bw ({why}); "
                    "paired again"
                ),
                ("ib_write_bw",),
                IB_WRITE_BW_TIMEOUT_S,
                role="server" if role_server else "client",
                peer=gone,
                partner_lost=True,
            )

    def _pair_hcas(
        self,
        srv: _NodeState,
        cli: _NodeState,
        s_session: LinkSession,
        c_session: LinkSession,
        fabric: str,
        retest: bool,
        record_server: bool,
    ) -> tuple[bool, frozenset[str]]:
        server, client = srv.target.node, cli.target.node
        loop = server == client
        plan = self._plan(server, client, fabric)
        base = IB_WRITE_BW_BASE_PORT + 16 * (self._port_shift % 32)
        ok = True
        latency = wants_ib_write_lat(self.exps[client], self.level) or (
            not loop and wants_ib_write_lat(self.exps[server], self.level)
        )
        for i, (peer_hca, hca) in enumerate(plan):
            note = self._pairing(server, client, peer_hca, hca)
            more: dict[str, Any] = {"retest": retest} | ({"pairing": note} if note else {})
            extra_s = {"role": "server", "peer": client, "peer_hca": hca, **more}
            extra_c = {"role": "client", "peer": server, "peer_hca": peer_hca, **more}
            s_opts, c_opts = (
                self._perftest_options(server, peer_hca),
                self._perftest_options(client, hca),
            )
            # ib_write_bw, then (where a group sets ib_write_lat_p99_us) ib_write_lat
            tests = [(BANDWIDTH, base + i)] + (
                [(LATENCY, base + i + IB_WRITE_LAT_PORT_OFFSET)] if latency else []
            )
            for test, port in tests:
                s_argv = test.server(peer_hca, port, s_opts)
                c_argv = test.client(hca, port, srv.target.address, c_opts)
                where = f"{test.tool} server on {server} ({peer_hca})"
                sides = run_sides(
                    s_session, c_session, s_argv, c_argv, test.timeout_s, where, client
                )
                s_res, c_res = sides.server, sides.client
                # a side whose connection died is lost: not this pair's measurement
                gone = lost_sides(sides, (server, s_session), (client, c_session))
                if gone:
                    self._port_shift += 1  # the other side may still run a command on its port
                    for node, why_lost in gone.items():
                        self._lose(srv if node == server else cli, why_lost)
                    # a loss during ib_write_lat leaves this HCA's ib_write_bw measured
                    start = i if test is BANDWIDTH else i + 1
                    if not loop:
                        for survivor, other, as_server in (
                            (cli, server, False),
                            (srv, client, True),
                        ):
                            if survivor.target.node in gone or (as_server and not record_server):
                                continue
                            self._partner_gone(
                                survivor,
                                fabric,
                                other,
                                gone[other],
                                start,
                                role_server=as_server,
                                plan=plan,
                            )
                    return False, frozenset(gone)
                # the server prints the same result table: each side's output goes to its own
                # node, except in a retest against a node that passed already (or a partner, or
                # a loopback), where only the node under test (the client) gets the new result
                t = test.timeout_s
                if record_server and not loop:
                    srv.record(test.kind(peer_hca), s_res, s_argv, t, **extra_s)
                cli.record(test.kind(hca), c_res or sides.not_run, c_argv, t, **extra_c)
                ok = (
                    ok
                    and c_res is not None
                    and self._passes(client, hca, c_res, test)
                    and (loop or self._passes(server, peer_hca, s_res, test))
                )
        return ok, frozenset()

    def _passes(self, node: str, hca: str, result: ExecResult, test: PairTest) -> bool:
        exp = self.exps[node]
        only = tuple(n for n in exp.nics if n.name == hca)
        if not only:
            return True
        out = ProbeOutput(
            "perftest",
            result.stdout.decode("utf-8", errors="replace") if result.stdout else None,
            rc=result.rc,
            timed_out=result.timed_out,
            error=result.error,
        )
        verdicts = test.judge(dataclasses.replace(exp, nics=only), hca, out)
        return all(r.verdict is Verdict.OK for r in verdicts)

    def _pairs(self, states: Mapping[str, _NodeState], total: int) -> list[PairRun]:
        by_fabric: dict[str, list[str]] = {}
        for node, st in states.items():
            exp = self.exps[node]
            if not st.reached or st.unreachable is not None or node not in self._pair_nodes:
                continue
            for fabric in dict.fromkeys(n.fabric for n in exp.nics):
                by_fabric.setdefault(fabric, []).append(node)
        runs: list[PairRun] = []
        done = 0

        def report(out: _Outcome) -> None:
            nonlocal done
            done += 1
            run = out.run
            status = "partner lost" if out.lost else ("ok" if run.passed else "failed")
            if run.server == run.client:
                self.on_progress(ProgressEvent("loopback", run.client, status, done, total))
                return
            # the node the pair was for: the client, or the side still there after a loss
            node = run.server if run.client in out.lost else run.client
            if node in self._partner_states or node in out.lost:
                return  # nothing left to say for it ("lost" was said)
            self.on_progress(ProgressEvent("pair", node, status, done, total))

        # fabrics one after the other: a node on two fabrics never runs two tests at once
        # each pair holds two connections: without kept sessions, half as many pairs at once
        workers = self.parallel if self._keep_open else max(1, self.parallel // 2)
        nodes = {**self._partner_states, **states}
        for fabric, members in sorted(by_fabric.items()):
            runs += self._fabric_pairs(nodes, fabric, members, workers, report)
        return runs

    def _fabric_partners(self, fabric: str) -> list[str]:
        """The partners outside --limit on ``fabric`` still usable, best first."""
        return [
            n
            for n in self._partner_states
            if n not in self._gone and any(nic.fabric == fabric for nic in self.exps[n].nics)
        ]

    def _fabric_pairs(
        self,
        nodes: Mapping[str, _NodeState],
        fabric: str,
        members: list[str],
        workers: int,
        report: Callable[[_Outcome], None],
    ) -> list[PairRun]:
        rounds = pairing.schedule(members, self.pair_rounds)
        # node -> whether its last recorded pair passed; None: its peer was lost (pair again)
        status: dict[str, bool | None] = {}
        tested: set[frozenset[str]] = set()
        runs: list[PairRun] = []

        def live(node: str) -> bool:
            st = nodes[node]
            return node not in self._gone and st.unreachable is None and st.lost is None

        def play(rnd: pairing.Round, retest: bool, both: bool) -> None:
            rnd = [p for p in rnd if live(p[0]) and live(p[1])]
            got = self._parallel(
                lambda p: self._pair(nodes, fabric, p[0], p[1], retest, both), rnd, workers
            )
            for out in got:
                run = out.run
                report(out)
                runs.append(run)
                note: dict[str, Any] = {}
                if run.server == run.client:
                    note["loopback"] = True
                elif run.server in self._partner_states:
                    note["partner"] = run.server
                if out.lost:
                    note["lost"] = sorted(out.lost)
                self._notes.append(note)
                tested.add(frozenset((run.server, run.client)))
                if out.lost:
                    for node in (run.server, run.client):
                        if node not in out.lost and node in members:
                            status[node] = None  # never failed for a lost peer
                    continue
                status[run.client] = run.passed
                if both:
                    status[run.server] = run.passed

        for rnd in rounds:
            play(rnd, False, True)
        # a node under test that no round covered (alone on its fabric in this run): against
        # partners outside --limit
        covered = pairing.covered(rounds)
        alone = [n for n in members if n not in covered and live(n)]
        for rnd in pairing.partner_rounds(alone, self._fabric_partners(fabric)):
            play(rnd, False, False)
        # a failed pair does not say which node is at fault: each node whose last pair failed
        # is tested again with a node that passed or a partner (or, while there is none, with
        # another suspect it has not met: a pair of those that passes clears both); a node
        # whose peer was lost is paired again the same way
        for _ in range(RETEST_PASSES):
            suspects = [n for n in members if live(n) and n in status and status[n] is not True]
            good = [n for n in members if live(n) and status.get(n) is True]
            good += self._fabric_partners(fabric)
            again = pairing.retest(suspects, good, tested)
            for rnd in again:
                play(rnd, True, not good)
            if not again:
                break
        # no partner left for a node never measured (or whose peers were lost): loopback
        rest = [n for n in members if live(n) and status.get(n) is None]
        play([(n, n) for n in rest], False, False)
        for node in members:
            if node in status or not live(node):
                continue
            for hca in self._hcas(node, fabric):
                nodes[node].record(
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
            multinode_collect.write_not_measured(out, groups, why, self.exps)
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
                multinode_collect.write_not_measured(out, groups, slurm, self.exps)
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

    # -- phase 4: the second reads of counters, after ib_write_bw and the multi-node runs --

    def _second_reads(self, states: Mapping[str, _NodeState]) -> None:
        def one(state: _NodeState) -> None:
            if self._cancel.is_set() or not state.reached or state.unreachable is not None:
                return
            plan = phases(probes_for(self.exps[state.target.node], self.level))[3]
            if not plan:
                return
            try:
                with self._borrow(state) as session:
                    for probe in plan:
                        self._probe(state, probe, session)
            except Exception as exc:  # recorded: the judge says UNKNOWN, never OK
                reason = exc.reason if isinstance(exc, Unreachable) else str(exc)
                exp = self.exps[state.target.node]
                for probe in plan:
                    failed = ExecResult(error=f"could not connect again: {reason}")
                    state.record(probe.kind, failed, probe.command(exp), probe.timeout_s)

        self._parallel(one, list(states.values()), self.parallel)

    # -- the whole run ---------------------------------------------------------------------

    def collect(self, targets: Sequence[Target], out: Path) -> CollectResult:
        started = time.monotonic()
        collected_at = iso(datetime.now(UTC))
        out.mkdir(parents=True, exist_ok=True)
        burn_s = next((e.burn_s for e in self.exps.values() if e.burn_s), None)
        header = new_header(collected_at, self.level, [t.node for t in targets], burn_s)
        write_header(out, header)
        states = {t.node: _NodeState(out / t.node, target=t) for t in targets}
        self._partner_states = {
            t.node: _NodeState(out / "_partners" / t.node, target=t)  # never written
            for t in self.partners
            if t.node not in states
        }
        self._pair_nodes = {
            t.node for t in targets if wants_ib_write_bw(self.exps[t.node], self.level)
        }
        # sessions stay open for ib_write_bw when that keeps within --parallel connections
        self._keep_open = len(self._pair_nodes) <= self.parallel
        try:
            self._parallel(
                lambda s: self._node(s, len(states)), list(states.values()), self.parallel
            )
            pair_total = sum(
                1
                for n, s in states.items()
                if s.reached and s.unreachable is None and n in self._pair_nodes
            )
            runs = self._pairs(states, max(1, pair_total // 2))
            self._multinode(states, out)
            self._second_reads(states)
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
                "lost": {n: s.lost for n, s in states.items() if s.lost is not None},
                "pairs": [
                    {**r.to_json(), **note} for r, note in zip(runs, self._notes, strict=False)
                ],
            },
        )
        return CollectResult(out, unreachable, tuple(runs), collected_at, seconds)
