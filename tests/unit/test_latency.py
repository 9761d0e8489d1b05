"""ib_write_lat between the nodes of a pair (issue 18 point 2, ``ib_write_lat_p99_us``): run
right after each HCA's ib_write_bw on the same two adapters, both sides' tables kept, the 99th
percentile of the 2-byte writes judged against the limit (default 4.2 us, Imbue). A real
capture (tests/fixtures/perftest/ib-write-lat-dgx-spark-*), and what the lab's stand-in prints
in perftest's own row format (src/perftest_parameters.h REPORT_FMT_LAT)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ROOT, sim_node_env, standin_pair

from gpuctl.lab.sim import perf, profiles
from gpuctl.lab.sim.faults import FaultError, apply
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import ExpectedNic, NodeExpectation
from gpuctl.validation.judges.base import Evidence, ProbeOutput
from gpuctl.validation.judges.blame import Peer, assign_blame
from gpuctl.validation.judges.latency import judge_ib_write_lat, judge_ib_write_lat_pairs
from gpuctl.validation.parsing import parse
from gpuctl.validation.probes import (
    ib_write_lat_client,
    ib_write_lat_server,
    latency_kind,
    probes_for,
    wants_ib_write_lat,
)
from gpuctl.validation.results import CheckResult, Verdict

FIX = ROOT / "tests" / "fixtures" / "perftest"
REAL = capture_output(FIX / "ib-write-lat-dgx-spark-rocep1s0f1-rdma-cm-client-2B.txt")  # 1.57
BW = capture_output(FIX / "ib-write-bw-roce-100g-rdma-cm-cpu-freq-warning-client.txt")
NICS = (
    ExpectedNic("mlx5_0", "ib", "infiniband", 400),
    ExpectedNic("mlx5_1", "ib", "infiniband", 400),
)


def _exp(limit: float | None = 4.2, level: str = "standard") -> NodeExpectation:
    return NodeExpectation(
        node="gpu001",
        group="gpu",
        nics=NICS,
        level=level,
        thresholds={"ib_write_lat_p99_us": limit},
    )


def _out(text: str | None, rc: int | None = 0, error: str | None = None) -> ProbeOutput:
    return ProbeOutput("perftest", text, rc=rc, error=error)


def test_the_99th_percentile_is_judged_against_the_limit_both_ways() -> None:
    ok = judge_ib_write_lat(_exp(1.57), {"mlx5_0": _out(REAL), "mlx5_1": _out(REAL)})
    assert [(r.check, r.subject, r.verdict, r.measured) for r in ok] == [
        ("ib.write_lat", "mlx5_0", Verdict.OK, 1.57),
        ("ib.write_lat", "mlx5_1", Verdict.OK, 1.57),
    ]
    assert ok[0].message == "99th percentile 1.57 us <= 1.57 us (2 B writes)"
    slow = judge_ib_write_lat(_exp(1.56), {"mlx5_0": _out(REAL), "mlx5_1": _out(REAL)})
    assert [r.verdict for r in slow] == [Verdict.FAIL] * 2
    assert slow[0].message.startswith("99th percentile 1.57 us > 1.56 us")


def test_what_is_no_latency_measurement_is_unknown_never_a_pass() -> None:
    results = judge_ib_write_lat(
        _exp(), {"mlx5_0": _out(BW), "mlx5_1": _out(None, rc=None, error="not run: lost")}
    )
    assert [(r.subject, r.verdict) for r in results] == [
        ("mlx5_0", Verdict.UNKNOWN),
        ("mlx5_1", Verdict.UNKNOWN),
    ]
    assert results[0].message == "no ib_write_lat result row (RDMA_Write BW Test)"
    missing = judge_ib_write_lat(_exp(), {"mlx5_0": _out(REAL)})
    assert [(r.subject, r.message) for r in missing][1] == ("mlx5_1", "not measured")
    # no limit: no run, no result; node-check (a node alone): none either
    assert judge_ib_write_lat(_exp(None), {"mlx5_0": _out(REAL)}) == []
    alone = Evidence({latency_kind("mlx5_0"): _out(REAL)}, pairs=False)
    assert judge_ib_write_lat_pairs(_exp(), alone) == []


def test_the_pairs_run_it_only_where_a_limit_is_set_and_never_at_quick() -> None:
    assert wants_ib_write_lat(_exp())
    assert not wants_ib_write_lat(_exp(None))
    assert not wants_ib_write_lat(_exp(level="quick"))
    assert not any(p.kind.startswith("perftest.lat") for p in probes_for(_exp()))  # pairs only
    assert ib_write_lat_client("mlx5_0", 19539, "198.18.0.12", ("-x", "3")) == (
        "ib_write_lat", "-d", "mlx5_0", "-p", "19539", "-F", "-x", "3", "198.18.0.12"
    )  # fmt: skip
    assert ib_write_lat_server("mlx5_0", 19539) == (
        "ib_write_lat", "-d", "mlx5_0", "-p", "19539", "-F"
    )  # fmt: skip


def _failed(node: str, hca: str, p99: float, limit: float = 4.2) -> CheckResult:
    return CheckResult(
        "ib.write_lat", node, Verdict.FAIL, "slow", subject=hca, measured=p99, expected=limit
    )


def _passed(node: str, hca: str) -> CheckResult:
    return CheckResult(
        "ib.write_lat", node, Verdict.OK, "ok", subject=hca, measured=1.2, expected=4.2
    )


def test_a_slow_pair_is_charged_to_the_side_that_was_slow_with_another_node_too() -> None:
    """gpu001 and gpu002 slow together on mlx5_0; gpu002 passed with gpu003 on mlx5_1, gpu001
    with nobody: gpu001 keeps the FAIL, gpu002's becomes a WARN naming the suspect."""
    per_node = {
        "gpu001": [_failed("gpu001", "mlx5_0", 9.2)],
        "gpu002": [_failed("gpu002", "mlx5_0", 9.2), _passed("gpu002", "mlx5_1")],
        "gpu003": [_passed("gpu003", "mlx5_1")],
    }
    lat_peers = {
        "gpu001": {"mlx5_0": Peer("gpu002", "mlx5_0")},
        "gpu002": {"mlx5_0": Peer("gpu001", "mlx5_0"), "mlx5_1": Peer("gpu003", "mlx5_1")},
        "gpu003": {"mlx5_1": Peer("gpu002", "mlx5_1")},
    }
    assign_blame(per_node, {}, lat_peers)
    assert per_node["gpu001"][0].verdict is Verdict.FAIL
    assert per_node["gpu001"][0].message == "slow (with gpu002 mlx5_0)"
    assert per_node["gpu002"][0].verdict is Verdict.WARN
    assert "gpu001 is the suspect" in per_node["gpu002"][0].message


