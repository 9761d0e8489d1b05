"""Judge a whole cluster: per-node raw outputs (a bundle) -> ValidationReport.

A bundle directory holds one folder per node with one file per probe (``<kind>.txt``) and a
``meta.json`` saying how each probe ended: ``{"probes": {"<kind>": {"rc": 0, "timed_out":
false, "error": null}}}``. ib_write_bw client outputs are ``perftest-<hca>.txt``. A node whose
folder is missing, or that could not be reached (``"unreachable": "reason"`` in meta.json), is a
failed node with that reason, never skipped.

A bundle may come from someone else: every file of it is read with
:func:`gpuctl.fileio.read_inside` (never through a link, never anything but a regular file
inside the bundle, at most so many bytes). What cannot be read, or is not the shape gpuctl
writes, is UNKNOWN with the reason, never taken as a success: a node folder or meta.json that
cannot be read (or a missing meta.json: how the probes ended is not recorded) makes the node
UNKNOWN (``node.bundle``), a refused output or probe record makes that probe UNKNOWN. A node
whose judging raises anyway fails alone (``node.judged``); the other nodes are judged.
"""

from __future__ import annotations

import gc
import json
import math
import os
import re
import stat
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpuctl.config.model import Cluster
from gpuctl.fileio import UnsafePath, decode_json, read_inside
from gpuctl.validation.expect import NodeExpectation, expectations
from gpuctl.validation.judges import (
    NODE_JUDGES,
    ProbeOutput,
    judge_fleet_relative,
    judge_ib_write_bw,
    judge_xid,
    port_rates,
    threshold_value,
)
from gpuctl.validation.results import CheckResult, NodeReport, ValidationReport, Verdict

META_FILE = "meta.json"
MISSING = "missing from the bundle"
_MIB = 1024 * 1024
# The collector keeps at most 64 MiB of a probe's output (one read more before it cuts it off):
# anything larger was not written by it and is not read.
OUTPUT_LIMIT = 65 * _MIB
META_LIMIT = 16 * _MIB  # meta.json, bundle.json: stderr tails and pair lists, far below this
# A probe kind names a file of the node folder: nothing with a path separator or a leading dot
_KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# The collection time ends the Xid window: a clock this far ahead of this machine's is skew,
# further is not a collection time; nor is one before gpuctl's bundle format existed.
CLOCK_SKEW = timedelta(minutes=5)
OLDEST_COLLECTION = datetime(2020, 1, 1, tzinfo=UTC)
# Worker processes judge a cluster only when it has more nodes than this.
POOL_MIN_NODES = 64


# ------------------------------------------------------------------------------------------
# Reading a bundle: never through a link, never more than so many bytes


class BundleFileError(Exception):
    """A file of a bundle that is not read or not understood; the message says why."""


