"""What happened in a run, read back from ansible-runner's artifacts (events, not stdout text)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuctl.fileio import decode_json
from gpuctl.provision.runs import RunRecord, read_record

_RESULT_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
}


@dataclass(frozen=True, slots=True)
class TaskResult:
    counter: int
    play: str
    task: str
    host: str
    status: str  # ok, changed, failed, unreachable, skipped, ignored
    message: str


@dataclass(frozen=True, slots=True)
class RunLog:
    run_dir: Path
    record: RunRecord
    results: tuple[TaskResult, ...]
    stdout: Path | None

    def for_host(self, host: str) -> tuple[TaskResult, ...]:
        return tuple(r for r in self.results if r.host == host)


def _message(res: dict[str, Any]) -> str:
    """The failure text Ansible reports (msg, then stderr), first lines only."""
    if res.get("censored"):
        return str(res["censored"])  # no_log: Ansible already replaced the result
    parts = [str(res.get(k) or "").strip() for k in ("msg", "stderr")]
    text = "\n".join(p for p in parts if p)
    lines = text.splitlines()
    return "\n".join(lines[:8]) + ("\n..." if len(lines) > 8 else "")


def read_log(run_dir: Path) -> RunLog:
    record = read_record(run_dir)
    artifacts = run_dir / "runner" / "artifacts" / record.run_id
    results: list[TaskResult] = []
    events_dir = artifacts / "job_events"
    for path in events_dir.glob("*.json") if events_dir.is_dir() else ():
        try:
            event = decode_json(path.read_bytes())
        except (OSError, ValueError):
            continue  # a run killed mid-write leaves a partial file; the rest still reads
        if not isinstance(event, dict):
            continue
        status = _RESULT_EVENTS.get(str(event.get("event")))
        if status is None:
            continue
        data = event.get("event_data") or {}
        res = data.get("res") or {}
        if status == "ok" and res.get("changed"):
            status = "changed"
        if status == "failed" and data.get("ignore_errors"):
            status = "ignored"
        results.append(
            TaskResult(
                counter=int(event.get("counter", 0)),
                play=str(data.get("play", "")),
                task=str(data.get("task", "")),
                host=str(data.get("host", "")),
                status=status,
                message=_message(res) if status in ("failed", "unreachable", "ignored") else "",
            )
        )
    results.sort(key=lambda r: r.counter)
    stdout = artifacts / "stdout"
    return RunLog(run_dir, record, tuple(results), stdout if stdout.is_file() else None)
