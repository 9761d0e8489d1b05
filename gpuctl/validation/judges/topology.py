"""Topology (``nvidia-smi topo -m``): GPUs listed, NVLink per GPU pair, GPU-NIC PCIe affinity;
and (``nvidia-smi topo -p2p r``) which GPU pairs may read each other's memory."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.gpudirect import PATH_RANK
from gpuctl.validation.judges.base import Outputs, finding, node_judge, usable_parse
from gpuctl.validation.parsers.topo import (
    Topology,
    adapter_names,
    p2p_matrix_of,
    topology_of,
)
from gpuctl.validation.results import CheckResult, Verdict

_NV = re.compile(r"NV(\d+)$")


@node_judge("topo")
def judge_topology(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    result, unknown = usable_parse(exp, outputs, ["topo"], "topology")
    if result is None:
        return unknown
    topo = topology_of(result.data)
    listed = topo.gpus
    out = list(unknown)
    gpus = list(dict.fromkeys(listed))  # a GPU listed twice counts once
    twice_listed = Counter(listed) if len(gpus) != len(listed) else {}
    for name in sorted(g for g, n in twice_listed.items() if n > 1):
        out.append(
            finding(
                exp,
                "gpu.duplicate",
                Verdict.FAIL,
                f"{name} is listed twice in nvidia-smi topo -m; counted once",
                subject=name,
                expected="each GPU once",
            )
        )
    if len(gpus) != exp.gpu_count:
        twice = (
            f" ({len(listed) - len(gpus)} listed twice, not counted)"
            if len(listed) > len(gpus)
            else ""
        )
        out.append(
            finding(
                exp,
                "topology.gpus",
                Verdict.FAIL,
                f"topo -m shows {len(gpus)} GPUs, expected {exp.gpu_count}{twice}",
                measured=len(gpus),
                expected=exp.gpu_count,
            )
        )
    # a GPU missing renumbers the ones after it (nvidia-smi counts the GPUs it sees): a pair or
    # a rail by index would name another GPU, so only an NVSwitch board's pairs (all alike) are
    # judged then; topology.gpus fails the node already
    complete = len(gpus) == exp.gpu_count
    if exp.nvlink_pairs and (complete or exp.interconnect == "nvswitch"):
        out += _nvlink_pairs(exp, topo, gpus)
    if exp.rails and complete:
        out += _rails(exp, result.data, gpus)
    if exp.nics and topo.nics:
        # GPUDirect RDMA wants each GPU to have a NIC behind the same PCIe switch (PIX/PXB)
        for g in gpus:
            best = [topo.link(g, n) for n in topo.nics]
            if any(t in ("PIX", "PXB") for t in best):
                continue
            out.append(
                finding(
                    exp,
                    "topology.gpu_nic_affinity",
                    Verdict.WARN,
                    f"{g} has no NIC behind its PCIe switch (best: "
                    f"{', '.join(sorted({t or '?' for t in best}))}); GPUDirect RDMA slows",
                    subject=g,
                    expected="PIX or PXB",
                )
            )
    return out


def _nvlink_pairs(exp: NodeExpectation, topo: Topology, gpus: list[str]) -> list[CheckResult]:
    """``topology.nvlink``: every pair NVLink should join (an NVSwitch board's every pair,
    ``gpus.nvlink_mesh``, the model's 4-GPU board or bridged pairs) shows ``NV<n>`` with at
    least the expected links, both ways. A pair of a GPU topo -m does not list is left to
    ``topology.gpus``, which fails the node already."""
    bad: list[CheckResult] = []
    judged = 0
    for a, b, links in exp.nvlink_pairs:
        ga, gb = f"GPU{a}", f"GPU{b}"
        if ga not in gpus or gb not in gpus:
            continue
        judged += 1
        tokens = [topo.link(ga, gb), topo.link(gb, ga)]
        counts = [int(m.group(1)) if (m := _NV.match(t or "")) else 0 for t in tokens]
        if min(counts) >= links:
            continue
        shown = tokens[0] if counts[0] <= counts[1] else tokens[1]
        bad.append(
            finding(
                exp,
                "topology.nvlink",
                Verdict.FAIL,
                f"{ga}-{gb} is {shown or 'missing'}, expected NV{links}",
                subject=f"{ga}-{gb}",
                measured=shown,
                expected=f"NV{links}",
                source=exp.nvlink_source,
            )
        )
    if bad or not judged:
        return bad
    wanted = {links for _, _, links in exp.nvlink_pairs}
    n = len(gpus)
    if len(exp.nvlink_pairs) == n * (n - 1) // 2 and len(wanted) == 1:
        what = f"every GPU pair is NV{min(wanted)} or better"
    else:
        what = f"all {judged} NVLink pairs have their links ({exp.nvlink_source})"
    expected = f"NV{min(wanted)}" if len(wanted) == 1 else "the mesh"
    return [
        finding(
            exp,
            "topology.nvlink",
            Verdict.OK,
            what,
            measured=expected,
            expected=expected,
        )
    ]


def _rails(exp: NodeExpectation, data: Mapping[str, Any], gpus: list[str]) -> list[CheckResult]:
    """``topology.rail``: each GPU's rail adapter (``nics[].rails``) is the nearest adapter to
    it in topo -m (none nearer by PCIe: PIX, PXB, PHB, NODE, SYS). A rail adapter elsewhere
    means a NIC in another slot, or names shifted (an adapter missing at boot renumbers those
    after it): NCCL's rails then cross the CPU interconnect. Nearest, not PIX: a VM's topology
    (Azure ND) shows NODE for every adapter."""
    by_name = adapter_names(data)
    links: Mapping[str, Mapping[str, str | None]] = data.get("links") or {}
    if not by_name:
        return [
            finding(
                exp,
                "topology.rail",
                Verdict.UNKNOWN,
                "nvidia-smi topo -m names no adapter (no NIC Legend, blank names): the rails "
                "cannot be checked",
            )
        ]
    out: list[CheckResult] = []
    for g, hca in exp.rails:
        gpu = f"GPU{g}"
        if gpu not in gpus:
            continue
        row = links.get(gpu) or {}
        ranked = {name: row.get(col) for name, col in by_name.items() if row.get(col) in PATH_RANK}
        if hca not in ranked:
            out.append(
                finding(
                    exp,
                    "topology.rail",
                    Verdict.UNKNOWN,
                    f"nvidia-smi topo -m shows no PCIe path from {gpu} to its rail adapter {hca}",
                    subject=gpu,
                    expected=hca,
                )
            )
            continue
        best = min(PATH_RANK[str(t)] for t in ranked.values())
        if PATH_RANK[str(ranked[hca])] == best:
            continue
        nearest = sorted(n for n, t in ranked.items() if PATH_RANK[str(t)] == best)
        out.append(
            finding(
                exp,
                "topology.rail",
                Verdict.FAIL,
                f"{gpu}'s rail adapter {hca} is {ranked[hca]} from it, {', '.join(nearest)} "
                f"{ranked[nearest[0]]}: the adapters are not where the rails put them (a NIC "
                "in another slot, or names shifted by a missing adapter)",
                subject=gpu,
                measured=f"{hca} {ranked[hca]}",
                expected=f"{hca} nearest",
                source="cluster.yml (nics[].rails)",
            )
        )
    if not out:
        pairs = ", ".join(f"GPU{g} {hca}" for g, hca in exp.rails if f"GPU{g}" in gpus)
        out.append(
            finding(
                exp,
                "topology.rail",
                Verdict.OK,
                f"each GPU's rail adapter is its nearest ({pairs})",
            )
        )
    return out


# ------------------------------------------------------------------------------------------
# `nvidia-smi topo -p2p r`: which GPU pairs the driver lets read each other's memory

# where every pair must be able to: NVLink (NVSwitch or bridges) promises peer access
_P2P_REQUIRED = ("nvswitch", "nvlink")


@node_judge("topo-p2p")
def judge_p2p_capability(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    """``topology.p2p``: every ordered GPU pair's peer-read status. On NVSwitch and NVLink
    systems a pair that is not OK FAILs (the driver refuses what the hardware promises: NCCL and
    CUDA fall back to copies through host memory); on PCIe systems it WARNs (P2P over PCIe
    depends on the chipset and the GPU). A cell that cannot be read, or a GPU missing from the
    matrix, is UNKNOWN."""
    result, unknown = usable_parse(exp, outputs, ["topo-p2p"], "topology.p2p")
    if result is None:
        return unknown
    p2p = p2p_matrix_of(result.data)
    out = list(unknown)
    expected = [f"GPU{i}" for i in range(exp.gpu_count)]
    missing = [g for g in expected if g not in p2p.gpus]
    unread = sorted({a for (a, _), status in p2p.pairs.items() if status is None})
    if missing or unread:
        what = []
        if missing:
            what.append(f"{', '.join(missing)} not in the matrix")
        if unread:
            what.append(f"unreadable cells in the rows of {', '.join(unread)}")
        out.append(
            finding(
                exp,
                "topology.p2p",
                Verdict.UNKNOWN,
                f"nvidia-smi topo -p2p r: {'; '.join(what)}",
            )
        )
    bad: dict[str, list[str]] = {}
    for (a, b), status in sorted(p2p.pairs.items()):
        if status is not None and status != "OK":
            bad.setdefault(status, []).append(f"{a}->{b}")
    required = exp.interconnect in _P2P_REQUIRED
    for status, pairs in sorted(bad.items()):
        meaning = p2p.legend.get(status, "not in the legend")
        shown = ", ".join(pairs[:8]) + (f" and {len(pairs) - 8} more" if len(pairs) > 8 else "")
        out.append(
            finding(
                exp,
                "topology.p2p",
                Verdict.FAIL if required else Verdict.WARN,
                f"peer reads {status} ({meaning}) for {len(pairs)} GPU pair(s): {shown}"
                + (
                    f"; {exp.interconnect} promises peer access between every pair"
                    if required
                    else ": NCCL copies through host memory for them"
                ),
                measured=len(pairs),
                expected=0,
                unit="pairs",
            )
        )
    if not bad and not out:
        count = len(p2p.pairs)
        out.append(
            finding(exp, "topology.p2p", Verdict.OK, f"peer reads OK for all {count} GPU pairs")
        )
    return out
