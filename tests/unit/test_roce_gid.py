"""RoCE addressing of gpuctl's own RDMA traffic: the GID index and the traffic class.

perftest addresses a RoCE port by a GID index (``-x``; "ib_write_bw and ib_read_bw run into
error due to different gid index at both sides", linux-rdma/perftest#44, fixed by ``-x 3`` on
both) and sends with traffic class 0 unless ``--tclass`` is given ("Set the Traffic Class in GRH
(if GRH is in use)", perftest's usage text), so a bandwidth test that leaves both out measures
another GID (RoCE v1 link-local on mlx5's index 0) on a lossy class, not the path jobs use.
cluster.yml's ``fabrics[].gid_index`` goes to ib_write_bw's ``-x`` on both sides and to
NCCL_IB_GID_INDEX; the traffic class is the fabric's DSCP << 2, as NCCL_IB_TC. The judge holds
the run to the index it was asked for: perftest prints the one it used.
"""

from __future__ import annotations

import shlex

import pytest
from helpers import ROOT

from gpuctl.config import load_cluster, load_cluster_text
from gpuctl.errors import ConfigError
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import ExpectedNic, NodeExpectation, expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.infiniband import judge_ib_write_bw
from gpuctl.validation.probes import ib_write_bw_client, ib_write_bw_server, perftest_options
from gpuctl.validation.results import CheckResult, Verdict

INVENTORIES = ROOT / "inventories"
PERFTEST = ROOT / "tests" / "fixtures" / "perftest"


def _roce_nic(exps: dict[str, NodeExpectation]) -> ExpectedNic:
    return next(n for exp in exps.values() for n in exp.nics if n.kind == "roce")


def test_the_fabrics_gid_index_and_dscp_reach_both_sides_of_ib_write_bw() -> None:
    nic = _roce_nic(expectations(load_cluster(INVENTORIES / "a100-roce.yml")))
    assert (nic.gid_index, nic.traffic_class) == (3, 26 << 2)
    options = perftest_options(nic)
    assert options == ("-x", "3", "--tclass=104")
    assert shlex.join(ib_write_bw_server(nic.device, 18515, options)).endswith(
        "--report_gbits -x 3 --tclass=104"
    )
    assert shlex.join(ib_write_bw_client(nic.device, 18515, "10.0.0.2", options)).endswith(
        "--report_gbits -x 3 --tclass=104 10.0.0.2"
    )


def test_without_a_gid_index_perftest_picks_its_own_and_infiniband_gets_no_options() -> None:
    text = (INVENTORIES / "a100-roce.yml").read_text()
    text = text.replace("    gid_index: 3", "    # gid_index: 3")
    nic = _roce_nic(expectations(load_cluster_text(text, "c")))
    assert perftest_options(nic) == ("--tclass=104",)
    for exp in expectations(load_cluster(INVENTORIES / "hgx-h100-ndr.yml")).values():
        assert all(perftest_options(n) == () for n in exp.nics)


def test_a_gid_index_on_an_infiniband_fabric_is_refused() -> None:
    text = (INVENTORIES / "hgx-h100-ndr.yml").read_text()
    old = "    kind: infiniband\n"
    assert old in text
    with pytest.raises(ConfigError) as err:
        load_cluster_text(text.replace(old, old + "    gid_index: 3\n", 1), "c")
    assert "gid_index applies to RoCE fabrics only" in str(err.value)


@pytest.mark.parametrize("value", [-1, 256, "3; reboot"])
def test_a_gid_index_out_of_range_is_refused(value: object) -> None:
    text = (INVENTORIES / "a100-roce.yml").read_text()
    with pytest.raises(ConfigError) as err:
        load_cluster_text(text.replace("    gid_index: 3", f"    gid_index: {value!r}"), "c")
    assert "gid_index" in str(err.value)


def _judged(gid_index: int | None, fixture: str) -> list[CheckResult]:
    text = (INVENTORIES / "a100-roce.yml").read_text()
    if gid_index is None:
        text = text.replace("    gid_index: 3", "    # gid_index: 3")
    else:
        text = text.replace("    gid_index: 3", f"    gid_index: {gid_index}")
    exps = expectations(load_cluster_text(text, "c"))
    exp = next(e for e in exps.values() if any(n.kind == "roce" for n in e.nics))
    nic = next(n for n in exp.nics if n.kind == "roce")
    out = ProbeOutput("perftest", capture_output(PERFTEST / fixture), rc=0)
    return [r for r in judge_ib_write_bw(exp, {nic.device: out}) if r.subject == nic.device]


CLIENT = "ib-write-bw-use-cuda-t4-roce-rdma-cm-gbits-client.txt"  # GID index : 3


def test_a_run_on_another_gid_index_than_asked_is_not_judged() -> None:
    (result,) = _judged(5, CLIENT)
    assert result.verdict is Verdict.UNKNOWN
    assert "GID index 3" in result.message
    assert "gid_index 5" in result.message


def test_a_run_on_the_gid_index_asked_for_is_judged_on_its_bandwidth() -> None:
    for gid in (3, None):
        (result,) = _judged(gid, CLIENT)
        assert result.check == "ib.write_bw"
        assert "GID index" not in result.message
        assert result.measured == pytest.approx(10.42)


def test_a_run_whose_port_is_not_ethernet_has_no_gid_to_check() -> None:
    """DGX Spark's ConnectX-7 forced to IB link type: perftest prints no GID index there."""
    (result,) = _judged(3, "ib-write-bw-dgx-spark-rocep1s0f1-4qp-rdma-cm-gbits-client.txt")
    assert "GID index" not in result.message
    assert result.measured == pytest.approx(111.71)


def test_an_ethernet_run_that_prints_no_gid_index_is_not_judged() -> None:
    text = capture_output(PERFTEST / CLIENT).replace(" GID index       : 3\n", "")
    exps = expectations(load_cluster(INVENTORIES / "a100-roce.yml"))
    exp = next(e for e in exps.values() if any(n.kind == "roce" for n in e.nics))
    nic = next(n for n in exp.nics if n.kind == "roce")
    out = {nic.device: ProbeOutput("perftest", text, rc=0)}
    (result,) = [r for r in judge_ib_write_bw(exp, out) if r.subject == nic.device]
    assert result.verdict is Verdict.UNKNOWN
    assert "no GID index" in result.message
