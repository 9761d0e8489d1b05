"""A provision run's record on disk that is not what gpuctl wrote is a clear error, never a
crash; a job event of the wrong shape is skipped (issue 14: state on disk read defensively)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuctl.errors import UsageError
from gpuctl.provision.logs import read_log
from gpuctl.provision.runs import RECORD, RunRecord, read_record, write_record


def _record() -> RunRecord:
    return RunRecord(
        run_id="20261201T000000Z",
        cluster="/srv/cluster.yml",
        started="2026-12-01T00:00:00Z",
        status="failed",
        pid=1,
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff\xfe",
        b"[" * 100_000 + b"]" * 100_000,
        b"[]",
        b"null",
        b'"run"',
        b'{"run_id": "x", "hosts": []}',
        b'{"run_id": "x", "hosts": {"gpu001": [1]}}',
    ],
)
def test_a_broken_run_record_is_a_usage_error(tmp_path: Path, raw: bytes) -> None:
    (tmp_path / RECORD).write_bytes(raw)
    with pytest.raises(UsageError, match="not a readable gpuctl run"):
        read_record(tmp_path)


def test_job_events_of_the_wrong_shape_are_skipped(tmp_path: Path) -> None:
    record = _record()
    write_record(tmp_path, record)
    events = tmp_path / "runner" / "artifacts" / record.run_id / "job_events"
    events.mkdir(parents=True)
    (events / "1-a.json").write_text("[1, 2]", encoding="utf-8")
    (events / "2-b.json").write_bytes(b"[" * 100_000)
    (events / "3-c.json").write_text(json.dumps({"event": "runner_on_ok"}), encoding="utf-8")
    log = read_log(tmp_path)
    assert log.record.run_id == record.run_id
    assert [r.status for r in log.results] == ["ok"]  # only the event of the right shape
