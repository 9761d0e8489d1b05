"""Multi-node nccl-tests through Slurm (the ``long`` level), and the locator of slow nodes.

At ``long``, after every node's own probes, gpuctl runs nccl-tests' all_reduce_perf across the
nodes of each node group at once, started with ``srun`` over SSH on the Slurm controller
(cluster.yml's ``slurm.controller``, or ``validation.multinode.launch_node``), one rank per GPU
(``-g 1``)::

    srun --nodes=3 --ntasks-per-node=8 --gpus-per-node=8 --nodelist=gpu[001-003] --mpi=pmix
         --time=10 --immediate=60 --exclusive --label --job-name=gpuctl-nccl-multinode
         all_reduce_perf -b 8 -e 8G -f 2 -g 1

The same form as awsome-distributed-training's pairwise runner (``srun -l ... --mpi=pmix
all_reduce_perf -b ... -e ... -f 2 -g 1`` with ``ntasks_per_node`` = GPUs per node,
micro-benchmarks/nccl-tests/slurm/pairwise-nccl-test/run-pairwise-nccl.py); ``--label``
(``-l``) prefixes every line with its rank (``0: ``), which the nccl parser removes.
``validation.multinode.rank_per: node`` runs one rank per node with ``-g <gpus>`` instead
(nccl-tests' README: ``mpirun -np 10 ... -g 4``, 10 processes of 4 GPUs each), for nodes whose
Slurm CPU count is below their GPU count (the lab's: 2 CPUs, 8 GPUs).

When that run is below its threshold (or fails), :func:`locate` looks for the slow node with
more runs on subsets of the nodes, at most ``max_runs`` in all (the first one included):

1. Bisection, for one slow node: the candidates are the nodes of the failing run that no
   passing run has cleared. Run half of them (padded with one cleared node when the half is a
   single node; before any run passed, the nodes outside the suspects run together first to
   clear some, else the larger half runs); a half that passes clears its nodes and the culprit
   is in the other half, a half that fails holds it. About ``ceil(log2 n)`` runs.
2. Confirmation, to tell a slow node from a slow link: the suspect with each of two cleared
   nodes, two 2-node runs. Both fail: the node is slow (located). One fails: the link (path)
   between the suspect and that partner is slow; the finding goes to both nodes.
3. Verification: the nodes left without the located one run together; a pass clears them all,
   a failure means another slow node, and the search starts again on them (two slow nodes
   cost about twice as many runs).
4. Pairwise fallback, when a failing run holds no located node (every node of it passes in
   other runs): the smallest such run is shrunk one node at a time while it still fails. Two
   nodes left, each passing with others: a slow link between them (both get the finding).

A run that fails (srun error, NCCL error, wrong results, timed out) counts as a failure, never
as 0 GB/s. When srun refuses the request itself (invalid MPI type, PMIx library missing, a node
configuration or partition it cannot give), no subset would run either: nothing is located.
Limits: the model is "a run is as fast as its slowest member"; a failure that shows only with
many nodes (every smaller run passes) is reported as unresolved (UNKNOWN) on the
nodes of that run; with two nodes the slow one cannot be told apart (both UNKNOWN); nodes the
budget left undecided are UNKNOWN. The locator is pure: unit tests drive it with scripted run
functions, and judging a bundle again replays it over the recorded runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ClusterShell.NodeSet import NodeSet

from gpuctl.config.catalog import Ceiling, fastest_rate, multinode_busbw_ceiling
from gpuctl.resources import load_data
from gpuctl.slurm import SlurmNode
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.parsing import parse
from gpuctl.validation.plausible import nccl_table_lie
from gpuctl.validation.results import CheckResult, Verdict

CHECK = "nccl.multinode"
THRESHOLD_KEY = "nccl_multinode_busbw_gbs"
# srun --time (minutes) and the outer `timeout` of the command (seconds): a hung step ends
RUN_TIME_LIMIT_MIN = 10
RUN_TIMEOUT_S = RUN_TIME_LIMIT_MIN * 60 + 60
IMMEDIATE_S = 60  # srun --immediate: give up when the nodes are not free within this
JOB_NAME = "gpuctl-nccl-multinode"
NCCL_ARGS = ("all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "1")
SCONTROL_TIMEOUT_S = 60


# ------------------------------------------------------------------------------------------
# The command


@dataclass(frozen=True, slots=True)
class SrunOptions:
    """cluster.yml ``validation.multinode`` (see docs/validate.md)."""

    mpi: str = "pmix"
    partition: str | None = None
    reservation: str | None = None
    max_runs: int | None = None
    rank_per: str = "gpu"  # "gpu": one rank per GPU (-g 1); "node": one per node (-g <gpus>)


def srun_argv(
    nodes: Sequence[str], gpus_per_node: int, options: SrunOptions = SrunOptions()
) -> tuple[str, ...]:
    """The srun command line of one multi-node run: one rank per GPU (``-g 1``), or with
    ``rank_per="node"`` one rank per node driving all its GPUs (``-g <gpus>``)."""
    if len(nodes) < 2:
        raise ValueError("a multi-node run needs two or more nodes")
    if gpus_per_node < 1:
        raise ValueError("a multi-node run needs GPUs")
    per_node = options.rank_per == "node"
    tasks = 1 if per_node else gpus_per_node
    argv = srun_options(nodes, tasks, gpus_per_node, options, JOB_NAME)
    gpus = str(gpus_per_node) if per_node else "1"
    return (*argv, *NCCL_ARGS[:-1], gpus)


def srun_options(
    nodes: Sequence[str], tasks_per_node: int, gpus_per_node: int, options: SrunOptions, job: str
) -> list[str]:
    """srun and its options up to the program: the nodes, whole and exclusive, labelled
    output, the time limits, cluster.yml's MPI type, partition and reservation."""
    argv = [
        "srun",
        f"--nodes={len(nodes)}",
        f"--ntasks-per-node={tasks_per_node}",
        f"--gpus-per-node={gpus_per_node}",
        f"--nodelist={NodeSet.fromlist(nodes)}",
        f"--mpi={options.mpi}",
        f"--time={RUN_TIME_LIMIT_MIN}",
        f"--immediate={IMMEDIATE_S}",
        "--exclusive",
        "--label",
        f"--job-name={job}",
    ]
    if options.partition:
        argv.append(f"--partition={options.partition}")
    if options.reservation:
        argv.append(f"--reservation={options.reservation}")
    return argv


