"""What gpuctl knows about each node's last validation: ``validated.json`` in the state dir
(``.gpuctl/`` beside cluster.yml, or ``--state-dir`` / ``$GPUCTL_STATE_DIR``).

`gpuctl validate` (and a rollout's validation of each node) writes, per node it judged, whether
it passed, when, at which level and into which bundle. `validate --limit` reads it to choose
ib_write_bw partners outside the limit: a node whose last validation failed is never one
(:func:`gpuctl.validation.pairs.partner_refusal`). One JSON object, replaced atomically; runs
in one process are serialised, two gpuctl processes writing at once keep the last writer's
records for the nodes both judged.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuctl.fileio import decode_json, read_regular, write_atomic
from gpuctl.validation.results import ValidationReport

HISTORY_FILE = "validated.json"
HISTORY_LIMIT = 8 * 1024 * 1024
_LOCK = threading.Lock()


def history_path(state_dir: Path) -> Path:
    return state_dir / HISTORY_FILE


def _records(path: Path) -> dict[str, Any]:
    try:
        data = decode_json(read_regular(path, limit=HISTORY_LIMIT))
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("nodes", {}), dict):
        raise ValueError("not a gpuctl validation history (no 'nodes' object)")
    nodes: dict[str, Any] = data.get("nodes", {})
    return nodes


def read_history(path: Path) -> tuple[dict[str, bool], str | None]:
    """Node -> whether its last validation passed; or ({}, why) when the file cannot be used
    (then no node outside the limit can be trusted as a partner)."""
    try:
        nodes = _records(path)
    except (OSError, ValueError) as exc:
        return {}, f"{path}: {exc}"
    passed: dict[str, bool] = {}
    for node, record in nodes.items():
        ok = record.get("passed") if isinstance(record, dict) else None
        passed[str(node)] = ok is True  # anything but true is not a pass
    return passed, None


def record_history(
    path: Path, report: ValidationReport, *, level: str | None, at: str | None, bundle: Path
) -> None:
    """Record each node of ``report``: passed or not, when, at which level, which bundle. A
    history that cannot be read is replaced (what it said cannot be trusted anyway)."""
    update: Mapping[str, dict[str, Any]] = {
        n.node: {
            "passed": not n.failed,
            "at": at,
            "level": level,
            "bundle": str(bundle),
        }
        for n in report.nodes
    }
    with _LOCK:
        try:
            nodes = _records(path)
        except (OSError, ValueError):
            nodes = {}
        nodes.update(update)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"nodes": dict(sorted(nodes.items()))}, indent=2, sort_keys=True)
        write_atomic(path, (text + "\n").encode("utf-8"))
