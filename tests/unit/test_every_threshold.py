"""Every threshold of the model is enforced or refused (issue 17).

The test walks `Thresholds.model_fields`, so a key added to the model later is checked too:
each key is either refused (gpuctl/config/rules/settings.py UNENFORCED_THRESHOLDS: setting it
in `validation.thresholds` or in a node group gives "not enforced yet" with its path) or has a
case in CASES. A case builds node outputs from real captures (tests/fixtures/), judges them
twice with the threshold on either side of the measured value, once from
`validation.thresholds` and once from the node group, and asserts that the verdict of the check
THRESHOLD_CHECKS names for the key flips between passing and FAIL. `gpuctl check --json` lists
exactly the enforced keys, each with the checks that read it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT

from gpuctl.config import load_cluster_text
from gpuctl.config.catalog import gpu_specs, health_defaults
from gpuctl.config.derived import summarize
from gpuctl.config.model import Cluster, Thresholds
from gpuctl.config.rules import settings
from gpuctl.config.rules.settings import THRESHOLD_CHECKS, UNENFORCED_THRESHOLDS
from gpuctl.errors import ConfigError
from gpuctl.lab.sim import faults as sim_faults
from gpuctl.lab.sim import perf as sim_perf
from gpuctl.lab.sim import profiles as sim_profiles
from gpuctl.validation import multinode_bundle
from gpuctl.validation.bundle import META_FILE, MULTINODE_DIR, NodeBundle
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import ExpectedNic, expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.counters import judge_ib_port_errors
from gpuctl.validation.judges.node import judge_clock
from gpuctl.validation.parsing import parse
from gpuctl.validation.results import CheckResult, Verdict
from gpuctl.validation.suite import judge_cluster

FIX = ROOT / "tests" / "fixtures"
# The base cluster: 4 nodes gpu[001-004] of 8x A100-SXM4-80GB, 4 RoCE adapters at 200 Gb/s.
BASE = ROOT / "inventories" / "a100-roce.yml"
GROUP = 2  # node_groups[2] is the a100 group
NODE = "gpu001"

Results = dict[str, list[CheckResult]]


def _text(rel: str, edit: Callable[[str], str] = lambda t: t) -> str:
    return edit(capture_output(FIX / rel))


def _on(kind: str, rel: str, edit: Callable[[str], str] = lambda t: t) -> Callable[..., Any]:
    """One output of ``kind`` on NODE."""

    def bundles(cluster: Cluster, tmp: Path) -> dict[str, NodeBundle]:
        return {NODE: NodeBundle(NODE, {kind: ProbeOutput(kind, _text(rel, edit))})}

    return bundles


NCCL_FAST = "nccl-tests/all-reduce-perf-a100-sxm4-40gb-8gpu-with-nccl-info-line.txt"  # 235.26
NCCL_SLOW = "nccl-tests/all-reduce-perf-a100-sxm4-80gb-8gpu-mpi-nccl2.16-hostname-placeholder.txt"
BW_92 = "perftest/ib-write-bw-roce-100g-rdma-cm-cpu-freq-warning-client.txt"  # 92.40 Gb/s
BW_111 = "perftest/ib-write-bw-dgx-spark-rocep1s0f1-4qp-rdma-cm-gbits-client.txt"  # 111.71 Gb/s
# GPU memory (--use_cuda, DMA-BUF) through a RoCE mlx5_1: 181.46 Gb/s
LAT_157 = "perftest/ib-write-lat-dgx-spark-rocep1s0f1-rdma-cm-client-2B.txt"  # p99 1.57 us
GDR_181 = "perftest/ib-write-bw-use-cuda-dmabuf-a40-cx7-roce-16qp-60s-gbits-client.txt"
REMAP = "nvidia-smi/nvsmi-q-a100-ecc-remap-pending-xid63-elided.txt"  # pending Yes, DRAM corr 177
SRAM_UNC = "nvidia-smi/nvsmi-q-ecc-section-sram-uncorrectable-fragment.txt"  # SRAM unc. aggr. 5
XID_13 = "kernel-xid/dmesg-decode-iso-xid-13-43-sm-exceptions.txt"  # Xid 13 and 43
MULTINODE = "nccl-tests/all-reduce-perf-2node-p4de-a100-srun-prefix-table-only.txt"  # 78.33
ALL_GATHER = "nccl-tests/all-gather-perf-a100-sxm4-40gb-8gpu-validation0.txt"  # 223.39
REDUCE_SCATTER = "nccl-tests/reduce-scatter-perf-a100-sxm4-40gb-8gpu-validation0.txt"  # 231.52
ALLTOALL = "nccl-tests/alltoall-perf-a100-sxm4-40gb-8gpu-validation0.txt"  # 224.31
# 8 GPUs on PCIe Gen4 x16: host -> GPU 23.90 to 26.38, GPU -> host 26.25 to 27.11 GB/s
NVBANDWIDTH_8 = "nvbandwidth/nvbandwidth-rtx4090-8gpu-v0.2-full-run-h2d-d2h-partial.txt"
NVBANDWIDTH_D2D = "nvbandwidth/nvbandwidth-h800-8gpu-v0.2-full-run.txt"  # 8x H800, NVSwitch


def _sendrecv(cluster: Cluster, tmp: Path) -> dict[str, NodeBundle]:
    """No public capture of a whole sendrecv_perf run was found (the one real table,
    tests/fixtures/nccl-tests/sendrecv-*, has no device list and stops at 1 GiB): the lab's
    stand-in for an 8x A100 node, in nccl-tests v2.17.9's layout (tests/unit/
    test_nccl_collectives.py checks it against that release's source and the real table)."""
    return {NODE: NodeBundle(NODE, {"nccl.sendrecv": ProbeOutput("nccl.sendrecv", SENDRECV)})}