def read_bundle_file(root: Path, rel: str | Path, limit: int) -> bytes | None:
    """The bytes of the regular file ``root/rel`` (None when absent); BundleFileError for a
    link, something that is not a regular file, a path out of ``root`` or more than ``limit``
    bytes."""
    try:
        data = read_inside(root, rel, limit=limit + 1)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except UnsafePath as exc:
        raise BundleFileError(f"{exc}: not read") from None
    except OSError as exc:
        raise BundleFileError(f"{rel}: cannot be read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise BundleFileError(f"{rel}: larger than {limit // _MIB} MiB: not read")
    return data


def read_bundle_json(root: Path, rel: str | Path, limit: int = META_LIMIT) -> Any:
    """The JSON value of ``root/rel``; FileNotFoundError when absent, BundleFileError when it
    cannot be read or is not JSON (not UTF-8, nested too deep, ...)."""
    data = read_bundle_file(root, rel, limit)
    if data is None:
        raise FileNotFoundError(str(rel))
    try:
        return decode_json(data)
    except ValueError as exc:
        raise BundleFileError(f"{rel}: {exc}") from None


def short(value: object, limit: int = 200) -> str:
    """A value from a bundle in a message: a string as it is, anything else as JSON; cut."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, default=str)
        except (ValueError, RecursionError):
            text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def collection_time(
    header: Mapping[str, Any], clock: datetime | None = None
) -> tuple[datetime | None, str | None]:
    """When a bundle was collected (bundle.json's ``collected_at``), or why that is not known.

    Only a time stamp with a time zone, not before 2020 and not ahead of this machine's clock
    (``clock``, default now) by more than :data:`CLOCK_SKEW` is trusted: the Xid window ends at
    it, and an implausible one would hide events (or place the window nowhere)."""
    if not header:
        return None, "the bundle has no bundle.json: when it was collected is not recorded"
    stamp = header.get("collected_at")
    if stamp is None:
        return None, "bundle.json does not say when the bundle was collected (collected_at)"
    if not isinstance(stamp, str):
        return None, f"collected_at {short(stamp, 40)} is not a time stamp"
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return None, f"collected_at {short(stamp, 40)!r} is not an ISO 8601 time"
    if when.tzinfo is None or when.utcoffset() is None:
        return None, f"collected_at {stamp} has no time zone"
    now = clock or datetime.now(UTC)
    if when > now + CLOCK_SKEW:
        return None, (
            f"collected_at {stamp} is in the future (this machine's clock says "
            f"{now.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ})"
        )
    if when < OLDEST_COLLECTION:
        return None, f"collected_at {stamp} is before 2020: not a plausible collection time"
    return when, None


@dataclass(frozen=True, slots=True)
class NodeBundle:
    node: str
    outputs: dict[str, ProbeOutput] = field(default_factory=dict)
    ib_write_bw: dict[str, ProbeOutput] = field(default_factory=dict)
    unreachable: str | None = None
    problem: str | None = None  # the node folder or its meta.json cannot be read: UNKNOWN


def _probe_record(kind: str, info: Any) -> tuple[int | None, bool, str | None]:
    """rc, timed_out and error of one meta.json probe record; a record of the wrong shape is
    an error (the probe is UNKNOWN), never a success."""
    where = f"meta.json: probes.{kind}"
    if not isinstance(info, dict):
        return None, False, f"{where} is not an object"
    rc = info.get("rc", 0)
    if rc is not None and (isinstance(rc, bool) or not isinstance(rc, int)):
        return None, False, f"{where}.rc is not an exit status ({short(rc, 40)})"
    timed_out = info.get("timed_out", False)
    if not isinstance(timed_out, bool):
        return None, False, f"{where}.timed_out is not true or false"
    error = info.get("error")
    if error is not None and not isinstance(error, str):
        return None, False, f"{where}.error is not a string"
    return rc, timed_out, error


def read_node_meta(root: Path, name: str) -> tuple[dict[str, Any] | None, str | None]:
    """``root/name/meta.json`` as an object, or why it cannot be used."""
    rel = f"{name}/{META_FILE}"
    try:
        meta = read_bundle_json(root, rel)
    except FileNotFoundError:
        return None, f"{rel} is missing: how its probes ended is not recorded"
    except BundleFileError as exc:
        return None, str(exc)
    if not isinstance(meta, dict):
        return None, f"{rel}: not a JSON object"
    return meta, None


def load_node_bundle(node: str, folder: Path) -> NodeBundle:
    """One node's folder of a bundle (``folder`` = ``<bundle>/<node>``), read safely."""
    root, name = folder.parent, folder.name
    try:
        mode = os.lstat(folder).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return NodeBundle(node, unreachable=MISSING)
    except OSError as exc:
        return NodeBundle(node, problem=f"{name}: cannot be read: {exc.strerror or exc}")
    if stat.S_ISLNK(mode):
        return NodeBundle(node, problem=f"{name}: a symlink (never followed in a bundle): not read")
    if not stat.S_ISDIR(mode):
        return NodeBundle(node, problem=f"{name}: not a folder")
    meta, problem = read_node_meta(root, name)
    if meta is None:
        return NodeBundle(node, problem=problem)
    if meta.get("unreachable"):
        return NodeBundle(node, unreachable=short(meta["unreachable"], 500))
    probes = meta.get("probes", {})
    if probes is None:
        probes = {}
    if not isinstance(probes, dict):
        return NodeBundle(node, problem=f"{name}/{META_FILE}: probes is not an object")
    try:
        files = {e.name[:-4] for e in os.scandir(folder) if e.name.endswith(".txt")}
    except OSError as exc:
        return NodeBundle(node, problem=f"{name}: cannot be listed: {exc.strerror or exc}")
    outputs: dict[str, ProbeOutput] = {}
    per_hca: dict[str, ProbeOutput] = {}
    for kind in sorted(k for k in files | set(probes) if _KIND.fullmatch(k)):
        hca = kind.removeprefix("perftest-") if kind.startswith("perftest-") else None
        rc, timed_out, error = _probe_record(kind, probes.get(kind, {}))
        text: str | None = None
        try:
            data = read_bundle_file(root, f"{name}/{kind}.txt", OUTPUT_LIMIT)
        except BundleFileError as exc:
            rc, timed_out, error = None, False, str(exc)
        else:
            text = data.decode("utf-8", errors="replace") if data is not None else None
        out = ProbeOutput(
            kind="perftest" if hca else kind,
            text=text,
            rc=rc,
            timed_out=timed_out,
            error=error,
        )
        if hca:
            per_hca[hca] = out
        else:
            outputs[kind] = out
    return NodeBundle(node, outputs, per_hca)


def load_bundle(directory: Path, node_names: list[str]) -> dict[str, NodeBundle]:
    return {n: load_node_bundle(n, directory / n) for n in node_names}


def _without_window(
    exp: NodeExpectation, results: list[CheckResult], problem: str
) -> list[CheckResult]:
    """judge_xid's results over the whole log when no collection time can be trusted: its
    findings stand (every event counts), an OK does not (the window cannot be placed)."""
    if all(r.verdict is Verdict.UNKNOWN for r in results):
        return results  # the log itself could not be judged: those UNKNOWNs say why
    kept = [r for r in results if not (r.check == "xid" and r.verdict is Verdict.OK)]
    return [
        *kept,
        CheckResult(
            check="xid.window",
            node=exp.node,
            verdict=Verdict.UNKNOWN,
            message=f"the Xid window cannot be placed: {problem}; every Xid event in the "
            "log counts",
        ),
    ]


def judge_node(
    exp: NodeExpectation,
    bundle: NodeBundle,
    now: datetime | None = None,
    *,
    pairs: bool = True,
    clock_problem: str | None = None,
) -> list[CheckResult]:
    """Every check of one node. ``pairs=False`` leaves out ib_write_bw, which needs a second
    node (`gpuctl node-check` checks a node alone). ``now`` ends the Xid window;
    ``clock_problem`` says why no collection time can be trusted (the Xid check is then judged
    over the whole log and cannot be OK)."""
    if bundle.problem is not None:
        return [
            CheckResult(
                check="node.bundle",
                node=exp.node,
                verdict=Verdict.UNKNOWN,
                message=f"not judged: {bundle.problem}",
            )
        ]
    if bundle.unreachable is not None:
        return [
            CheckResult(
                check="node.reachable",
                node=exp.node,
                verdict=Verdict.FAIL,
                message=f"not checked: {bundle.unreachable}",
            )
        ]
    results: list[CheckResult] = [
        CheckResult(
            check="node.reachable", node=exp.node, verdict=Verdict.OK, message="outputs collected"
        )
    ]
    for judge in NODE_JUDGES:
        if judge is judge_xid:
            found = judge_xid(exp, bundle.outputs, None if clock_problem else now)
            if clock_problem is not None and found:
                found = _without_window(exp, found, clock_problem)
            results += found
        else:
            results += judge(exp, bundle.outputs)
    if pairs and exp.nics and exp.level != "quick":
        # the ceiling is the rate ibstat reports, where it does
        results += judge_ib_write_bw(exp, bundle.ib_write_bw, port_rates(bundle.outputs))
    return results


def not_judged(node: str, exc: BaseException, check: str = "node.judged") -> CheckResult:
    """The result of a node whose judging raised: it fails (never passes by a crash)."""
    return CheckResult(
        check=check,
        node=node,
        verdict=Verdict.FAIL,
        message=f"could not be judged: {type(exc).__name__}: {short(str(exc), 300)}",
    )


def _chart_data(exp: NodeExpectation, bundle: NodeBundle) -> dict[str, Any]:
    """What the HTML report draws for one node (topology matrix, busbw curve)."""
    extra: dict[str, Any] = {}
    topo = bundle.outputs.get("topo")
    if topo is not None and topo.failure() is None:
        data = topo.parse_as("topo").data
        devices = list(data.get("gpus") or []) + list(data.get("nics") or [])
        if devices:
            extra["topology"] = {"devices": devices, "links": data.get("links") or {}}
    nccl = bundle.outputs.get("nccl")
    if nccl is not None and nccl.failure() is None:
        rows = nccl.parse_as("nccl").data.get("rows") or []
        curve = [
            [float(r["size"]), float(r["out_of_place"]["busbw"])]
            for r in rows
            if isinstance(r.get("size"), int | float)
            and isinstance((r.get("out_of_place") or {}).get("busbw"), int | float)
            and math.isfinite(r["size"])
            and math.isfinite(r["out_of_place"]["busbw"])
        ]
        if curve:
            extra["nccl"] = curve
    return extra


@dataclass(frozen=True, slots=True)
class _Item:
    """One node to judge (picklable: sent to a worker process)."""

    exp: NodeExpectation
    source: NodeBundle | Path
    charts: bool
    now: datetime | None
    clock_problem: str | None = None


def _judge_one(item: _Item) -> tuple[list[CheckResult], dict[str, Any]]:
    try:
        return _judge_item(item)
    except Exception as exc:  # one node's bad output never stops the others
        return [not_judged(item.exp.node, exc)], {}


def _judge_item(item: _Item) -> tuple[list[CheckResult], dict[str, Any]]:
    exp, source = item.exp, item.source
    # a worker reads its node's folder itself: no bundle text crosses process boundaries
    bundle = load_node_bundle(exp.node, source) if isinstance(source, Path) else source
    results = judge_node(exp, bundle, item.now, clock_problem=item.clock_problem)
    judged = bundle.unreachable is None and bundle.problem is None
    extra = _chart_data(exp, bundle) if item.charts and judged else {}
    bw = {
        r.subject: float(r.measured)
        for r in results
        if r.check == "ib.write_bw" and r.subject and isinstance(r.measured, int | float)
    }
    if bw:
        extra["ib_write_bw"] = bw
    return results, extra


# Parsing allocates many small, short-lived objects and almost no cycles: the default
# generation-0 threshold (700) makes the collector run thousands of times for nothing.
_GC_THRESHOLD = 50_000


@contextmanager
def fewer_gc_passes() -> Iterator[None]:
    """Raise the generation-0 GC threshold for allocation-heavy work (judging, reports)."""
    saved = gc.get_threshold()
    gc.set_threshold(_GC_THRESHOLD, saved[1], saved[2])
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def _worker_init() -> None:
    gc.set_threshold(_GC_THRESHOLD, *gc.get_threshold()[1:])


def judge_directory(cluster: Cluster, directory: Path, **kwargs: Any) -> ValidationReport:
    """Judge a bundle directory (one folder per node); workers read the folders themselves."""
    return judge_cluster(cluster, directory, **kwargs)


def judge_cluster(
    cluster: Cluster,
    bundles: Mapping[str, NodeBundle] | Path,
    *,
    level: str | None = None,
    unknown_fails: bool | None = None,
    now: datetime | None = None,
    clock_problem: str | None = None,
    generated_at: str | None = None,
    charts: bool = True,
    jobs: int = 1,
) -> ValidationReport:
    """Judge every node (``jobs`` worker processes for large clusters) and the fleet. A node
    whose judging raises fails with the reason; the others are judged as usual."""
    exps = expectations(cluster)
    items = [
        _Item(
            exp,
            bundles / node
            if isinstance(bundles, Path)
            else bundles.get(node) or NodeBundle(node, unreachable=MISSING),
            charts,
            now,
            clock_problem,
        )
        for node, exp in exps.items()
    ]
    with fewer_gc_passes():
        judged: list[tuple[list[CheckResult], dict[str, Any]]] | None = None
        if jobs > 1 and len(items) > POOL_MIN_NODES:
            chunk = max(1, len(items) // (jobs * 8))
            try:
                with ProcessPoolExecutor(max_workers=jobs, initializer=_worker_init) as pool:
                    judged = list(pool.map(_judge_one, items, chunksize=chunk))
            except BrokenProcessPool:
                judged = None  # a worker died: judge here, node by node
        if judged is None:
            judged = [_judge_one(item) for item in items]
    per_node: dict[str, list[CheckResult]] = {}
    extra: dict[str, Any] = {}
    for item, (results, parts) in zip(items, judged, strict=True):
        per_node[item.exp.node] = results
        for key, value in parts.items():
            extra.setdefault(key, {})[item.exp.node] = value
    if unknown_fails is None:
        unknown_fails = cluster.validation.unknown_is_failure
    fraction = cluster.validation.thresholds.fleet_relative_min or 0.95
    everything = [r for rs in per_node.values() for r in rs]
    for check in ("nccl.busbw", "ib.write_bw"):
        for r in judge_fleet_relative(everything, check, fraction):
            per_node[r.node].append(r)
    any_exp = next((e for e in exps.values() if e.gpu_count), None)
    if any_exp is not None:
        extra["nccl_threshold"] = any_exp.thresholds.get("nccl_all_reduce_busbw_gbs")
        rate = any_exp.nics[0].rate_gbps if any_exp.nics else None
        extra["ib_write_bw_threshold"] = threshold_value(
            any_exp.thresholds.get("ib_write_bw_gbps"), rate
        )
        extra["ib_line_rate"] = rate
    return ValidationReport(
        cluster=cluster.name,
        level=level or cluster.validation.level.value,
        nodes=tuple(NodeReport(n, tuple(rs), unknown_fails) for n, rs in per_node.items()),
        generated_at=generated_at,
        extra=extra,
    )
