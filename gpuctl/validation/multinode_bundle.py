"""The bundle side of the multi-node runs: ``<bundle>/_multinode/<folder>/meta.json`` and
``run-NN.txt`` (a node group's runs in ``<group>``, one rail's in ``<group>@<adapter>``), read
again and judged: the locator of :mod:`gpuctl.validation.multinode` replayed over the recorded
runs with today's thresholds."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuctl.config.catalog import Ceiling
from gpuctl.validation.bundle import (
    META_FILE,
    MULTINODE_DIR,
    OUTPUT_LIMIT,
    BundleFileError,
    read_bundle_file,
    read_bundle_json,
    short,
)
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.multinode import (
    CHECK,
    THRESHOLD_KEY,
    RunFn,
    RunOutcome,
    SrunOptions,
    busbw_ceiling_of,
    bw_text,
    findings,
    locate,
    outcome,
    threshold_for,
)
from gpuctl.validation.rails import as_rail, rail_gpus, rail_limits, split_folder
from gpuctl.validation.results import CheckResult, Verdict
from gpuctl.validation.suite import not_judged

_DEFAULT = SrunOptions()  # cluster.yml's validation.multinode when it sets nothing

# ------------------------------------------------------------------------------------------
# The bundle: <bundle>/_multinode/<group>/meta.json and run-NN.txt


def group_dir(bundle: Path, group: str) -> Path:
    return bundle / MULTINODE_DIR / group


def run_file(index: int) -> str:
    return f"run-{index:02d}.txt"


def _text(value: Any, default: str) -> str:
    return value[:500] if isinstance(value, str) and value else default


def read_runs(
    folder: Path, meta: Mapping[str, Any], ceiling: Ceiling | None = None
) -> dict[frozenset[str], RunOutcome]:
    """The recorded runs of one group, read again from their outputs (``folder`` is
    ``<bundle>/_multinode/<group>``): each file only inside that folder and never through a
    link; a run whose output cannot be read is a failed run saying why."""
    bundle = folder.parent.parent
    runs: dict[frozenset[str], RunOutcome] = {}
    recorded = meta.get("runs")
    for item in recorded if isinstance(recorded, list) else []:
        if not isinstance(item, dict):
            continue
        listed = item.get("nodes")
        if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
            continue
        nodes = tuple(listed)
        name = item.get("file")
        error = item.get("error")
        error = _text(error, "the recorded error is not a string") if error else None
        text: str | None = None
        if not isinstance(name, str) or not name:
            error = error or "no output recorded"
        else:
            try:
                rel = f"{MULTINODE_DIR}/{folder.name}/{name}"
                data = read_bundle_file(bundle, rel, OUTPUT_LIMIT)
            except BundleFileError as exc:
                data, error = None, str(exc)
            text = data.decode("utf-8", errors="replace") if data is not None else None
        rc = item.get("rc")
        runs[frozenset(nodes)] = outcome(
            nodes,
            text,
            rc=rc if isinstance(rc, int) and not isinstance(rc, bool) else None,
            timed_out=item.get("timed_out") is True,
            error=error or (None if text is not None else "no output recorded"),
            stderr=_text(item.get("stderr"), ""),
            ceiling=ceiling,
        )
    return runs


def replay(recorded: Mapping[frozenset[str], RunOutcome]) -> RunFn:
    """A run function answering from a bundle: a run it does not hold is not measured."""

    def run(nodes: tuple[str, ...]) -> RunOutcome:
        found = recorded.get(frozenset(nodes))
        if found is not None:
            return RunOutcome(nodes, found.busbw, found.size, found.failure, found.refused)
        return RunOutcome(nodes, failure="not measured: this run is not in the bundle")

    return run


def judge_bundle_dir(
    bundle: Path, exps: Mapping[str, NodeExpectation], options: SrunOptions = _DEFAULT
) -> tuple[list[CheckResult], dict[str, Any]]:
    """Every node's ``nccl.multinode`` result from a bundle's recorded runs (the locator is
    replayed over them with today's thresholds), and a summary per group for the report.

    Read like every file of a bundle (never through a link, bounded): a group whose folder or
    meta.json cannot be read or is not the shape gpuctl writes is UNKNOWN for the GPU nodes of
    that node group; one whose judging raises fails them, the other groups are judged."""
    results: list[CheckResult] = []
    summary: dict[str, Any] = {}
    root = bundle / MULTINODE_DIR
    try:
        mode = os.lstat(root).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return results, summary
    if not stat.S_ISDIR(mode):
        return results, summary  # a link or a file: no run is read (due runs are UNKNOWN)
    for name in sorted(e.name for e in os.scandir(root) if not e.name.startswith(".")):
        group, rail = split_folder(name)
        members = [n for n, e in exps.items() if e.group == group and e.gpu_count]
        if rail is not None:
            # a rail's folder: only for a rail of that group, only its nodes judged
            members = [n for n in members if rail in rail_gpus(exps[n])]
            if not members:
                continue
        got, info = _judge_folder(bundle, name, rail, members, exps, options)
        if rail is not None:
            got = [as_rail(r, rail) for r in got if r.node in members]
        results += got
        if info is not None:
            summary[name] = info
    return results, summary


def _judge_folder(
    bundle: Path,
    name: str,
    rail: str | None,
    members: list[str],
    exps: Mapping[str, NodeExpectation],
    options: SrunOptions,
) -> tuple[list[CheckResult], dict[str, Any] | None]:
    """One folder's results (as the group's check: the caller relabels a rail's)."""
    rel = f"{MULTINODE_DIR}/{name}/{META_FILE}"
    problem: str | None = None
    meta: Any = None
    try:
        meta = read_bundle_json(bundle, rel)
    except FileNotFoundError:
        problem = f"{rel} is missing"
    except BundleFileError as exc:
        problem = str(exc)
    if problem is None:
        problem = _meta_problem(meta, rel)
    if problem is not None:
        return [_unknown(n, f"not judged: {problem}") for n in members], None
    try:
        return judge_group(bundle / MULTINODE_DIR / name, meta, exps, options, rail=rail)
    except Exception as exc:  # one group's bad record never stops the others
        listed = [n for n in meta.get("nodes") or [] if isinstance(n, str) and n in exps]
        return [not_judged(n, exc, CHECK) for n in listed or members], None


def _unknown(node: str, message: str) -> CheckResult:
    return CheckResult(check=CHECK, node=node, verdict=Verdict.UNKNOWN, message=message)


def _meta_problem(meta: Any, rel: str) -> str | None:
    """Why a group's meta.json is not the shape the collector writes, or None."""
    if not isinstance(meta, dict):
        return f"{rel}: not a JSON object"
    nodes = meta.get("nodes", [])
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
        return f"{rel}: nodes is not a list of node names"
    excluded = meta.get("excluded", {})
    if excluded is not None and not isinstance(excluded, dict):
        return f"{rel}: excluded is not an object"
    runs = meta.get("runs", [])
    if runs is not None and not isinstance(runs, list):
        return f"{rel}: runs is not a list"
    return None


_EXCLUDED_VERDICTS = (Verdict.WARN, Verdict.UNKNOWN)  # what collect_group writes


def judge_group(
    folder: Path,
    meta: Mapping[str, Any],
    exps: Mapping[str, NodeExpectation],
    options: SrunOptions = _DEFAULT,
    *,
    rail: str | None = None,
) -> tuple[list[CheckResult], dict[str, Any]]:
    """One group's results from its meta.json (and run outputs); with ``rail``, one rail's
    runs of the group, judged against that rail's floor (the results still as the group's
    check: :func:`gpuctl.validation.rails.as_rail` relabels them)."""
    nodes = [str(n) for n in meta.get("nodes") or [] if str(n) in exps]
    excluded: dict[str, Any] = dict(meta.get("excluded") or {})
    results: list[CheckResult] = []
    for node, why in excluded.items():
        if node not in exps or node in nodes:
            continue
        verdict, message = Verdict.UNKNOWN, "not measured: its exclusion record is not readable"
        if isinstance(why, dict):
            said = why.get("verdict")
            listed = {v.value: v for v in _EXCLUDED_VERDICTS}
            if isinstance(said, str) and said in listed:
                verdict = listed[said]
                message = _text(why.get("message"), "not measured")
            else:  # an exclusion never passes a node
                message = f"not measured: the exclusion record says {short(said, 80)}"
        results.append(CheckResult(check=CHECK, node=node, verdict=verdict, message=message))
    info: dict[str, Any] = {"nodes": nodes, "excluded": sorted(excluded)}
    if not nodes:
        return results, info
    if meta.get("error"):
        error = _text(meta["error"], "the recorded error is not a string")
        results += [_unknown(node, f"not measured: {error}") for node in nodes]
        info["error"] = error
        return results, info
    if rail is None:
        threshold, source = threshold_for(exps[nodes[0]])
        ceiling = busbw_ceiling_of(exps[nodes[0]])
    else:
        threshold, source, ceiling = rail_limits(exps[nodes[0]], rail)
    recorded = read_runs(folder, meta, ceiling)
    if threshold is None:
        first = recorded.get(frozenset(nodes))
        for node in nodes:
            results.append(
                CheckResult(
                    check=CHECK,
                    node=node,
                    verdict=Verdict.UNKNOWN,
                    message=f"{bw_text(first)} over {len(nodes)} nodes, but no threshold: set "
                    f"validation.thresholds.{THRESHOLD_KEY}",
                    measured=first.busbw if first is not None else None,
                    unit="GB/s",
                )
            )
        return results, info
    max_runs = _int(meta.get("max_runs")) or options.max_runs
    loc = locate(nodes, replay(recorded), threshold, max_runs)
    found = findings(loc, source)
    results += [found[n] for n in nodes if n in found]
    info.update(
        {
            "threshold": threshold,
            "source": source,
            "passed": loc.passed,
            "runs": [
                {"nodes": list(r.nodes), "busbw": r.busbw, "failure": r.failure} for r in loc.runs
            ],
            "slow": list(loc.slow),
            "links": [list(p) for p in loc.links],
            "unresolved": list(loc.unresolved),
        }
    )
    return results, info


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