SENDRECV = sim_perf.nccl_perf(
    sim_profiles.load("a100-hdr"), {}, NODE, sim_perf.NcclArgs(8, 8 << 30, 2, 8), "sendrecv"
)
SENDRECV_BUSBW = float(parse("nccl", SENDRECV).data["rows"][-1]["out_of_place"]["busbw"])


def _collective_fleet(name: str) -> Callable[..., Any]:
    """NODE's ``name`` run at 0.9 x its three peers' (the lab stand-in for 8x A100 nodes, with
    the nccl_collective_slow fault on NODE: one real capture per collective is all there is)."""

    def bundles(cluster: Cluster, tmp: Path) -> dict[str, NodeBundle]:
        kind = f"nccl.{name}"
        out = {}
        for n in ("gpu001", "gpu002", "gpu003", "gpu004"):
            faults = (
                sim_faults.apply({}, "nccl_collective_slow", f"{name}:0.9") if n == NODE else {}
            )
            text = sim_perf.nccl_perf(
                sim_profiles.load("a100-hdr"), faults, n, sim_perf.NcclArgs(8, 8 << 30, 2, 8), name
            )
            out[n] = NodeBundle(n, {kind: ProbeOutput(kind, text)})
        return out

    return bundles


def _nccl_fleet(cluster: Cluster, tmp: Path) -> dict[str, NodeBundle]:
    """NODE at 231.72 GB/s, its three peers at 235.26: 0.985 x the group's median."""
    return {
        n: NodeBundle(
            n, {"nccl": ProbeOutput("nccl", _text(NCCL_SLOW if n == NODE else NCCL_FAST))}
        )
        for n in ("gpu001", "gpu002", "gpu003", "gpu004")
    }


def _ib_write_bw(per_node: Mapping[str, str]) -> Callable[..., Any]:
    def bundles(cluster: Cluster, tmp: Path) -> dict[str, NodeBundle]:
        hcas = [nic.device for nic in expectations(cluster)[NODE].nics]
        return {
            n: NodeBundle(n, {}, {h: ProbeOutput("ib_write_bw", _text(rel)) for h in hcas})
            for n, rel in per_node.items()
        }

    return bundles


def _failure_occurred(text: str) -> str:
    # No public capture shows "Remapping Failure Occurred : Yes" (tests/fixtures/INDEX.md); the
    # real A100 capture with Remapped Rows shows No, turned to Yes here, in memory only.
    return re.sub(r"(Remapping Failure Occurred\s+: )No", r"\1Yes", text)


def _sram_correctable(text: str) -> str:
    # No public capture shows a non-zero SRAM correctable count; 12 here, in memory only.
    return re.sub(r"(SRAM Correctable\s+: )0\b", r"\g<1>12", text)


PERFQUERY = "ib/counters/perfquery-x-rhel75-lid10-port1-all-zero.txt"  # every counter 0


