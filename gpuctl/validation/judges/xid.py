"""The kernel log: Xid events in the window (data/xid.yml), GPUs fallen off the bus. An Xid in
the node's effective ``xid_fatal`` fails the node; any other is a warning (monitor)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache

from gpuctl.config.catalog import default_fatal_xids
from gpuctl.resources import load_data
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import (
    Evidence,
    Outputs,
    finding,
    node_judge,
    record,
    usable_parse,
)
from gpuctl.validation.parsers.kernel import XidEvent, kernel_log_of
from gpuctl.validation.results import CheckResult, Verdict


def xid_window_hours() -> float:
    """How far back an Xid still counts (data/xid.yml `window_hours`)."""
    return float(load_data("xid.yml")["window_hours"])


@cache
def xid_actions() -> dict[int, str]:
    data = load_data("xid.yml")
    return {int(x): action for action, xids in data["actions"].items() for x in xids}


def fatal_xids(exp: NodeExpectation) -> tuple[frozenset[int], str]:
    """The Xids that fail the node, and where the list comes from: the node's effective
    ``xid_fatal`` (set in cluster.yml it replaces the default; unset it is every Xid of
    data/xid.yml whose action is not ``monitor``, gpuctl/config/derived.py). An expectation
    built without thresholds falls back to that ladder."""
    listed = exp.thresholds.get("xid_fatal")
    if listed is None:
        return frozenset(default_fatal_xids()), "data/xid.yml"
    return frozenset(int(x) for x in listed), exp.sources.get("xid_fatal") or "xid_fatal"


def _event_time(stamp: str | None) -> datetime | None:
    """ISO (`dmesg --time-format iso`) or ctime (`dmesg -T`) timestamps; None for others."""
    if stamp is None:
        return None
    try:
        when = datetime.fromisoformat(stamp.replace(",", "."))
    except ValueError:
        try:
            when = datetime.strptime(stamp, "%a %b %d %H:%M:%S %Y")
        except ValueError:
            return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def window_start(now: datetime | None) -> datetime | None:
    """Where the window (data/xid.yml) that ends at ``now`` starts; None (``now`` None): the
    whole log counts."""
    return None if now is None else now - timedelta(hours=xid_window_hours())


def in_window(stamp: str | None, since: datetime | None) -> bool:
    """Whether a kernel log line printed at ``stamp`` counts: from ``since`` on, or at a time
    that cannot be read (a log the collector bounded to the window is judged whole)."""
    when = _event_time(stamp)
    return since is None or when is None or when >= since


def judge_xid(
    exp: NodeExpectation, outputs: Outputs, now: datetime | None = None
) -> list[CheckResult]:
    """Xid events in the window (data/xid.yml) that ends at ``now`` (None: the whole log).
    Events whose time cannot be read count: a log the collector bounded to the window
    (journalctl --since) is judged whole."""
    result, unknown = usable_parse(exp, outputs, ["xid"], "xid")
    if result is None:
        return unknown
    log = record(result, kernel_log_of)
    out = list(unknown)
    actions = xid_actions()
    default = str(load_data("xid.yml")["default_action"])
    since = window_start(now)
    events = [e for e in log.events if in_window(e.timestamp, since)]
    for fallen in log.fallen_off_bus:
        out.append(
            finding(
                exp,
                "xid.fallen_off_bus",
                Verdict.FAIL,
                f"GPU {fallen.pci} has fallen off the bus: reboot",
                subject=fallen.pci,
                measured=79,
            )
        )
    seen: dict[tuple[str | None, int], list[XidEvent]] = {}
    for ev in events:
        if ev.xid is not None:
            seen.setdefault((ev.pci, ev.xid), []).append(ev)
    fatal, source = fatal_xids(exp)
    for (pci, xid), evs in sorted(seen.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        action = actions.get(xid, default)
        if xid in fatal:
            verdict = Verdict.FAIL
            what = action if action != "monitor" else "fatal (xid_fatal): take the node out"
        else:
            verdict = Verdict.WARN
            what = "monitor" + (
                "" if action == "monitor" else f" (left out of xid_fatal; data/xid.yml: {action})"
            )
        out.append(
            finding(
                exp,
                "xid",
                verdict,
                f"Xid {xid} x{len(evs)}: {what}",
                subject=str(pci),
                measured=xid,
                source=source,
                evidence=tuple(str(e.message)[:200] for e in evs[:3]),
            )
        )
    if not out:
        out.append(finding(exp, "xid", Verdict.OK, "no Xid events in the window"))
    return out


@node_judge("xid")
def judge_xid_in_window(exp: NodeExpectation, evidence: Evidence) -> list[CheckResult]:
    """:func:`judge_xid` with the window ending at ``evidence.now``; over the whole log when no
    collection time can be trusted (``evidence.clock_problem``), and then never OK."""
    problem = evidence.clock_problem
    found = judge_xid(exp, evidence, None if problem else evidence.now)
    if problem is not None and found:
        found = _without_window(exp, found, problem)
    return found


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
