"""ib_write_lat between the nodes of a pair (``ib.write_lat``): the 99th percentile of a
2-byte RDMA write's one-way latency against ``ib_write_lat_p99_us``.

The collector runs ib_write_lat right after each HCA's ib_write_bw of a pair, on the same two
adapters, where a node group has ``ib_write_lat_p99_us`` (default 4.2 us, Imbue's
cluster-health; data/health.yml); both sides print the table and each side's output is its
own node's ``perftest.lat.<hca>.txt``. Per HCA: OK at or below the limit, FAIL above it;
UNKNOWN where the run is missing, failed, is no ib_write_lat output or printed no 99th
percentile (perftest before its percentile columns). Which side of a failed pair is to blame
is decided as for ib_write_bw (:mod:`gpuctl.validation.judges.blame`).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import (
    Evidence,
    ProbeOutput,
    finding,
    node_judge,
    usable_parse,
    with_subject,
)
from gpuctl.validation.plausible import finite, show_number
from gpuctl.validation.probes import LAT_PREFIX, wants_ib_write_lat
from gpuctl.validation.results import CheckResult, Verdict

CHECK = "ib.write_lat"
TITLE = "RDMA_Write Latency Test"


def judge_ib_write_lat(
    exp: NodeExpectation, per_hca: Mapping[str, ProbeOutput]
) -> list[CheckResult]:
    """``per_hca``: HCA -> this node's side of its ib_write_lat run; nothing where no
    ``ib_write_lat_p99_us`` is set for the node's group."""
    limit = finite(exp.thresholds.get("ib_write_lat_p99_us"))
    if limit is None:
        return []
    out: list[CheckResult] = []
    for nic in exp.nics:
        subject = nic.name
        probe = per_hca.get(subject)
        if probe is None:
            out.append(finding(exp, CHECK, Verdict.UNKNOWN, "not measured", subject=subject))
            continue
        result, unknown = usable_parse(exp, {"perftest": probe}, ["perftest"], CHECK)
        if result is None:
            out += [with_subject(u, subject) for u in unknown]
            continue
        data = result.data
        rows = [r for r in data.get("rows") or () if "p99" in r]
        if data.get("test") != TITLE or not rows:
            what = data.get("test") or "no test title"
            message = f"no ib_write_lat result row ({what})"
            out.append(finding(exp, CHECK, Verdict.UNKNOWN, message, subject=subject))
            continue
        row = min(rows, key=lambda r: finite(r.get("bytes")) or 0.0)  # perftest's 2 bytes
        p99 = finite(row.get("p99"))
        if p99 is None:
            message = "ib_write_lat printed no 99% percentile (a perftest without it)"
            out.append(finding(exp, CHECK, Verdict.UNKNOWN, message, subject=subject))
            continue
        if p99 <= 0:
            message = f"99th percentile {p99:g} us: no write takes no time"
            out.append(finding(exp, CHECK, Verdict.FAIL, message, subject=subject))
            continue
        ok = p99 <= limit
        size = show_number(row.get("bytes"))
        out.append(
            finding(
                exp,
                CHECK,
                Verdict.OK if ok else Verdict.FAIL,
                f"99th percentile {p99:g} us " + ("<=" if ok else ">") + f" {limit:g} us "
                f"({size} B writes)",
                subject=subject,
                measured=p99,
                expected=limit,
                unit="us",
                source=exp.sources.get("ib_write_lat_p99_us"),
            )
        )
        out += [with_subject(u, subject) for u in unknown]
    return out


@node_judge(LAT_PREFIX, applies=wants_ib_write_lat)  # per HCA: perftest.lat.<hca>
def judge_ib_write_lat_pairs(exp: NodeExpectation, evidence: Evidence) -> list[CheckResult]:
    """ib_write_lat between nodes, unless the node is judged alone (`gpuctl node-check`)."""
    if not evidence.pairs:
        return []
    per_hca = {
        kind[len(LAT_PREFIX) :]: out
        for kind, out in evidence.outputs.items()
        if kind.startswith(LAT_PREFIX)
    }
    return judge_ib_write_lat(exp, per_hca)
