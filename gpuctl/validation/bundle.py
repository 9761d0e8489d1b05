"""The bundle: what `gpuctl validate` and `gpuctl node-check` collect, written and read here.

A bundle directory holds ``bundle.json`` (the header: gpuctl version, ``collected_at``, level,
nodes, ``complete``, the unreachable nodes and the ib_write_bw pairs), ``results.json`` (the
judged report, for `gpuctl report`), ``_multinode/`` (multi-node runs,
:mod:`gpuctl.validation.multinode`) and one folder per node with one file per probe
(``<kind>.txt``) and a ``meta.json`` saying how each probe ended: ``{"probes": {"<kind>":
{"rc": 0, "timed_out": false, "error": null, ...}}}``. ib_write_bw outputs are
``perftest-<hca>.txt``. A node whose folder is missing, or that could not be reached
(``"unreachable": "reason"`` in meta.json), is a failed node with that reason, never skipped.

Every file is written with :func:`gpuctl.fileio.write_atomic` (a reader never sees half a
file). A bundle may come from someone else: every file of it is read with
:func:`gpuctl.fileio.read_inside` (never through a link, never anything but a regular file
inside the bundle, at most so many bytes). What cannot be read, or is not the shape gpuctl
writes, is UNKNOWN with the reason, never taken as a success: a node folder or meta.json that
cannot be read (or a missing meta.json: how the probes ended is not recorded) makes the node
UNKNOWN (``node.bundle``), a refused output or probe record makes that probe UNKNOWN.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpuctl import __version__
from gpuctl.config.model import LEVELS
from gpuctl.errors import UsageError
from gpuctl.fileio import UnsafePath, decode_json, open_folder, read_in_folder, read_inside
from gpuctl.fileio import write_atomic as write_atomic  # every bundle file, asserted by tests
from gpuctl.remote import CANNOT_RUN_RC, NOT_FOUND_RC, ExecResult
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.results import ValidationReport, printable

BUNDLE_FILE = "bundle.json"
RESULTS_FILE = "results.json"
META_FILE = "meta.json"
MULTINODE_DIR = "_multinode"  # <bundle>/_multinode/<group>/{meta.json,run-NN.txt}
MISSING = "missing from the bundle"
STDERR_TAIL = 2000  # characters of stderr kept in meta.json
STDERR_SHOWN = 200  # characters of it an error message quotes
_MIB = 1024 * 1024
# The collector keeps at most 64 MiB of a probe's output (one read more before it cuts it off):
# anything larger was not written by it and is not read.
OUTPUT_LIMIT = 65 * _MIB
META_LIMIT = 16 * _MIB  # meta.json, bundle.json: stderr tails and pair lists, far below this
# A probe kind names a file of the node folder: nothing with a path separator or a leading dot
# (``:``: an adapter port's name, ``perfquery.start.mlx4_0:2``)
_KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
# The collection time ends the Xid window: a clock this far ahead of this machine's is skew,
# further is not a collection time; nor is one before gpuctl's bundle format existed.
CLOCK_SKEW = timedelta(minutes=5)
OLDEST_COLLECTION = datetime(2020, 1, 1, tzinfo=UTC)


# ------------------------------------------------------------------------------------------
# Writing a bundle


def json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def iso(when: datetime) -> str:
    """A collection time as bundle.json says it (UTC, seconds)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_out(out: Path) -> None:
    """A bundle is written into a new or empty directory only."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out}: exists and is not an empty directory")


def new_header(
    collected_at: str, level: str | None, nodes: Sequence[str], burn_s: int | None = None
) -> dict[str, Any]:
    """bundle.json of a collection that has started (``complete`` false until it ends);
    ``burn_s``: the burn loop's duration (level burn)."""
    return {
        "gpuctl": __version__,
        "collected_at": collected_at,
        "level": level,
        "nodes": list(nodes),
        "complete": False,
        **({"burn_s": burn_s} if burn_s is not None else {}),
    }


