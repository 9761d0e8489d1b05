"""The multi-node phase of a collection (level long): which node groups take part, and each
group's nccl-tests runs started with srun on the controller and recorded under
``<bundle>/_multinode/<group>/`` (what the runs are, how the locator picks them and how they
are judged: :mod:`gpuctl.validation.multinode`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuctl.config.catalog import Ceiling
from gpuctl.fileio import write_atomic
from gpuctl.remote import ExecResult
from gpuctl.slurm import NotUnderstood, read_nodes
from gpuctl.validation.bundle import META_FILE, json_bytes, probe_meta
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.multinode import (
    RUN_TIMEOUT_S,
    Location,
    RunOutcome,
    SrunOptions,
    busbw_ceiling_of,
    locate,
    outcome,
    slurm_exclusion,
    srun_argv,
    threshold_for,
)
from gpuctl.validation.multinode_bundle import group_dir, run_file
from gpuctl.validation.rails import folder_name, rail_argv, rail_gpus, rail_limits
from gpuctl.validation.results import Verdict

_UNFINISHED = "not finished (the collection was stopped)"


MULTINODE_LEVELS = ("long", "burn")  # burn runs everything long runs
Execute = Callable[[tuple[str, ...], int], ExecResult]  # a command on the controller


def participants(
    exps: Mapping[str, NodeExpectation], reached: Iterable[str], level: str | None
) -> dict[str, list[str]]:
    """Node group -> its reached GPU nodes at level ``long`` or ``burn`` (groups of two or
    more)."""
    groups: dict[str, list[str]] = {}
    for node in reached:
        exp = exps.get(node)
        if exp is None or exp.gpu_count < 1 or (level or exp.level) not in MULTINODE_LEVELS:
            continue
        groups.setdefault(exp.group, []).append(node)
    return {g: nodes for g, nodes in groups.items() if len(nodes) >= 2}


def write_not_measured(
    bundle: Path,
    groups: Mapping[str, list[str]],
    error: str,
    exps: Mapping[str, NodeExpectation] | None = None,
) -> None:
    """Every group's meta.json, and each of its rails' (``exps``), saying why nothing was run
    (the nodes are judged UNKNOWN)."""
    for group, nodes in groups.items():
        meta = {"nodes": nodes, "error": error}
        write_atomic(group_dir(bundle, group) / META_FILE, json_bytes(meta))
        exp = (exps or {}).get(nodes[0]) if nodes else None
        for hca in rail_gpus(exp) if exp is not None else ():
            rail = group_dir(bundle, folder_name(group, hca))
            write_atomic(rail / META_FILE, json_bytes({**meta, "rail": hca}))


def slurm_records(text: str) -> dict[str, dict[str, Any]] | str:
    """``scontrol show node`` parsed, by node name (:func:`gpuctl.slurm.read_nodes`); or why it
    cannot be read."""
    try:
        return read_nodes(text)
    except NotUnderstood as exc:
        return f"scontrol show node: output not understood ({exc})"


def collect_group(
    bundle: Path,
    group: str,
    nodes: Sequence[str],
    exps: Mapping[str, NodeExpectation],
    execute: Execute,
    *,
    slurm: Mapping[str, Mapping[str, Any]],
    options: SrunOptions | None = None,
    on_run: Callable[[RunOutcome], None] | None = None,
) -> Location | None:
    """Run one group's multi-node test (and the locator) with ``execute`` on the controller,
    recording every run's output and outcome under ``<bundle>/_multinode/<group>/``."""
    options = options if options is not None else SrunOptions()
    folder = group_dir(bundle, group)
    excluded: dict[str, dict[str, str]] = {}
    usable: list[str] = []
    for node in nodes:
        why = slurm_exclusion(slurm.get(node))
        if why is None:
            usable.append(node)
        else:
            excluded[node] = {"verdict": why[0].value, "message": why[1]}
    meta: dict[str, Any] = {"nodes": usable, "excluded": excluded, "runs": []}
    if options.max_runs:
        meta["max_runs"] = options.max_runs
    if len(usable) < 2:  # the others are out of service: no fault of this one
        for node in usable:
            excluded[node] = {
                "verdict": Verdict.WARN.value,
                "message": f"not measured: no other node of group {group} can run in Slurm",
            }
        meta["nodes"] = []
        write_atomic(folder / META_FILE, json_bytes(meta))
        # each rail's the same: not run, for the same reasons
        for hca, gpus in rail_gpus(exps[nodes[0]]).items() if nodes else ():
            rail = {"nodes": [], "excluded": excluded, "runs": [], "rail": hca, "gpus": list(gpus)}
            write_atomic(group_dir(bundle, folder_name(group, hca)) / META_FILE, json_bytes(rail))
        return None
    exp = exps[usable[0]]
    threshold, source = threshold_for(exp)

    def whole(members: tuple[str, ...]) -> tuple[str, ...]:
        return srun_argv(members, exp.gpu_count, options)

    loc, first = _measure(folder, meta, usable, whole, execute, threshold, source, options,
                          on_run, busbw_ceiling_of(exp))  # fmt: skip
    # then each rail alone (nics[].rails), in <bundle>/_multinode/<group>@<adapter>/
    for hca, gpus in rail_gpus(exp).items():
        rail_threshold, rail_source, rail_ceiling = rail_limits(exp, hca)

        def one_rail(
            members: tuple[str, ...], hca: str = hca, gpus: tuple[int, ...] = gpus
        ) -> tuple[str, ...]:
            return rail_argv(members, hca, gpus, exp.gpu_count, options)

        # a node the group's run found slow would fail every rail: the rails run without it
        slow = set(loc.slow) if loc is not None else set()
        members = [n for n in usable if n not in slow]
        left_out: dict[str, dict[str, str]] = dict(excluded)  # drained, down: as in the group's
        left_out |= {
            n: {
                "verdict": Verdict.UNKNOWN.value,
                "message": "not measured on its own rail: slow in the group's run (nccl.multinode)",
            }
            for n in sorted(slow)
        }
        rail_meta: dict[str, Any] = {
            "nodes": members if len(members) >= 2 else [],
            "excluded": left_out,
            "runs": [],
            "rail": hca,
            "gpus": list(gpus),
        }
        if options.max_runs:
            rail_meta["max_runs"] = options.max_runs
        rail_folder = group_dir(bundle, folder_name(group, hca))
        if first is not None and first.refused:  # srun would refuse each rail's run too
            rail_meta["error"] = f"srun refused the group's run: {first.failure}"
            write_atomic(rail_folder / META_FILE, json_bytes(rail_meta))
            continue
        if len(members) < 2:
            for node in members:
                left_out[node] = {
                    "verdict": Verdict.UNKNOWN.value,
                    "message": "not measured on its own rail: no other node of the group "
                    "passed the group's run",
                }
            write_atomic(rail_folder / META_FILE, json_bytes(rail_meta))
            continue
        _measure(rail_folder, rail_meta, members, one_rail, execute, rail_threshold,
                 rail_source, options, on_run, rail_ceiling)  # fmt: skip
    return loc


