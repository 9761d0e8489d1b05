"""Run directories of `gpuctl provision`: what a run was asked, how it ended, per host.

Layout under the state directory (``.gpuctl/`` beside cluster.yml unless configured)::

    runs/<run id>/run.json        this module's record, replaced atomically at start and end
    runs/<run id>/inventory/      gpuctl render's output and the known_hosts it checks against
    runs/<run id>/runner/         ansible-runner's private data dir; its artifacts/<run id>/ hold
                                  stdout, job_events/*.json, rc and status

A run that was killed keeps ``status: running`` with a process id that is gone; readers report
it as ``interrupted`` and ``--resume`` then re-runs every host that run targeted.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from gpuctl.errors import UsageError
from gpuctl.fileio import decode_json, process_alive, write_atomic

RECORD = "run.json"
HostState = Literal["ok", "changed", "failed", "unreachable", "incomplete"]
RunStatus = Literal["running", "successful", "failed", "canceled", "interrupted", "error"]

# hosts in these states are taken up again by --resume
RESUMABLE: frozenset[str] = frozenset({"failed", "unreachable", "incomplete"})


@dataclass(frozen=True, slots=True)
class HostOutcome:
    """One host's counts from ansible-runner's stats (the PLAY RECAP, as data)."""

    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0
    state: HostState = "incomplete"


@dataclass(slots=True)
class RunRecord:
    run_id: str
    cluster: str
    started: str
    status: RunStatus = "running"
    finished: str | None = None
    rc: int | None = None
    check: bool = False
    diff: bool = False
    limit: str | None = None
    tags: str | None = None
    resumed_from: str | None = None
    pid: int = field(default_factory=os.getpid)
    message: str = ""
    hosts: dict[str, HostOutcome] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["hosts"] = {h: asdict(o) for h, o in sorted(self.hosts.items())}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        hosts = {h: HostOutcome(**o) for h, o in (data.get("hosts") or {}).items()}
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "hosts"}
        return cls(**fields, hosts=hosts)

    def resumable_hosts(self) -> list[str]:
        return sorted(h for h, o in self.hosts.items() if o.state in RESUMABLE)


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_id(runs: Path) -> str:
    """A sortable, unique name: the UTC time, with a counter when two runs share a second."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    candidate, n = stamp, 1
    while (runs / candidate).exists():
        n += 1
        candidate = f"{stamp}-{n}"
    return candidate


def write_record(run_dir: Path, record: RunRecord) -> None:
    """Replace run.json atomically (a reader never sees half a file)."""
    write_atomic(run_dir / RECORD, json.dumps(record.to_json(), indent=2) + "\n", mode=0o600)


def read_record(run_dir: Path) -> RunRecord:
    try:
        data = decode_json((run_dir / RECORD).read_bytes())
        if not isinstance(data, dict):
            raise ValueError(f"{RECORD} is not an object")
        record = RunRecord.from_json(data)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise UsageError(f"{run_dir}: not a readable gpuctl run ({exc})") from None
    if record.status == "running" and not process_alive(record.pid):
        record.status = "interrupted"
        record.message = record.message or "the run was killed before it finished"
    return record


def run_dirs(state_dir: Path) -> list[Path]:
    """Run directories, oldest first."""
    runs = state_dir / "runs"
    if not runs.is_dir():
        return []
    return sorted(p for p in runs.iterdir() if (p / RECORD).is_file())


def find_run(state_dir: Path, run: str | None) -> Path:
    """The named run (a run id or a unique prefix of one), or the latest."""
    dirs = run_dirs(state_dir)
    if not dirs:
        raise UsageError(f"no gpuctl runs under {state_dir / 'runs'}")
    if run is None:
        return dirs[-1]
    matches = [d for d in dirs if d.name == run] or [d for d in dirs if d.name.startswith(run)]
    if len(matches) != 1:
        names = ", ".join(d.name for d in dirs[-5:])
        what = "no run" if not matches else f"{len(matches)} runs"
        raise UsageError(f"{what} matching {run!r} (latest: {names})")
    return matches[0]