def _link_flaps(cluster: Cluster, tmp: Path) -> Results:
    """NODE with one InfiniBand HCA whose LinkDownedCounter grew by 2 between the two reads
    (the base cluster's adapters are RoCE: NODE's expectation with the thresholds resolved
    there and an InfiniBand HCA in place of them)."""
    exp = expectations(cluster)[NODE]
    exp = dataclasses.replace(exp, nics=(ExpectedNic("mlx5_0", "ib", "infiniband", 400),))
    zero = _text(PERFQUERY)
    flapped = re.sub(r"^(LinkDownedCounter:\.+)0$", r"\g<1>2", zero, flags=re.M)
    outputs = {
        "perfquery.start.mlx5_0": ProbeOutput("perfquery", zero),
        "perfquery.end.mlx5_0": ProbeOutput("perfquery", flapped),
    }
    return {NODE: judge_ib_port_errors(exp, outputs)}


# GNU date on a lab node (tests/fixtures/node/), and the window in which gpuctl sent the
# command and got the answer: the node's clock 2.5 s ahead, +/- 0.05 s
CLOCK = "node/date-epoch-ns-debian13-lab-node.txt"


def _clock(cluster: Cluster, tmp: Path) -> Results:
    exp = expectations(cluster)[NODE]
    epoch = float(_text(CLOCK))
    output = ProbeOutput("clock", _text(CLOCK), ran=(epoch - 2.55, epoch - 2.45))
    return {NODE: judge_clock(exp, {"clock": output})}


def _judged(cluster: Cluster, tmp: Path, bundles: dict[str, NodeBundle]) -> Results:
    report = judge_cluster(cluster, bundles, charts=False)
    return {n.node: list(n.checks) for n in report.nodes}


def _gpudirect(cluster: Cluster, tmp: Path) -> Results:
    """The cluster with software.perftest (perftest built with CUDA, so GPUDirect RDMA is
    measured); every GPU of NODE with the A40 capture over mlx5_1: 181.46 Gb/s."""
    software = cluster.software.model_copy(update={"perftest": "25.10.0-0.128"})
    cluster = cluster.model_copy(update={"software": software})
    text = _text(GDR_181)
    count = expectations(cluster)[NODE].gpu_count
    outputs = {f"perftest.gdr.gpu{g}": ProbeOutput("perftest", text) for g in range(count)}
    return _judged(cluster, tmp, {NODE: NodeBundle(NODE, outputs)})


def _latency(cluster: Cluster, tmp: Path) -> dict[str, NodeBundle]:
    """Every HCA of NODE with the DGX Spark ib_write_lat capture: 99th percentile 1.57 us."""
    text = _text(LAT_157)
    hcas = [nic.device for nic in expectations(cluster)[NODE].nics]
    outputs = {f"perftest.lat.{h}": ProbeOutput("perftest", text) for h in hcas}
    return {NODE: NodeBundle(NODE, outputs)}


def _multinode(cluster: Cluster, tmp: Path) -> Results:
    """The recorded 2-node run of NODE and gpu002 (78.33 GB/s), judged from a bundle's
    _multinode folder as `gpuctl validate --level long` and `gpuctl report` judge it."""
    folder = tmp / MULTINODE_DIR / "a100"
    folder.mkdir(parents=True)
    (folder / "run-01.txt").write_text(_text(MULTINODE), encoding="utf-8")
    nodes = [NODE, "gpu002"]
    meta = {"nodes": nodes, "runs": [{"file": "run-01.txt", "nodes": nodes, "rc": 0}]}
    (folder / META_FILE).write_text(json.dumps(meta), encoding="utf-8")
    results, _ = multinode_bundle.judge_bundle_dir(tmp, expectations(cluster))
    out: Results = {}
    for r in results:
        out.setdefault(r.node, []).append(r)
    return out


@dataclass(frozen=True)
class Case:
    key: str
    check: str  # the check whose verdict flips (one of THRESHOLD_CHECKS[key])
    passes_at: Any  # a threshold on the passing side of the measured value
    fails_at: Any  # one on the failing side
    bundles: Callable[[Cluster, Path], dict[str, NodeBundle]] | None = None
    judge: Callable[[Cluster, Path], Results] | None = None  # instead of judge_cluster
    passing: Verdict = Verdict.OK  # the verdict on the passing side
    failing: Verdict = Verdict.FAIL  # and on the failing side
    also: dict[str, Any] = field(default_factory=dict)  # other thresholds the case sets

    @property
    def id(self) -> str:
        return f"{self.key}:{self.check}"