# ------------------------------------------------------------------------------------------
# One run's result


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """One multi-node run: its bus bandwidth at the largest size, or why there is none."""

    nodes: tuple[str, ...]
    busbw: float | None = None  # GB/s, out-of-place, at the largest message size
    size: int | None = None
    failure: str | None = None  # set when busbw is None
    refused: bool = False  # srun refused the request itself: no subset would do better

    def passes(self, threshold: float) -> bool:
        return self.failure is None and self.busbw is not None and self.busbw >= threshold

    def describe(self) -> str:
        where = f"{NodeSet.fromlist(self.nodes)} ({len(self.nodes)} nodes)"
        if self.busbw is not None and self.failure is None:
            return f"{where}: {self.busbw:g} GB/s"
        return f"{where}: failed ({self.failure})"


def outcome(
    nodes: Sequence[str],
    text: str | None,
    *,
    rc: int | None = 0,
    timed_out: bool = False,
    error: str | None = None,
    stderr: str = "",
    ceiling: Ceiling | None = None,
) -> RunOutcome:
    """Read one run's output (nccl parser; srun's ``N: `` prefixes are removed there).

    ``ceiling``: the most the nodes' NICs carry (:func:`busbw_ceiling_of`); a busbw above it,
    or one that is no finite number in any row, fails the run: no other row stands in."""
    key = tuple(nodes)
    if error:
        refused = _REFUSED.search(f"{stderr}\n{error}")
        return RunOutcome(key, failure=error, refused=bool(refused))
    if timed_out:
        return RunOutcome(key, failure="timed out")
    result = parse("nccl", text or "")
    said = _last_line(stderr)
    if not result.recognised:
        refused = _REFUSED.search(f"{stderr}\n{error or ''}")
        why = refused.group(0) if refused else said or "; ".join(result.problems)[:200]
        return RunOutcome(
            key, failure=f"no nccl-tests result (exit {rc}): {why}", refused=bool(refused)
        )
    data = result.data
    errors = [str(e) for e in data.get("errors") or []]
    if errors:
        return RunOutcome(key, failure=f"nccl-tests reported {len(errors)} failure line(s): "
                          f"{errors[0][:160]}")  # fmt: skip
    oob = data.get("out_of_bounds")
    if isinstance(oob, int | float) and not isinstance(oob, bool) and oob > 0:
        return RunOutcome(key, failure=f"wrong results: out of bounds values {oob}")
    rows = [r for r in data.get("rows") or [] if isinstance(r, dict)]
    if rc not in (0, None):
        return RunOutcome(key, failure=f"exit {rc}" + (f": {said}" if said else ""))
    if not rows:
        return RunOutcome(key, failure="no bandwidth rows in the output")
    lie = nccl_table_lie(rows, ceiling, text)
    if lie is not None:
        return RunOutcome(key, failure=lie)
    largest = max(rows, key=lambda r: number(r.get("size")) or 0.0)
    busbw = number((largest.get("out_of_place") or {}).get("busbw"))
    if busbw is None:
        return RunOutcome(key, failure="the largest size has no bandwidth")
    size = largest.get("size")
    return RunOutcome(key, busbw=busbw, size=size if isinstance(size, int) else None)


