"""The probe table: real commands, parsed kinds that exist, budgets, and the same view of what
each node needs as the judges have."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from helpers import ROOT

from gpuctl.config import load_cluster
from gpuctl.config.model import LEVELS
from gpuctl.validation.bundle import NodeBundle
from gpuctl.validation.expect import NodeExpectation, expectations
from gpuctl.validation.judges import NODE_JUDGES
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.parsing import parse, registry
from gpuctl.validation.probes import (
    LEVEL_BUDGET_S,
    PROBES,
    ib_write_bw_client,
    ib_write_bw_server,
    parser_of,
    perftest_kind,
    probes_for,
    wants_ib_write_bw,
)
from gpuctl.validation.scope import with_level
from gpuctl.validation.suite import judge_node

INVENTORIES = sorted(p for p in (ROOT / "inventories").glob("*.yml"))


def _exps(inventory: Path, level: str) -> dict[str, NodeExpectation]:
    return expectations(with_level(load_cluster(inventory), level))


def _commands(exp: NodeExpectation, level: str) -> dict[str, str]:
    return {p.kind: shlex.join(p.command(exp)) for p in probes_for(exp, level)}


def test_every_probe_kind_has_a_parser() -> None:
    kinds = set(registry())
    assert {p.parser for p in PROBES} <= kinds
    assert "perftest" in kinds


def test_every_judge_reads_parsed_kinds_and_every_probe_output_has_a_judge() -> None:
    kinds = set(registry())
    read = {kind for judge in NODE_JUDGES for kind in judge.reads}
    assert {parser_of(kind) for kind in read} <= kinds
    assert {p.kind for p in PROBES} <= read
    assert len({judge.name for judge in NODE_JUDGES}) == len(NODE_JUDGES)


def test_quick_on_an_hgx_h100_node_runs_the_inventory_health_and_version_commands() -> None:
    exp = _exps(ROOT / "inventories" / "hgx-h100-ndr.yml", "quick")["gpu001"]
    assert _commands(exp, "quick") == {
        "smi-xml": "nvidia-smi -q -x",
        "topo": "nvidia-smi topo -m",
        "nvlink": "nvidia-smi nvlink -s",
        "xid": "journalctl -t kernel -b --no-pager -o short-iso",
        "fabricmanager": "systemctl status nvidia-fabricmanager --no-pager -l",
        "ibstat": "ibstat",
        # the golden-config comparison's two (ofed_info where cluster.yml installs DOCA-OFED)
        "uname": "uname -r",
        "ofed-info": "ofed_info -s",
        # the cluster's /home and the group's /raid (validation.mounts), their paths only
        "df": "df -B1 --output=file,target,fstype,size,avail -- /home /raid",
    }


def test_standard_and_long_add_nccl_over_every_gpu_and_dcgm() -> None:
    exp = _exps(ROOT / "inventories" / "hgx-h100-ndr.yml", "standard")["gpu001"]
    standard = _commands(exp, "standard")
    assert standard["nccl"] == "all_reduce_perf -b 8 -e 8G -f 2 -g 8"
    assert standard["nccl.alltoall"] == "alltoall_perf -b 8 -e 8G -f 2 -g 8"
    assert standard["nccl.sendrecv"] == "sendrecv_perf -b 8 -e 8G -f 2 -g 8"
    assert standard["dcgm-diag"] == "dcgmi diag -r 2"
    # DCGM 4.2.3 for CUDA 12.8: the nvbandwidth of datacenter-gpu-manager-4-cuda12
    assert standard["nvbandwidth"] == (
        "/usr/libexec/datacenter-gpu-manager-4/plugins/cuda12/nvbandwidth "
        "-t host_to_device_memcpy_ce -t device_to_host_memcpy_ce"
    )
    # and between every GPU pair over NVSwitch
    assert standard["nvbandwidth.d2d"] == (
        "/usr/libexec/datacenter-gpu-manager-4/plugins/cuda12/nvbandwidth "
        "-t device_to_device_memcpy_read_ce -t device_to_device_memcpy_write_ce"
    )
    assert "nvbandwidth" not in _commands(exp, "quick")
    assert _commands(exp, "long")["dcgm-diag"] == "dcgmi diag -r 3"
    # the GPU-heavy probes run last, one at a time
    order = [p.kind for p in probes_for(exp, "standard")]
    hcas = [n.device for n in exp.nics]
    assert len(hcas) == 8
    # the GPU tests, the second read of the NVLink counters after them, then the second reads
    # of the InfiniBand port counters (run after ib_write_bw between nodes)
    # (GPUDirect RDMA per GPU last: software.perftest builds perftest with CUDA there)
    assert order[-25:] == [
        "nccl",
        "nccl.all_gather",
        "nccl.reduce_scatter",
        "nccl.alltoall",
        "nccl.sendrecv",
        "nvbandwidth",
        "nvbandwidth.d2d",
        "dcgm-diag",
        *(f"perftest.gdr.gpu{g}" for g in range(8)),
        "nvlink-errors.end",
        *(f"perfquery.end.{hca}" for hca in hcas),
    ]
    assert order.index("nvlink-errors.start") < order.index("nccl")
    assert {f"perfquery.start.{hca}" for hca in hcas} <= set(order[: order.index("nccl")])
    assert standard["perfquery.start.mlx5_0"] == "perfquery -x -C mlx5_0 -P 1"
    assert not any(kind.startswith("perfquery") for kind in _commands(exp, "quick"))
    assert wants_ib_write_bw(exp, "standard")
    assert not wants_ib_write_bw(exp, "quick")


def test_pcie_nodes_skip_nvlink_and_fabric_manager_and_cpu_nodes_run_nothing() -> None:
    l40s = _exps(ROOT / "inventories" / "l40s-pcie.yml", "quick")
    gpu = next(e for e in l40s.values() if e.gpu_count)
    assert set(_commands(gpu, "quick")) == {"smi-xml", "topo", "xid", "ibstat", "uname"} - (
        set() if gpu.nics else {"ibstat"}
    )
    cpu = [e for e in l40s.values() if not e.gpu_count and not e.nics]
    assert cpu
    assert all(probes_for(e, "long") == [] for e in cpu)


def test_ib_write_bw_command_lines() -> None:
    assert shlex.join(ib_write_bw_server("mlx5_3", 18518)) == (
        "ib_write_bw -d mlx5_3 -p 18518 -s 8388608 -F --report_gbits"
    )
    assert shlex.join(ib_write_bw_client("mlx5_3", 18518, "10.0.0.12")) == (
        "ib_write_bw -d mlx5_3 -p 18518 -s 8388608 -F --report_gbits 10.0.0.12"
    )
    assert perftest_kind("mlx5_3") == "perftest-mlx5_3"


@pytest.mark.parametrize("level", LEVELS)
def test_each_level_fits_its_budget(level: str) -> None:
    for inventory in INVENTORIES:
        for exp in _exps(inventory, level).values():
            total = sum(p.timeout_s for p in probes_for(exp, level))
            assert total <= LEVEL_BUDGET_S[level], (inventory.name, exp.node, total)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("inventory", INVENTORIES, ids=lambda p: p.stem)
def test_what_is_collected_is_what_the_judges_read(inventory: Path, level: str) -> None:
    """No judge says "not collected" for a node that ran its level's probes, and no probe
    output goes unread (each kind is read by some judge on that node)."""
    for exp in _exps(inventory, level).values():
        plan = probes_for(exp, level)
        outputs = {p.kind: ProbeOutput(p.kind, "x") for p in plan}
        per_hca = {
            n.device: ProbeOutput("perftest", "x") for n in exp.nics if wants_ib_write_bw(exp)
        }
        results = judge_node(exp, NodeBundle(exp.node, outputs, per_hca))
        missing = [r.message for r in results if "not collected" in r.message]
        assert missing == [], (exp.node, missing)
        read = {kind for kind in outputs if any(r.message.startswith(f"{kind}:") for r in results)}
        assert read == set(outputs), (exp.node, set(outputs) - read)


def test_probe_timeouts_are_set() -> None:
    """Every probe has a timeout of an hour at most; at burn, dcgmi diag -r 4 three hours and
    the burn loop its --duration (timeout 0 in the table: burn_collect bounds each command)."""
    burn_only = [p for p in PROBES if p.levels == {"burn"}]
    assert all(0 < p.timeout_s <= 3600 for p in PROBES if p not in burn_only)
    assert sorted((p.kind, p.timeout_s) for p in burn_only) == [("dcgm-diag", 10800), ("dmon", 0)]
    with pytest.raises(ValueError, match="unknown level"):
        probes_for(NodeExpectation("n", "g"), "fast")


def test_the_xid_probe_output_of_a_quiet_node_is_a_kernel_log() -> None:
    """`journalctl -t kernel -b -o short-iso`: the boot's kernel lines (also as a process logs
    them under the kernel's identifier, `kernel[PID]:`, as lab nodes do) make a clean kernel
    log; an empty journal does not."""
    boot = (
        "2026-12-01T03:20:00+0000 gpu001 kernel: Linux version 6.1.0-31-amd64\n"
        "2026-12-01T03:20:00+0000 gpu001 kernel[311]: Command line: ro quiet\n"
    )
    quiet = parse("xid", boot)
    assert (quiet.recognised, quiet.data["events"], quiet.problems) == (True, [], ())
    xid = parse(
        "xid",
        boot + "2026-12-01T03:25:00+0000 gpu001 kernel[4711]: NVRM: Xid (PCI:0000:5d:00): 79, "
        "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n",
    )
    assert xid.data["events"][0]["timestamp"] == "2026-12-01T03:25:00+0000"
    assert not parse("xid", "-- No entries --\n").recognised


def test_a_plan_is_shared_by_nodes_of_one_shape_and_never_stale() -> None:
    """probes_for keeps one plan per node shape (everything but the name and thresholds): the
    judges ask for it per kind, which took a seventh of judging 1,024 nodes."""
    import dataclasses

    from gpuctl.validation.expect import ExpectedMount

    exp = _exps(ROOT / "inventories" / "hgx-h100-ndr.yml", "standard")["gpu001"]
    twin = dataclasses.replace(exp, node="gpu999", thresholds={"nccl_all_reduce_busbw_gbs": 1})
    assert probes_for(twin) == probes_for(exp)
    assert probes_for(exp) is not probes_for(exp)  # a fresh list: a caller may change it
    other = dataclasses.replace(exp, mounts=(ExpectedMount("/scratch"),))
    [df] = [p for p in probes_for(other) if p.kind == "df"]
    assert df.command(other)[-1] == "/scratch"
    assert [p.kind for p in probes_for(exp, "quick")] != [p.kind for p in probes_for(exp)]