CASES: tuple[Case, ...] = (
    # minimums: the measurement is judged against a floor
    Case("nccl_all_reduce_busbw_gbs", "nccl.busbw", 235.0, 235.5, _on("nccl", NCCL_FAST)),
    Case(
        "nccl_all_gather_busbw_gbs",
        "nccl.all_gather.busbw",
        223.0,
        223.5,
        _on("nccl.all_gather", ALL_GATHER),
    ),
    Case(
        "nccl_reduce_scatter_busbw_gbs",
        "nccl.reduce_scatter.busbw",
        231.0,
        232.0,
        _on("nccl.reduce_scatter", REDUCE_SCATTER),
    ),
    Case(
        "nccl_alltoall_busbw_gbs",
        "nccl.alltoall.busbw",
        224.0,
        224.5,
        _on("nccl.alltoall", ALLTOALL),
    ),
    Case(
        "nccl_sendrecv_busbw_gbs",
        "nccl.sendrecv.busbw",
        SENDRECV_BUSBW - 0.5,
        SENDRECV_BUSBW + 0.5,
        _sendrecv,
    ),
    Case(
        "nccl_multinode_busbw_gbs",
        "nccl.multinode",
        78.0,
        79.0,
        judge=_multinode,
        # two nodes below the floor: the locator cannot tell which one is slow and says so
        # (UNKNOWN, which fails the node: validation.unknown_is_failure)
        failing=Verdict.UNKNOWN,
    ),
    Case("ib_write_bw_gbps", "ib.write_bw", 92.0, 93.0, _ib_write_bw({NODE: BW_92})),
    Case("ib_write_bw_gbps", "gpudirect.write_bw", 181.0, 182.0, judge=_gpudirect),
    Case("ib_write_lat_p99_us", "ib.write_lat", 1.57, 1.56, _latency),
    # the slowest GPU of the node decides: GPU2 copies 23.90 GB/s in, GPU2 26.25 GB/s out
    Case("pcie_h2d_gbs", "pcie.h2d", 23.9, 24.0, _on("nvbandwidth", NVBANDWIDTH_8)),
    Case("pcie_d2h_gbs", "pcie.d2h", 26.25, 26.3, _on("nvbandwidth", NVBANDWIDTH_8)),
    # the slowest pair decides: GPU reads of a peer from 171.88 GB/s, writes from 175.99
    Case("p2p_read_gbs", "p2p.read", 171.88, 171.9, _on("nvbandwidth.d2d", NVBANDWIDTH_D2D)),
    Case("p2p_write_gbs", "p2p.write", 175.99, 176.0, _on("nvbandwidth.d2d", NVBANDWIDTH_D2D)),
    Case("fleet_relative_min", "nccl.busbw.fleet", 0.98, 0.99, _nccl_fleet),
    *(
        Case("fleet_relative_min", f"nccl.{name}.busbw.fleet", 0.85, 0.95, _collective_fleet(name))
        for name in ("all_gather", "reduce_scatter", "alltoall", "sendrecv")
    ),
    Case(
        "fleet_relative_min",
        "ib.write_bw.fleet",
        0.82,  # NODE's HCAs at 92.40, its peers' at 111.71: 0.827 x the fabric's median
        0.83,
        _ib_write_bw({"gpu001": BW_92, "gpu002": BW_111, "gpu003": BW_111, "gpu004": BW_111}),
    ),
    # maximums: a count above it fails the GPU
    Case("remapped_rows_pending_max", "gpu.remap", 1, 0, _on("smi-q", REMAP)),
    Case(
        "remapped_rows_failure_max",
        "gpu.remap",
        1,
        0,
        _on("smi-q", REMAP, _failure_occurred),
        also={"remapped_rows_pending_max": 1},  # the capture's remap is pending too
    ),
    Case("sram_uncorrectable_max", "gpu.ecc.sram_uncorrectable", 5, 4, _on("smi-q", SRAM_UNC)),
    Case(
        "sram_correctable_max",
        "gpu.ecc.sram_correctable",
        12,
        11,
        _on("smi-q", REMAP, _sram_correctable),
    ),
    Case("dram_correctable_max", "gpu.ecc.dram_correctable", 177, 176, _on("smi-q", REMAP)),
    # two link-downs during the run: within a maximum of 2 a warning, above 1 a failure
    Case("ib_link_flaps_max", "ib.port.errors", 2, 1, judge=_link_flaps, passing=Verdict.WARN),
    # the node's clock 2.5 s (+/- 0.05) ahead of gpuctl's
    Case("clock_offset_max_s", "node.clock", 2.6, 2.4, judge=_clock),
    # a list: Xid 13 is "monitor" in data/xid.yml; in xid_fatal it fails the node
    Case("xid_fatal", "xid", [48], [13], _on("xid", XID_13), passing=Verdict.WARN),
)

LAYERS = ("validation", "node_group")


def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(BASE.read_text(encoding="utf-8"))
    return doc