# srun refusing the request as such (the plugin, partition, reservation, node configuration):
# every subset would be refused the same way, so the locator does not run
_REFUSED = re.compile(
    r"[^\n]*(?:Invalid (?:MPI type|partition name|reservation|node name|generic resource)"
    r"|can not load PMIx library|Requested node configuration is not available"
    r"|Unable to allocate resources[^\n]*)[^\n]*"
)


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


# ------------------------------------------------------------------------------------------
# The locator (pure)

RunFn = Callable[[tuple[str, ...]], RunOutcome]


def default_budget(count: int) -> int:
    """Runs allowed for ``count`` nodes, the first included: enough to locate and confirm two
    slow nodes (one takes about ``log2(count) + 4``)."""
    return 3 * math.ceil(math.log2(max(2, count))) + 4


@dataclass(frozen=True, slots=True)
class Location:
    """What the runs showed about each node."""

    nodes: tuple[str, ...]
    threshold: float
    runs: tuple[RunOutcome, ...]
    slow: tuple[str, ...] = ()  # located slow nodes
    links: tuple[tuple[str, str], ...] = ()  # pairs whose run fails while each passes elsewhere
    cleared: tuple[str, ...] = ()  # nodes of a passing run (and not slow)
    unresolved: tuple[str, ...] = ()  # neither cleared nor located
    exhausted: bool = False  # the run budget ended the search

    @property
    def passed(self) -> bool:
        return bool(self.runs) and self.runs[0].passes(self.threshold)


