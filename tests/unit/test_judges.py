"""Judges on real tool outputs (tests/fixtures): the verdicts an operator would give by hand."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers import ROOT

from gpuctl.config import load_cluster
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import ExpectedNic, NodeExpectation, expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.fabric_manager import judge_fabric_manager
from gpuctl.validation.judges.fleet import judge_fleet_relative
from gpuctl.validation.judges.infiniband import judge_ib_write_bw
from gpuctl.validation.judges.nccl import judge_nccl
from gpuctl.validation.judges.topology import judge_topology
from gpuctl.validation.judges.xid import judge_xid
from gpuctl.validation.results import CheckResult, Verdict

FIX = ROOT / "tests" / "fixtures"


def body(rel: str) -> str:
    return capture_output(FIX / rel)


def out(kind: str, rel: str, **kw: object) -> dict[str, ProbeOutput]:
    return {kind: ProbeOutput(kind, body(rel), **kw)}  # type: ignore[arg-type]


def h100() -> NodeExpectation:
    """gpu001 of the HGX H100 example, as cluster.yml describes it."""
    return expectations(load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml"))["gpu001"]


def a100() -> NodeExpectation:
    return expectations(load_cluster(ROOT / "inventories" / "a100-roce.yml"))["gpu001"]


def verdicts(results: list[CheckResult], check: str) -> list[Verdict]:
    return [r.verdict for r in results if r.check == check]


def test_expectations_from_cluster_yml() -> None:
    exp = h100()
    assert (exp.gpu_count, exp.nvlink_token, exp.fabric_manager) == (8, "NV18", True)
    assert exp.product_name == "NVIDIA H100 80GB HBM3"
    assert [n.device for n in exp.nics] == [f"mlx5_{i}" for i in range(8)]
    assert exp.thresholds["nccl_all_reduce_busbw_gbs"] == 470  # the group's override
    assert exp.thresholds["ib_write_bw_gbps"] == 375


def test_h100_topology_with_nv18_everywhere_passes() -> None:
    res = judge_topology(
        h100(), out("topo", "topo/nvsmi-topo-m-h100-8gpu-6nic-blank-cpuaffinity.txt")
    )
    assert verdicts(res, "topology.nvlink") == [Verdict.OK]
    assert verdicts(res, "topology.gpus") == []


def test_a100_nv12_matrix_fails_an_nv18_expectation_on_every_pair() -> None:
    res = judge_topology(
        h100(), out("topo", "topo/nvsmi-topo-m-a100-40gb-8gpu-azure-ndv4-blank-nic-names-ansi.txt")
    )
    bad = [r for r in res if r.check == "topology.nvlink"]
    assert len(bad) == 28  # 8 GPUs: 28 unordered pairs, each NV12 < NV18
    assert all(r.verdict is Verdict.FAIL and r.measured == "NV12" for r in bad)
    assert bad[0].subject == "GPU0-GPU1"


def test_a100_nv12_matrix_passes_its_own_expectation() -> None:
    exp = dataclasses.replace(a100(), nics=())
    res = judge_topology(
        exp, out("topo", "topo/nvsmi-topo-m-a100-40gb-8gpu-azure-ndv4-blank-nic-names-ansi.txt")
    )
    assert verdicts(res, "topology.nvlink") == [Verdict.OK]


def test_nccl_busbw_against_the_model_threshold() -> None:
    rel = "nccl-tests/all-reduce-perf-a100-sxm4-40gb-8gpu-with-nccl-info-line.txt"
    ok = judge_nccl(a100(), out("nccl", rel))
    [busbw] = [r for r in ok if r.check == "nccl.busbw"]
    assert busbw.verdict is Verdict.OK
    assert busbw.expected == 228
    assert busbw.measured > 228
    slow = judge_nccl(h100(), out("nccl", rel))
    assert verdicts(slow, "nccl.busbw") == [Verdict.FAIL]


def test_nccl_wrong_results_fail_whatever_the_bandwidth() -> None:
    rel = "nccl-tests/all-reduce-perf-gh200-4node-16rank-nccl-tests2.17.9-wrong-nonzero.txt"
    res = judge_nccl(h100(), out("nccl", rel))
    assert Verdict.FAIL in verdicts(res, "nccl.wrong")


@pytest.mark.parametrize(
    "rel",
    [
        "nccl-tests/openmpi-not-enough-slots-all-reduce-perf.txt",
        "nccl-tests/test-nccl-failure-unhandled-cuda-error-2lines-rtx4090.txt",
    ],
)
def test_nccl_launch_failures_are_never_a_pass(rel: str) -> None:
    res = judge_nccl(h100(), out("nccl", rel))
    assert res
    assert all(r.verdict in (Verdict.FAIL, Verdict.UNKNOWN) for r in res)


def test_probe_that_timed_out_or_did_not_run_is_unknown() -> None:
    exp = h100()
    rel = "nccl-tests/all-reduce-perf-a100-sxm4-40gb-8gpu-with-nccl-info-line.txt"
    res = judge_nccl(exp, out("nccl", rel, timed_out=True))
    assert [(r.check, r.verdict) for r in res] == [("nccl.busbw", Verdict.UNKNOWN)]
    assert "timed out" in res[0].message
    assert judge_nccl(exp, {})[0].verdict is Verdict.UNKNOWN
    res = judge_nccl(exp, {"nccl": ProbeOutput("nccl", None, error="ssh: unreachable")})
    assert res[0].verdict is Verdict.UNKNOWN
    res = judge_nccl(exp, out("nccl", rel, rc=1))
    assert Verdict.UNKNOWN in verdicts(res, "nccl.busbw")  # an error exit is never a clean pass


def test_xid_ladder_from_data() -> None:
    res = judge_xid(h100(), out("xid", "kernel-xid/dmesg-iso-xid-48-63-94-dbe-row-remap.txt"))
    by_xid = {r.measured: r for r in res if r.check == "xid"}
    assert by_xid[48].verdict is Verdict.FAIL  # double-bit ECC: reset
    assert by_xid[63].verdict is Verdict.FAIL  # row remapping event (Azure list)
    assert by_xid[94].verdict is Verdict.WARN  # contained error: monitor
    assert "x9" in by_xid[94].message


def test_fallen_off_the_bus_fails() -> None:
    res = judge_xid(h100(), out("xid", "kernel-xid/xid-79-fallen-off-bus-single-line.txt"))
    assert verdicts(res, "xid.fallen_off_bus") == [Verdict.FAIL]
    assert verdicts(res, "xid") == [Verdict.FAIL]


def test_fabric_manager_running_and_failed() -> None:
    rel = "fabric-manager/systemctl-status-fabricmanager-active-running-h100-rhel-ai.txt"
    assert verdicts(
        judge_fabric_manager(h100(), out("fabricmanager", rel)), "fabricmanager.active"
    ) == [Verdict.OK]
    rel = "fabric-manager/systemctl-restart-fabricmanager-failed-plus-journal-h20.txt"
    res = judge_fabric_manager(h100(), out("fabricmanager", rel))
    assert all(r.verdict in (Verdict.FAIL, Verdict.UNKNOWN) for r in res)
    assert [r.verdict for r in judge_fabric_manager(h100(), {})] == [Verdict.UNKNOWN]
    l40s = expectations(load_cluster(ROOT / "inventories" / "l40s-pcie.yml"))["gpu001"]
    assert judge_fabric_manager(l40s, {}) == []  # no NVSwitch, no Fabric Manager to judge


def test_ib_write_bw_gbits_against_the_roce_floor() -> None:
    exp = dataclasses.replace(
        a100(),
        nics=(ExpectedNic("mlx5_0", "roce", "roce", 100),),
        thresholds={**a100().thresholds, "ib_write_bw_gbps": 90.0},
    )
    rel = "perftest/ib-write-bw-roce-100g-rdma-cm-cpu-freq-warning-client.txt"
    res = judge_ib_write_bw(exp, {"mlx5_0": ProbeOutput("perftest", body(rel))})
    [r] = res
    assert r.verdict is Verdict.OK
    assert r.measured == pytest.approx(92.40)
    assert r.percent_of_limit == pytest.approx(92.4)
    missing = judge_ib_write_bw(exp, {})
    assert [x.verdict for x in missing] == [Verdict.UNKNOWN]


def test_fleet_relative_flags_the_slow_node() -> None:
    def r(node: str, v: float) -> CheckResult:
        return CheckResult("nccl.busbw", node, Verdict.OK, "x", measured=v)

    res = judge_fleet_relative(
        [r("a", 480), r("b", 478), r("c", 481), r("d", 400)], "nccl.busbw", 0.95
    )
    assert [(x.node, x.verdict) for x in res] == [("d", Verdict.FAIL)]
    assert judge_fleet_relative([r("a", 480), r("b", 100)], "nccl.busbw", 0.95) == []


# ------------------------------------------------------------------------------------------
# GPU inventory and health from nvidia-smi -q, InfiniBand ports, DCGM, the suite


def h100_565() -> NodeExpectation:
    """The 8x H100 SXM capture runs driver 565.57.01."""
    return dataclasses.replace(h100(), driver_version="565.57.01")


def test_healthy_hgx_h100_smi_q() -> None:
    from gpuctl.validation.judges.gpus import judge_gpus

    res = judge_gpus(h100_565(), out("smi-q", "nvidia-smi/nvsmi-q-full-h100-sxm-8gpu-565.txt"))
    assert verdicts(res, "gpu.count") == [Verdict.OK]
    assert verdicts(res, "gpu.driver") == [Verdict.OK]
    assert [r for r in res if r.verdict is Verdict.FAIL] == []
    assert [r.subject for r in res if r.check == "gpu.fabric"] == [f"GPU{i}" for i in range(8)]
    assert set(verdicts(res, "gpu.fabric")) == {Verdict.OK}


def test_persistence_mode_on_every_gpu_is_ok() -> None:
    from gpuctl.validation.judges.gpus import judge_gpus

    res = judge_gpus(h100_565(), out("smi-q", "nvidia-smi/nvsmi-q-full-h100-sxm-8gpu-565.txt"))
    assert [(r.verdict, r.message) for r in res if r.check == "gpu.persistence"] == [
        (Verdict.OK, "persistence mode on, 8 GPUs")
    ]


def test_persistence_mode_off_warns_and_names_the_gpus() -> None:
    from gpuctl.validation.judges.gpus import judge_gpus

    # Azure's 8x A100 capture, driver 460: persistence mode Disabled on every GPU
    res = judge_gpus(a100(), out("smi-q", "nvidia-smi/nvsmi-q-full-a100-sxm4-40gb-8gpu-460.txt"))
    found = [r for r in res if r.check == "gpu.persistence"]
    assert [(r.verdict, r.measured) for r in found] == [(Verdict.WARN, 8)]
    assert found[0].message.startswith(
        "persistence mode off on GPU0, GPU1, GPU2, GPU3, GPU4, GPU5, GPU6, GPU7: "
    )
    # the XML form (smi-xml) of a one-GPU A10G, driver 515
    one = dataclasses.replace(a100(), gpu_count=1, product_name=None)
    res = judge_gpus(one, out("smi-xml", "nvidia-smi/nvsmi-q-x-a10g-1gpu-515.txt"))
    assert verdicts(res, "gpu.persistence") == [Verdict.WARN]


def test_persistence_mode_not_shown_is_unknown() -> None:
    from gpuctl.validation.judges.gpus import judge_gpus

    text = body("nvidia-smi/nvsmi-q-full-h100-sxm-8gpu-565.txt")
    lines = text.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if "Persistence Mode" in line)
    cut = "".join(lines[:first] + lines[first + 1 :])  # GPU0's line gone, the others kept
    res = judge_gpus(h100_565(), {"smi-q": ProbeOutput("smi-q", cut)})
    found = [r for r in res if r.check == "gpu.persistence"]
    assert [(r.verdict, r.message) for r in found] == [
        (Verdict.UNKNOWN, "persistence mode not shown for GPU0")
    ]


def test_wrong_driver_and_missing_gpus_fail() -> None:
    from gpuctl.validation.judges.gpus import judge_gpus

    res = judge_gpus(h100(), out("smi-q", "nvidia-smi/nvsmi-q-full-h100-sxm-8gpu-565.txt"))
    [drv] = [r for r in res if r.check == "gpu.driver"]
    assert (drv.verdict, drv.measured, drv.expected) == (Verdict.FAIL, "565.57.01", "570.133.20")
    res = judge_gpus(h100_565(), out("smi-q", "nvidia-smi/nvsmi-q-full-h100-1gpu-590-load.txt"))
    [count] = [r for r in res if r.check == "gpu.count"]
    assert (count.verdict, count.measured, count.expected) == (Verdict.FAIL, 1, 8)


def test_pending_row_remap_fails_the_gpu() -> None:
    from gpuctl.validation.judges.gpus import judge_gpus

    exp = dataclasses.replace(a100(), product_name=None, driver_version=None)
    res = judge_gpus(
        exp, out("smi-q", "nvidia-smi/nvsmi-q-a100-ecc-remap-pending-xid63-elided.txt")
    )
    remap = [r for r in res if r.check == "gpu.remap"]
    assert remap
    assert remap[0].verdict is Verdict.FAIL
    assert "pending" in remap[0].message


def test_ib_ports_down_and_missing_hca() -> None:
    from gpuctl.validation.judges.infiniband import judge_ib_ports

    exp = dataclasses.replace(
        h100(), nics=tuple(ExpectedNic(f"mlx5_{i}", "ndr", "infiniband", 400) for i in (0, 1, 4))
    )
    res = judge_ib_ports(exp, out("ibstat", "ib/ibstat-h100-ib-ndr400-all-active-space-indent.txt"))
    assert set(verdicts(res, "ib.port.state")) == {Verdict.OK}
    assert set(verdicts(res, "ib.port.rate")) == {Verdict.OK}
    panic = "ib/ibstat-a100-hdr200-ibpanic-missing-mlx5_8-exit255.txt"
    exp = dataclasses.replace(
        a100(), nics=tuple(ExpectedNic(f"mlx5_{i}", "ib", "infiniband", 200) for i in range(9))
    )
    res = judge_ib_ports(exp, out("ibstat", panic))
    missing = [r for r in res if r.check == "ib.port" and r.subject == "mlx5_8"]
    assert [r.verdict for r in missing] == [Verdict.FAIL]


def test_roce_port_on_an_infiniband_fabric_is_a_link_layer_failure() -> None:
    from gpuctl.validation.judges.infiniband import judge_ib_ports

    exp = dataclasses.replace(h100(), nics=(ExpectedNic("mlx5_0", "ndr", "infiniband", 400),))
    res = judge_ib_ports(exp, out("ibstat", "ib/ibstat-h100-node-roce400-plus-100g-all-active.txt"))
    assert verdicts(res, "ib.port.link_layer") == [Verdict.FAIL]


def test_dcgm_diag_pass_and_fail() -> None:
    from gpuctl.validation.judges.dcgm import judge_dcgm

    ok = judge_dcgm(h100(), out("dcgm-diag", "dcgm/dcgmi-diag-r4-pass-blacklist-era.txt"))
    assert ok
    assert {r.verdict for r in ok} == {Verdict.OK}
    bad = judge_dcgm(
        h100(), out("dcgm-diag", "dcgm/dcgmi-diag-r2-gpu-memory-fail-thermal-warning-fragment.txt")
    )
    assert Verdict.FAIL in [r.verdict for r in bad]


def test_suite_on_a_bundle_directory(tmp_path: Path) -> None:
    from gpuctl.validation.suite import judge_directory

    cluster = load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml")
    good = tmp_path / "gpu001"
    good.mkdir()
    (good / "smi-q.txt").write_text(body("nvidia-smi/nvsmi-q-full-h100-sxm-8gpu-565.txt"))
    (good / "meta.json").write_text('{"probes": {"nccl": {"timed_out": true}}}')
    (tmp_path / "gpu002").mkdir()
    (tmp_path / "gpu002" / "meta.json").write_text('{"unreachable": "ssh: connection refused"}')
    (tmp_path / "login01").mkdir()
    (tmp_path / "login01" / "meta.json").write_text('{"probes": {}}')
    report = judge_directory(cluster, tmp_path)
    by = {n.node: n for n in report.nodes}
    assert set(by) == {"head01", "head02", "login01", "gpu001", "gpu002", "gpu003", "gpu004"}
    assert by["gpu002"].failed
    assert "connection refused" in by["gpu002"].checks[0].message
    assert by["gpu003"].failed  # no folder at all: a failed node, never skipped
    gpu001 = {(r.check, r.verdict) for r in by["gpu001"].checks}
    assert ("nccl.busbw", Verdict.UNKNOWN) in gpu001  # timed out
    assert ("gpu.count", Verdict.OK) in gpu001
    assert by["gpu001"].failed  # unknown fails closed
    # reachable, nothing GPU-related to judge; the /home every node must have (the example's
    # validation.mounts) and its clock were not shown: UNKNOWN, which fails closed
    login = {(r.check, r.verdict) for r in by["login01"].checks}
    assert login == {
        ("node.reachable", Verdict.OK),
        ("node.mount", Verdict.UNKNOWN),
        ("node.clock", Verdict.UNKNOWN),
    }
    assert by["login01"].failed


def test_ib_write_bw_threshold_as_a_share_of_the_line_rate() -> None:
    exp = dataclasses.replace(
        a100(),
        nics=(ExpectedNic("mlx5_0", "roce", "roce", 100),),
        thresholds={**a100().thresholds, "ib_write_bw_gbps": "95%"},
    )
    rel = "perftest/ib-write-bw-roce-100g-rdma-cm-cpu-freq-warning-client.txt"
    [r] = judge_ib_write_bw(exp, {"mlx5_0": ProbeOutput("perftest", body(rel))})
    assert r.expected == pytest.approx(95.0)  # 95% of 100 Gb/s
    assert r.verdict is Verdict.FAIL  # 92.4 Gb/s


def test_xid_window_drops_old_events_but_keeps_undated_ones() -> None:
    from datetime import UTC, datetime

    rel = "kernel-xid/dmesg-iso-xid-48-63-94-dbe-row-remap.txt"  # 2024-11-15, ISO times
    later = datetime(2024, 11, 16, tzinfo=UTC)
    assert verdicts(judge_xid(h100(), out("xid", rel), now=later), "xid") == [Verdict.OK]
    during = datetime(2024, 11, 15, 12, 30, tzinfo=UTC)
    assert Verdict.FAIL in verdicts(judge_xid(h100(), out("xid", rel), now=during), "xid")
    bare = "kernel-xid/xid-79-fallen-off-bus-single-line.txt"  # no timestamp: always counts
    assert verdicts(judge_xid(h100(), out("xid", bare), now=later), "xid") == [Verdict.FAIL]


def test_slurm_node_state_drained_by_someone_else_is_a_warning() -> None:
    from gpuctl.validation.judges.slurm_node import judge_slurm_node

    rel = "slurm/scontrol-show-node-idle-drain-gres-count-lower-rtx3090.txt"
    exp = dataclasses.replace(h100(), node="yigou-dev-102-68")
    [r] = judge_slurm_node(exp, out("scontrol-node", rel))
    assert r.verdict is Verdict.WARN
    assert "by someone else" in r.message
    [r] = judge_slurm_node(h100(), out("scontrol-node", rel))
    assert r.verdict is Verdict.UNKNOWN  # gpu001 is not in that output


def test_unknown_is_failure_comes_from_cluster_yml(tmp_path: Path) -> None:
    import yaml

    from gpuctl.config import load_cluster_text
    from gpuctl.validation.suite import judge_directory

    doc = yaml.safe_load((ROOT / "inventories" / "workstation.yml").read_text())
    doc["validation"]["unknown_is_failure"] = False
    cluster = load_cluster_text(yaml.safe_dump(doc), "ws.yml")
    (tmp_path / "gpu001").mkdir()
    (tmp_path / "gpu001" / "meta.json").write_text('{"probes": {}}')  # nothing collected
    report = judge_directory(cluster, tmp_path)
    [node] = report.nodes
    assert node.verdict is Verdict.UNKNOWN
    assert not node.failed


def test_real_captures_stay_below_the_physical_ceilings() -> None:
    """Every nccl-tests and perftest capture in tests/fixtures reads below the ceilings in
    data/limits.yml (the fastest GPU and port gpuctl knows): the ceilings never fail hardware."""
    from gpuctl.config.catalog import busbw_ceiling, fastest_rate, port_ceiling
    from gpuctl.validation.judges.infiniband import MB_PER_SEC_TO_GBPS
    from gpuctl.validation.parsing import parse
    from gpuctl.validation.plausible import implausible, nccl_table_lie

    checked = 0
    for path in sorted((FIX / "nccl-tests").glob("*.txt")):
        text = capture_output(path)
        rows = parse("nccl", text).data.get("rows") or []
        assert nccl_table_lie(rows, busbw_ceiling(None), text) is None, path.name
        checked += bool(rows)
    fastest = port_ceiling(2 * fastest_rate(None))  # bidirectional runs included
    for path in sorted((FIX / "perftest").glob("ib-write-bw-*.txt")):
        data = parse("perftest", capture_output(path)).data
        for row in data.get("rows") or []:
            bw = row["bw_average"] * (MB_PER_SEC_TO_GBPS if data["bw_unit"] == "MB/sec" else 1)
            assert implausible(bw, fastest, "ib_write_bw", "Gb/s") is None, path.name
            checked += 1
    assert checked >= 15