def test_the_standin_prints_perftests_latency_table_and_the_fault_slows_it() -> None:
    profile = profiles.load("hgx-h100-ndr")
    args = perf.PerftestArgs(server="198.18.0.11", device="mlx5_2", title="RDMA_Write Latency Test")
    healthy = parse("perftest", perf.ib_write_lat(profile, {}, "gpu001", args))
    assert healthy.recognised, healthy.problems
    assert healthy.data["test"] == "RDMA_Write Latency Test"
    assert healthy.data["rows"][0]["p99"] == pytest.approx(1.2)
    slow = perf.ib_write_lat(profile, apply({}, "ib_latency", "mlx5_2:5"), "gpu001", args)
    judged = judge_ib_write_lat(_exp(), {"mlx5_0": _out(slow)})[0]
    assert (judged.verdict, judged.measured) == (Verdict.FAIL, pytest.approx(6.2))
    # the other side of the pair adds its fault too (its state in the exchange)
    peer = {"lid": 9, "lat_extra_us": 5.0}
    remote = parse("perftest", perf.ib_write_lat(profile, {}, "gpu002", args, peer=peer))
    assert remote.data["rows"][0]["p99"] == pytest.approx(6.2)
    with pytest.raises(FaultError, match="ib_latency"):
        apply({}, "ib_latency", "mlx5_2:-1")


def test_ib_write_lat_server_and_client_both_print_the_slower_links_table(tmp_path: Path) -> None:
    server, client = standin_pair(
        "ib_write_lat",
        sim_node_env(tmp_path, "n1", "hgx-h100-ndr", "ib_latency=mlx5_1:3"),
        sim_node_env(tmp_path, "n2", "hgx-h100-ndr"),
        "-d",
        "mlx5_1",
        "-F",
    )
    out, err = server.stdout, server.stderr
    assert (server.returncode, client.returncode) == (0, 0), err + client.stderr
    srv, cli = parse("perftest", out).data, parse("perftest", client.stdout).data
    assert (srv["role"], cli["role"]) == ("server", "client")
    assert srv["rows"][0]["p99"] == cli["rows"][0]["p99"] == pytest.approx(4.2)


def test_an_all_sizes_run_is_judged_on_its_smallest_writes_and_a_server_side_counts() -> None:
    """ConnectX-3 QDR, -a: the 2-byte row (99th percentile 1.21 us), not the 8 MiB one; the
    Soft-RoCE server side (its own table after the banner) is judged as the client's is."""
    qdr = capture_output(FIX / "ib-write-lat-connectx3-qdr-all-sizes-client.txt")
    [r] = judge_ib_write_lat(_exp(1.21), {"mlx5_0": _out(qdr), "mlx5_1": _out(qdr)})[:1]
    assert (r.verdict, r.measured) == (Verdict.OK, 1.21)
    server = capture_output(FIX / "ib-write-lat-softroce-rxe0-64B-server-with-banner.txt")
    [s] = judge_ib_write_lat(_exp(), {"mlx5_0": _out(server), "mlx5_1": _out(server)})[:1]
    assert (s.verdict, s.measured) == (Verdict.FAIL, 177.55)
    assert s.message.startswith("99th percentile 177.55 us > 4.2 us (64 B writes)")