@dataclass
class _Search:
    nodes: list[str]
    run: RunFn
    threshold: float
    budget: int
    log: dict[frozenset[str], RunOutcome] = field(default_factory=dict)
    order: list[RunOutcome] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    exhausted: bool = False

    def test(self, group: Iterable[str]) -> bool | None:
        """Whether the run of ``group`` passes; None once the budget is spent."""
        members = [n for n in self.nodes if n in set(group)]
        key = frozenset(members)
        known = self.log.get(key)
        if known is None:
            if len(self.order) >= self.budget:
                self.exhausted = True
                return None
            known = self.run(tuple(members))
            self.log[key] = known
            self.order.append(known)
        return known.passes(self.threshold)

    def cleared(self) -> list[str]:
        ok: set[str] = set()
        for key, out in self.log.items():
            if out.passes(self.threshold):
                ok |= key
        return [n for n in self.nodes if n in ok and n not in self.slow]

    def isolate(self, failing: list[str]) -> str | None:
        """One slow node among ``failing`` (whose run failed), by bisection; None when no
        node of it is left uncleared, the budget ends, or two nodes cannot be told apart."""
        cand = [n for n in failing if n not in self.cleared()]
        while len(cand) > 1:
            helpers = [n for n in self.cleared() if n not in cand]
            half = cand[: len(cand) // 2]
            if len(half) < 2 and not helpers:
                # nothing cleared yet: the nodes outside the suspects, run together, may be
                outside = [n for n in self.nodes if n not in cand and n not in self.slow]
                if len(outside) >= 2 and frozenset(outside) not in self.log:
                    if self.test(outside) is None:
                        return None
                    continue
                if len(cand) >= 3:
                    half = cand[: (len(cand) + 1) // 2]  # two or more: runs without a helper
                else:  # two suspects, nothing cleared yet: try each with an outside node
                    return self._split_pair(cand, failing)
            probe = half + (helpers[:1] if len(half) < 2 else [])
            passed = self.test(probe)
            if passed is None:
                return None
            cand = [n for n in cand if n not in half] if passed else half
        return cand[0] if cand else None

    def _split_pair(self, cand: list[str], failing: list[str]) -> str | None:
        outside = [n for n in self.nodes if n not in cand and n not in self.slow]
        for probe_node in outside[:1]:
            for i, node in enumerate(cand):
                passed = self.test([node, probe_node])
                if passed is None:
                    return None
                if passed:
                    return cand[1 - i]
        return None

    def unexplained(self) -> list[RunOutcome]:
        """Failing runs without a located slow node or link in them."""
        slow = set(self.slow)
        return [
            r
            for r in self.order
            if not r.passes(self.threshold)
            and not slow & set(r.nodes)
            and not any(set(pair) <= set(r.nodes) for pair in self.links)
        ]

    def shrink(self) -> None:
        """The smallest unexplained failing run, made minimal by leaving out one node at a
        time while it still fails: two nodes left is a slow link between them (recorded)."""
        failing = sorted(self.unexplained(), key=lambda r: len(r.nodes))
        if not failing:
            return
        group = list(failing[0].nodes)
        for node in list(group):
            if len(group) <= 2:
                break
            fewer = [n for n in group if n != node]
            passed = self.test(fewer)
            if passed is None:
                return
            if not passed:
                group = fewer
        cleared = set(self.cleared())
        if len(group) == 2 and set(group) <= cleared:  # each passes with other nodes
            self.links.append((group[0], group[1]))

    def confirm(self, suspect: str) -> bool | None:
        """Two 2-node runs of the suspect with two cleared nodes: True, it is slow; False, a
        link to one partner is (recorded); None, undecided (no partner, budget)."""
        partners = [n for n in self.cleared() if n != suspect][:2]
        if not partners:
            return None
        results = []
        for partner in partners:
            passed = self.test([suspect, partner])
            if passed is None:
                return None
            results.append(passed)
        if not any(results):
            return True
        for partner, passed in zip(partners, results, strict=False):
            if not passed:
                self.links.append((suspect, partner))
        return False


def locate(
    nodes: Sequence[str], run: RunFn, threshold: float, max_runs: int | None = None
) -> Location:
    """Run ``nodes`` together; when that is below ``threshold``, find the slow node(s) or link
    with at most ``max_runs`` runs in all (default :func:`default_budget`)."""
    order = list(dict.fromkeys(nodes))
    if len(order) < 2:
        raise ValueError("locate needs two or more nodes")
    search = _Search(order, run, threshold, max_runs or default_budget(len(order)))
    first = search.test(order)
    if not first and not search.order[0].refused:
        remaining = list(order)
        while len(remaining) >= 2:
            suspect = search.isolate(remaining)
            if suspect is None:
                break
            confirmed = search.confirm(suspect)
            if confirmed is None:
                break
            if confirmed:
                search.slow.append(suspect)
            remaining = [n for n in remaining if n != suspect]
            if len(remaining) < 2 or search.test(remaining) is not False:
                break  # the rest passes (all cleared), or the budget is spent
            if not confirmed:
                break  # a link explains a pair, not the rest: leave it unresolved
        search.shrink()
    cleared = search.cleared()
    linked = {n for pair in search.links for n in pair}
    unexplained = {n for r in search.unexplained() for n in r.nodes} - set(search.slow) - linked
    decided = (set(search.slow) | set(cleared) | linked) - unexplained
    return Location(
        nodes=tuple(order),
        threshold=threshold,
        runs=tuple(search.order),
        slow=tuple(search.slow),
        links=tuple(search.links),
        cleared=tuple(n for n in cleared if n not in linked and n not in unexplained),
        unresolved=tuple(n for n in order if n not in decided),
        exhausted=search.exhausted,
    )


# ------------------------------------------------------------------------------------------
# Findings: one nccl.multinode result per node


def _best(runs: Iterable[RunOutcome]) -> RunOutcome | None:
    every = list(runs)
    measured = [r for r in every if r.busbw is not None and r.failure is None]
    if measured:
        return max(measured, key=lambda r: r.busbw or 0.0)
    return every[0] if every else None


def bw_text(run: RunOutcome | None) -> str:
    if run is None:
        return "no run"
    if run.busbw is not None and run.failure is None:
        return f"{run.busbw:g} GB/s"
    return f"no result ({run.failure})"


def findings(loc: Location, source: str | None = None) -> dict[str, CheckResult]:
    """The ``nccl.multinode`` result of every node of ``loc``."""
    t = loc.threshold
    evidence = tuple(r.describe() for r in loc.runs)
    out: dict[str, CheckResult] = {}

    def result(node: str, verdict: Verdict, message: str, measured: float | None) -> None:
        out[node] = CheckResult(
            check=CHECK,
            node=node,
            verdict=verdict,
            message=message,
            measured=measured,
            expected=t,
            unit="GB/s",
            source=source,
            evidence=evidence,
        )

    first = loc.runs[0] if loc.runs else None
    if first is not None and first.passes(t):
        for node in loc.nodes:
            result(
                node,
                Verdict.OK,
                f"all_reduce over {len(loc.nodes)} nodes: busbw {first.busbw:g} GB/s >= {t:g}",
                first.busbw,
            )
        return out
    for node in loc.slow:
        with_it = _best(r for r in loc.runs if node in r.nodes)
        without = _best(r for r in loc.runs if node not in r.nodes and r.passes(t))
        result(
            node,
            Verdict.FAIL,
            f"{node}: multi-node all_reduce runs with {node} reach {bw_text(with_it)}, "
            f"runs without it {bw_text(without)}; threshold {t:g} GB/s",
            with_it.busbw if with_it is not None else None,
        )
    for a, b in loc.links:
        pair = _best(r for r in loc.runs if set(r.nodes) == {a, b})
        for node, other in ((a, b), (b, a)):
            result(
                node,
                Verdict.FAIL,
                f"{node}: the 2-node all_reduce of {a} and {b} reaches {bw_text(pair)} < {t:g} "
                f"while {a} passes with other nodes: a slow link or path between "
                f"{node} and {other}",
                pair.busbw if pair is not None else None,
            )
    for node in loc.cleared:
        best = _best(r for r in loc.runs if node in r.nodes and r.passes(t))
        result(
            node,
            Verdict.OK,
            f"cleared: {bw_text(best)} >= {t:g} in a run of {len(best.nodes) if best else 0} "
            f"nodes (the run of all {len(loc.nodes)} nodes: {bw_text(first)})",
            best.busbw if best is not None else None,
        )
    for node in loc.unresolved:
        if first is not None and first.refused:
            why = "srun refused the run; nothing was located"
        elif loc.exhausted:
            why = f"not resolved within {len(loc.runs)} runs (validation.multinode.max_runs)"
        elif len(loc.nodes) == 2:
            why = "with two nodes the slow one cannot be told apart"
        else:
            why = "no node or link explains it (every smaller run passes, or two slow nodes)"
        result(
            node,
            Verdict.UNKNOWN,
            f"the run of {len(loc.nodes)} nodes reaches {bw_text(first)} < {t:g}; {why}",
            None,
        )
    return out


# ------------------------------------------------------------------------------------------
# Threshold


def threshold_for(exp: NodeExpectation) -> tuple[float | None, str]:
    """The group's multi-node busbw floor and where it comes from: cluster.yml's
    ``nccl_multinode_busbw_gbs``, else a share of the node's NIC line rate added up
    (gpuctl/data/multinode.yml, derived)."""
    configured = number(exp.thresholds.get(THRESHOLD_KEY))
    if configured is not None:
        return configured, exp.sources.get(THRESHOLD_KEY) or "cluster.yml"
    rates = [n.rate_gbps for n in exp.nics if n.rate_gbps]
    if not rates:
        return None, "not set"
    share = float(load_data("multinode.yml")["line_rate_share"])
    line = sum(rates) / 8.0  # Gb/s -> GB/s
    value = round(share * line, 1)
    return value, (
        f"derived: {share:g} x the NICs' line rate ({len(rates)} x {rates[0]} Gb/s = "
        f"{line:g} GB/s), data/multinode.yml"
    )


# ------------------------------------------------------------------------------------------
# Which nodes can run: Slurm's view of them


def slurm_exclusion(record: Mapping[str, Any] | None) -> tuple[Verdict, str] | None:
    """Why Slurm cannot run a job on a node (``scontrol show node``, parsed), or None.

    A drained node (by anyone) is left out with a warning: it is measured again once it is back
    in service, and its own checks decide whether ``--drain-failed`` resumes it. A node that is
    down (:attr:`gpuctl.slurm.SlurmNode.is_down`) or unknown to Slurm is not measured
    (UNKNOWN)."""
    if record is None:
        return Verdict.UNKNOWN, "not measured: Slurm does not know the node"
    node = SlurmNode.from_record(record)
    because = f" ({node.reason})" if node.reason else ""
    if node.is_down:
        return Verdict.UNKNOWN, f"not measured: Slurm state {node.text}{because}"
    if node.is_drained:
        return Verdict.WARN, f"not in the multi-node run: drained in Slurm{because}"
    return None


def busbw_ceiling_of(exp: NodeExpectation) -> Ceiling | None:
    """The most one node's NICs carry in a multi-node nccl-tests run (GB/s busbw)."""
    rates = [n.rate_gbps or fastest_rate(n.kind) for n in exp.nics]
    return multinode_busbw_ceiling(rates, exp.gpu_model)
