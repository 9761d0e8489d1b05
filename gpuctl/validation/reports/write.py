"""Writing a report's files: each format rendered and written atomically, side by side for a
large report.

A 1,024-node report holds ~140,000 checks; rendering its four formats (results.json, HTML,
JUnit XML, the Prometheus textfile) one after the other takes seconds on two cores. With
``jobs`` > 1 and a report of at least :data:`PARALLEL_MIN_CHECKS` checks, each format is
rendered and written in a forked worker process: the workers inherit the report (it is never
pickled), and each writes its own file with :func:`gpuctl.fileio.write_atomic`.
"""

from __future__ import annotations

import gc
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from gpuctl.fileio import write_atomic
from gpuctl.validation.reports.html import render_html
from gpuctl.validation.reports.junit import render_junit
from gpuctl.validation.reports.prom import render_prometheus
from gpuctl.validation.results import ValidationReport

# Below this many checks the formats are written here, one after the other: forking costs
# more than it saves.
PARALLEL_MIN_CHECKS = 20_000


def _json(report: ValidationReport) -> str:
    return report.dumps()


# Each format's renderer, the slowest first (the order work is handed out in).
RENDERERS: dict[str, Callable[[ValidationReport], str]] = {
    "json": _json,
    "junit": render_junit,
    "html": render_html,
    "prom": render_prometheus,
}

# The report the forked workers render (set only while a pool of them exists).
_SHARED: list[ValidationReport] = []


def _write_one(fmt: str, path: Path) -> Path:
    write_atomic(path, RENDERERS[fmt](_SHARED[0]).encode("utf-8"))
    return path


def write_reports(
    report: ValidationReport, files: Sequence[tuple[str, Path]], *, jobs: int = 1
) -> tuple[Path, ...]:
    """Write ``report`` as each (format, path) of ``files`` (formats: :data:`RENDERERS`);
    the paths written, in the order given. The first file that cannot be written raises its
    OSError (the files written before it stay). A worker that dies leaves nothing half
    written (each file is replaced whole): every file is then written here, one by one."""
    unknown = [fmt for fmt, _ in files if fmt not in RENDERERS]
    if unknown:
        raise ValueError(f"no report format {', '.join(unknown)}")  # a bug in the caller
    checks = sum(len(node.checks) for node in report.nodes)
    _SHARED[:] = [report]
    try:
        if jobs >= 2 and len(files) >= 2 and checks >= PARALLEL_MIN_CHECKS:
            try:
                return _side_by_side(files, jobs)
            except BrokenProcessPool:
                pass  # a worker died (killed, out of memory): every file is written again here
        return tuple(_write_one(fmt, path) for fmt, path in files)
    finally:
        _SHARED.clear()


def _side_by_side(files: Sequence[tuple[str, Path]], jobs: int) -> tuple[Path, ...]:
    order = sorted(range(len(files)), key=lambda i: list(RENDERERS).index(files[i][0]))
    # the workers must not copy the report's pages to run their collector over objects
    # that were made before the fork
    gc.freeze()
    try:
        context = multiprocessing.get_context("fork")
        workers = min(jobs, len(files))
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {i: pool.submit(_write_one, *files[i]) for i in order}
            return tuple(futures[i].result() for i in range(len(files)))
    finally:
        gc.unfreeze()