def write_header(out: Path, header: Mapping[str, Any]) -> None:
    write_atomic(out / BUNDLE_FILE, json_bytes(header))


def write_results(out: Path, report: ValidationReport) -> None:
    """results.json: the judged report (`gpuctl report` reads it)."""
    write_atomic(out / RESULTS_FILE, report.dumps().encode("utf-8"))


def tail(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")[-STDERR_TAIL:]


def said(stderr: bytes, limit: int = 200) -> str:
    """What a tool said on stderr, on one line."""
    lines = [ln.strip() for ln in tail(stderr).splitlines() if ln.strip()]
    return "; ".join(lines)[-limit:]


def probe_meta(result: ExecResult, argv: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """What meta.json says about one probe (suite.py reads rc, timed_out and error)."""
    error = result.error
    if error is None and result.timed_out:
        error = f"timed out after {timeout_s:g} s"
    if error is None and result.rc == NOT_FOUND_RC:
        error = f"{argv[0]}: command not found (exit 127)"
    elif error is None and result.rc == CANNOT_RUN_RC:
        error = f"{argv[0]}: cannot be run (exit 126)"
    elif error is None and result.rc not in (0, None) and not result.stdout.strip():
        # nothing to judge: say why, from what the tool said on stderr (one line, control
        # characters escaped, at most 200 characters: its last ones, where tools say why)
        full = said(result.stderr, limit=STDERR_TAIL)
        line = printable(full if len(full) <= STDERR_SHOWN else "..." + full[3 - STDERR_SHOWN :])
        error = (
            f"{argv[0]} exited with {result.rc}, nothing on stdout; stderr: {line}"
            if line
            else f"{argv[0]} exited with {result.rc} and printed nothing"
        )
    return {
        "rc": result.rc,
        "timed_out": result.timed_out,
        "error": error,
        "command": shlex.join(argv),
        "timeout_s": timeout_s,
        "seconds": round(result.seconds, 3),
        "stderr": tail(result.stderr),
    }


@dataclass
class NodeFolder:
    """One node's folder of a bundle being written: each probe's output (``<kind>.txt``) and
    how it ended (``meta.json``), or why the node could not be reached."""

    folder: Path
    unreachable: str | None = None
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(
        self, kind: str, result: ExecResult, argv: Sequence[str], timeout_s: float, **extra: Any
    ) -> None:
        """Store one probe's output (``<kind>.txt``, atomically) and its outcome. A kind that
        is not a file name of the folder (a path, a leading dot) is a bug: refused, nothing
        written."""
        if not _KIND.fullmatch(kind):
            raise ValueError(f"not a probe kind: {kind[:80]!r}")
        if result.stdout or result.error is None:
            write_atomic(self.folder / f"{kind}.txt", result.stdout)
        else:
            with contextlib.suppress(FileNotFoundError):
                (self.folder / f"{kind}.txt").unlink()
        with self.lock:
            self.probes[kind] = {**probe_meta(result, argv, timeout_s), **extra}

    def run_recorded(
        self,
        kind: str,
        argv: Sequence[str],
        timeout_s: float,
        run: Callable[[Sequence[str], float], ExecResult],
    ) -> ExecResult:
        """Run ``argv`` through ``run`` and record it as ``kind`` with its times; a transport
        bug is recorded as the command's error, never lost with the node's other outputs."""
        sent = time.time()
        try:
            result = run(argv, timeout_s)
        except Exception as exc:
            result = ExecResult(error=f"could not run: {exc or type(exc).__name__}")
        self.record(kind, result, argv, timeout_s, **sent_received(sent))
        return result

    def write_meta(self) -> None:
        with self.lock:
            if self.unreachable is not None:
                meta: dict[str, Any] = {"unreachable": self.unreachable}
            else:
                meta = {"probes": dict(sorted(self.probes.items()))}
        write_atomic(self.folder / META_FILE, json_bytes(meta))


@dataclass(frozen=True, slots=True)
class PairRun:
    """One ib_write_bw pair: every HCA from ``client`` to ``server``."""

    fabric: str
    server: str
    client: str
    passed: bool
    retest: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "fabric": self.fabric,
            "server": self.server,
            "client": self.client,
            "passed": self.passed,
            "retest": self.retest,
        }


# ------------------------------------------------------------------------------------------
# Reading a bundle: never through a link, never more than so many bytes


class BundleFileError(Exception):
    """A file of a bundle that is not read or not understood; the message says why."""


def read_bundle_file(
    root: Path, rel: str | Path, limit: int, *, folder: int | None = None
) -> bytes | None:
    """The bytes of the regular file ``root/rel`` (None when absent); BundleFileError for a
    link, something that is not a regular file, a path out of ``root`` or more than ``limit``
    bytes. ``folder``: ``rel``'s folder opened (:func:`gpuctl.fileio.open_folder`) by a reader
    of many files in it; the file is then opened there by name."""
    try:
        if folder is None:
            data = read_inside(root, rel, limit=limit + 1)
        else:
            name = rel.rsplit("/", 1)[-1] if isinstance(rel, str) else rel.name
            data = read_in_folder(folder, name, limit=limit + 1, shown=str(rel))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except UnsafePath as exc:
        raise BundleFileError(f"{exc}: not read") from None
    except OSError as exc:
        raise BundleFileError(f"{rel}: cannot be read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise BundleFileError(f"{rel}: larger than {limit // _MIB} MiB: not read")
    return data


def read_bundle_json(
    root: Path, rel: str | Path, limit: int = META_LIMIT, *, folder: int | None = None
) -> Any:
    """The JSON value of ``root/rel``; FileNotFoundError when absent, BundleFileError when it
    cannot be read or is not JSON (not UTF-8, nested too deep, ...). ``folder``: as for
    :func:`read_bundle_file`."""
    data = read_bundle_file(root, rel, limit, folder=folder)
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


def sent_received(sent: float) -> dict[str, float]:
    """meta.json's times of one probe: gpuctl's clock when it sent the command (``sent``) and
    now, when its end came back (UTC seconds, microseconds)."""
    return {"sent_at": round(sent, 6), "received_at": round(time.time(), 6)}


# a probe's times are believed only in this range: after 2020, at most a day between them
_EPOCH_MIN, _RAN_MAX_S = 1_577_836_800.0, 86_400.0


def _probe_times(info: Any) -> tuple[float, float] | None:
    """(sent, received) of one meta.json probe record; None when absent or not believable
    (not numbers, before 2020, received before sent, or more than a day apart)."""
    if not isinstance(info, dict):
        return None
    sent, received = info.get("sent_at"), info.get("received_at")
    if isinstance(sent, bool) or isinstance(received, bool):
        return None
    if not isinstance(sent, int | float) or not isinstance(received, int | float):
        return None
    a, b = float(sent), float(received)
    if not (math.isfinite(a) and math.isfinite(b)) or a < _EPOCH_MIN:
        return None
    return (a, b) if 0 <= b - a <= _RAN_MAX_S else None


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


def read_node_meta(
    root: Path, name: str, *, folder: int | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """``root/name/meta.json`` as an object, or why it cannot be used (``folder``: ``root/name``
    opened, as for :func:`read_bundle_file`)."""
    rel = f"{name}/{META_FILE}"
    try:
        meta = read_bundle_json(root, rel, folder=folder)
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
    # every file is opened in the folder by name: one open per file, no walk from the root
    try:
        fd = open_folder(folder)
    except UnsafePath:
        return NodeBundle(node, problem=f"{name}: a symlink (never followed in a bundle): not read")
    except OSError as exc:
        return NodeBundle(node, problem=f"{name}: cannot be read: {exc.strerror or exc}")
    try:
        return _load_open_folder(node, root, name, fd)
    finally:
        os.close(fd)


def _load_open_folder(node: str, root: Path, name: str, fd: int) -> NodeBundle:
    meta, problem = read_node_meta(root, name, folder=fd)
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
        files = {e.name[:-4] for e in os.scandir(fd) if e.name.endswith(".txt")}
    except OSError as exc:
        return NodeBundle(node, problem=f"{name}: cannot be listed: {exc.strerror or exc}")
    outputs: dict[str, ProbeOutput] = {}
    per_hca: dict[str, ProbeOutput] = {}
    for kind in sorted(k for k in files | set(probes) if _KIND.fullmatch(k)):
        hca = kind.removeprefix("perftest-") if kind.startswith("perftest-") else None
        rc, timed_out, error = _probe_record(kind, probes.get(kind, {}))
        text: str | None = None
        try:
            data = read_bundle_file(root, f"{name}/{kind}.txt", OUTPUT_LIMIT, folder=fd)
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
            ran=_probe_times(probes.get(kind)),
        )
        if hca:
            per_hca[hca] = out
        else:
            outputs[kind] = out
    return NodeBundle(node, outputs, per_hca)


def load_bundle(directory: Path, node_names: list[str]) -> dict[str, NodeBundle]:
    return {n: load_node_bundle(n, directory / n) for n in node_names}


def read_bundle_header(bundle: Path) -> dict[str, Any]:
    """bundle.json of a bundle written by `gpuctl validate` ({} for a hand-made bundle).

    Read like every file of a bundle (never through a link, bounded); one that cannot be read
    or is not a JSON object makes the whole bundle unreadable (UsageError, one line)."""
    try:
        data = read_bundle_json(bundle, BUNDLE_FILE)
    except FileNotFoundError:
        return {}
    except BundleFileError as exc:
        raise UsageError(f"--bundle {bundle}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--bundle {bundle}: {BUNDLE_FILE}: not a JSON object")
    return data


def header_level(bundle: Path, header: Mapping[str, Any]) -> str | None:
    level = header.get("level")
    if level is None:
        return None
    if not isinstance(level, str) or level not in LEVELS:
        raise UsageError(
            f"--bundle {bundle}: {BUNDLE_FILE}: level {short(level, 40)} is not one of "
            f"{', '.join(LEVELS)}"
        )
    return level


def header_burn(header: Mapping[str, Any]) -> int | None:
    """The burn loop's duration bundle.json records (seconds), None where it records none or
    not a whole number of seconds (the burn judges then say so)."""
    value = header.get("burn_s")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def bundle_folders(bundle: Path) -> list[str]:
    """The names of what looks like node folders in ``bundle`` (links included, never
    followed): everything but files, ``_multinode`` and dot names."""
    try:
        entries = list(os.scandir(bundle))
    except OSError as exc:
        raise UsageError(f"--bundle {bundle}: cannot be listed: {exc.strerror or exc}") from None
    return sorted(
        e.name
        for e in entries
        if (e.is_dir(follow_symlinks=False) or e.is_symlink())
        and e.name != MULTINODE_DIR
        and not e.name.startswith(".")
    )


def header_pairs(header: Mapping[str, Any]) -> tuple[PairRun, ...]:
    recorded = header.get("pairs")
    if not isinstance(recorded, list):
        return ()
    return tuple(
        PairRun(
            short(p.get("fabric"), 100),
            short(p.get("server"), 100),
            short(p.get("client"), 100),
            p.get("passed") is True,
            p.get("retest") is True,
        )
        for p in recorded
        if isinstance(p, dict)
    )


def unreachable_in(bundle: Path, nodes: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(node, why) for each of ``nodes`` the bundle lacks or says could not be reached."""
    for node in nodes:
        try:
            os.lstat(bundle / node)
        except (FileNotFoundError, NotADirectoryError):
            yield node, MISSING
            continue
        except OSError:
            continue
        data, _ = read_node_meta(bundle, node)
        if data is not None and data.get("unreachable"):
            yield node, short(data["unreachable"], 500)


def check_bundle_dir(bundle: Path) -> None:
    if not bundle.is_dir():
        raise UsageError(f"--bundle {bundle}: not a directory")
