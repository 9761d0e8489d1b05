"""The multi-node phase of a collection (level long): which node groups take part, and each
group's nccl-tests runs started with srun on the controller and recorded under
``<bundle>/_multinode/<group>/`` (what the runs are, how the locator picks them and how they
are judged: :mod:`gpuctl.validation.multinode`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

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
    group_dir,
    locate,
    outcome,
    run_file,
    slurm_exclusion,
    srun_argv,
    threshold_for,
)
from gpuctl.validation.results import Verdict

_UNFINISHED = "not finished (the collection was stopped)"


Execute = Callable[[tuple[str, ...], int], ExecResult]  # a command on the controller


def participants(
    exps: Mapping[str, NodeExpectation], reached: Iterable[str], level: str | None
) -> dict[str, list[str]]:
    """Node group -> its reached GPU nodes at level ``long`` (groups of two or more)."""
    groups: dict[str, list[str]] = {}
    for node in reached:
        exp = exps.get(node)
        if exp is None or exp.gpu_count < 1 or (level or exp.level) != "long":
            continue
        groups.setdefault(exp.group, []).append(node)
    return {g: nodes for g, nodes in groups.items() if len(nodes) >= 2}


def write_not_measured(bundle: Path, groups: Mapping[str, list[str]], error: str) -> None:
    """Every group's meta.json saying why nothing was run (the nodes are judged UNKNOWN)."""
    for group, nodes in groups.items():
        meta = {"nodes": nodes, "error": error}
        write_atomic(group_dir(bundle, group) / META_FILE, json_bytes(meta))


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
        return None
    threshold, source = threshold_for(exps[usable[0]])
    # until the runs are done meta.json says they are not: a stopped collection is UNKNOWN
    meta.update({"threshold": threshold, "threshold_source": source, "error": _UNFINISHED})
    write_atomic(folder / META_FILE, json_bytes(meta))
    gpus = exps[usable[0]].gpu_count
    ceiling = busbw_ceiling_of(exps[usable[0]])

    def run(members: tuple[str, ...]) -> RunOutcome:
        argv = srun_argv(members, gpus, options)
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
        return got

    if threshold is None:  # measure once; judged UNKNOWN without a threshold
        run(tuple(usable))
        loc = None
    else:
        loc = locate(usable, run, threshold, options.max_runs)
    del meta["error"]
    write_atomic(folder / META_FILE, json_bytes(meta))
    return loc