def _with(layer: str, values: Mapping[str, Any]) -> Cluster:
    doc = _doc()
    owner = doc if layer == "validation" else doc["node_groups"][GROUP]
    place = owner.setdefault("validation", {})
    place.setdefault("thresholds", {}).update(copy.deepcopy(dict(values)))
    return load_cluster_text(yaml.safe_dump(doc), "cluster.yml")


_ORDER = (Verdict.OK, Verdict.WARN, Verdict.UNKNOWN, Verdict.FAIL)


def _verdict(results: Results, check: str) -> Verdict | None:
    """The worst verdict of ``check`` on NODE (over its subjects: GPUs, HCAs, PCI addresses)."""
    found = [r.verdict for r in results.get(NODE, []) if r.check == check]
    return max(found, key=_ORDER.index) if found else None


def _run(case: Case, layer: str, value: Any, tmp: Path) -> Verdict | None:
    cluster = _with(layer, {**case.also, case.key: value})
    if case.judge is not None:
        return _verdict(case.judge(cluster, tmp), case.check)
    assert case.bundles is not None
    return _verdict(_judged(cluster, tmp, case.bundles(cluster, tmp)), case.check)


def test_every_threshold_key_is_enforced_or_refused() -> None:
    keys = list(Thresholds.model_fields)
    cased = {c.key for c in CASES}
    refused = set(UNENFORCED_THRESHOLDS)
    missing = [
        f"{k}: neither refused (UNENFORCED_THRESHOLDS) nor proven (a case in CASES, a check in "
        "THRESHOLD_CHECKS)"
        for k in keys
        if k not in cased and k not in refused
    ]
    assert not missing, "\n".join(missing)
    assert not cased & refused, cased & refused
    assert set(THRESHOLD_CHECKS) == cased, set(THRESHOLD_CHECKS) ^ cased
    assert set(keys) == cased | refused, (cased | refused) - set(keys)
    # every check a key names is flipped by a case
    proven = {(c.key, c.check) for c in CASES}
    named = {(k, check) for k, checks in THRESHOLD_CHECKS.items() for check in checks}
    assert named == proven, named ^ proven


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_moving_a_threshold_across_the_measured_value_flips_the_verdict(
    case: Case, layer: str, tmp_path: Path
) -> None:
    passing = _run(case, layer, case.passes_at, tmp_path / "pass")
    failing = _run(case, layer, case.fails_at, tmp_path / "fail")
    assert (passing, failing) == (case.passing, case.failing), (
        f"{case.key} from {layer}: {case.passes_at!r} gives {passing}, {case.fails_at!r} gives "
        f"{failing}; expected {case.passing} and {case.failing} from {case.check}"
    )


@pytest.mark.parametrize("layer", LAYERS)
def test_an_unenforced_threshold_is_refused_with_its_path(
    layer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every key is enforced today (UNENFORCED_THRESHOLDS is empty): the refusal of a key no
    check reads is proven on a key made unenforced for the test."""
    assert UNENFORCED_THRESHOLDS == ()
    key = "ib_write_lat_p99_us"
    monkeypatch.setattr(settings, "UNENFORCED_THRESHOLDS", (key,))
    with pytest.raises(ConfigError) as caught:
        _with(layer, {key: 1})
    where = (
        f"validation.thresholds.{key}"
        if layer == "validation"
        else f"node_groups[{GROUP}].validation.thresholds.{key}"
    )
    assert [p.message for p in caught.value.problems if p.path == where] == [
        f"not enforced yet: no check reads {key}; remove it"
    ], [(p.path, p.message) for p in caught.value.problems]


def test_check_json_lists_each_enforced_threshold_with_its_check() -> None:
    summary = summarize(load_cluster_text(BASE.read_text(encoding="utf-8"), "cluster.yml"))
    for group in summary.to_json()["groups"]:
        listed = group["thresholds"]
        assert set(listed) == set(THRESHOLD_CHECKS), group["name"]
        for key, entry in listed.items():
            assert entry["checked_by"] == list(THRESHOLD_CHECKS[key]), key
            assert entry["source"], key
    # and no data file gives a default for a key no check reads
    defaults = set(health_defaults()) | {k for g in gpu_specs().values() for k in g.thresholds}
    assert defaults <= set(THRESHOLD_CHECKS), defaults - set(THRESHOLD_CHECKS)
    a100 = summary.to_json()["groups"][GROUP]["thresholds"]
    assert a100["xid_fatal"]["source"].startswith("gpuctl default (data/xid.yml")
    assert 79 in a100["xid_fatal"]["value"]
    assert 13 not in a100["xid_fatal"]["value"]