def _measure(
    folder: Path,
    meta: dict[str, Any],
    usable: list[str],
    argv_of: Callable[[tuple[str, ...]], tuple[str, ...]],
    execute: Execute,
    threshold: float | None,
    source: str,
    options: SrunOptions,
    on_run: Callable[[RunOutcome], None] | None,
    ceiling: Ceiling | None,
) -> tuple[Location | None, RunOutcome | None]:
    """The runs of one folder: the first over every usable node, then the locator's (none
    without a threshold), each recorded as it ends. Returns the locator's result and the
    first run."""
    outcomes: list[RunOutcome] = []
    # until the runs are done meta.json says they are not: a stopped collection is UNKNOWN
    meta.update({"threshold": threshold, "threshold_source": source, "error": _UNFINISHED})
    write_atomic(folder / META_FILE, json_bytes(meta))

    def run(members: tuple[str, ...]) -> RunOutcome:
        argv = argv_of(members)
        res = execute(argv, RUN_TIMEOUT_S)
        name = run_file(len(meta["runs"]) + 1)
        if res.stdout or res.error is None:
            write_atomic(folder / name, res.stdout)
        record = {**probe_meta(res, argv, RUN_TIMEOUT_S), "file": name, "nodes": list(members)}
        meta["runs"].append(record)
        write_atomic(folder / META_FILE, json_bytes(meta))
        got = outcome(
            members,
            res.stdout.decode("utf-8", errors="replace") if res.stdout else None,
            rc=res.rc,
            timed_out=res.timed_out,
            error=record.get("error"),
            stderr=res.stderr.decode("utf-8", errors="replace"),
            ceiling=ceiling,
        )
        if on_run is not None:
            on_run(got)
        outcomes.append(got)
        return got

    if threshold is None:  # measure once; judged UNKNOWN without a threshold
        run(tuple(usable))
        loc = None
    else:
        loc = locate(usable, run, threshold, options.max_runs)
    del meta["error"]
    write_atomic(folder / META_FILE, json_bytes(meta))
    return loc, outcomes[0] if outcomes else None
