"""Topology (``nvidia-smi topo -m``): GPUs listed, NVLink per GPU pair, GPU-NIC PCIe affinity;
and (``nvidia-smi topo -p2p r``) which GPU pairs may read each other's memory."""

from __future__ import annotations

import re
from collections import Counter

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, node_judge, usable_parse
from gpuctl.validation.parsers.topo import p2p_matrix_of, topology_of
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
    if exp.nvlink_token is not None:
        wanted = _NV.match(exp.nvlink_token)
        want = int(wanted.group(1)) if wanted else None
        bad = []
        for a in gpus:
            for b in gpus:
                if a == b:
                    continue
                token = topo.link(a, b)
                m = _NV.match(token or "")
                if token is None or m is None or (want is not None and int(m.group(1)) < want):
                    bad.append((a, b, token))
        for a, b, token in bad:
            if a < b:
                out.append(
                    finding(
                        exp,
                        "topology.nvlink",
                        Verdict.FAIL,
                        f"{a}-{b} is {token or 'missing'}, expected {exp.nvlink_token}",
                        subject=f"{a}-{b}",
                        measured=token,
                        expected=exp.nvlink_token,
                        source="gpu model (data/gpu_models.yml)",
                    )
                )
        if not bad:
            out.append(
                finding(
                    exp,
                    "topology.nvlink",
                    Verdict.OK,
                    f"every GPU pair is {exp.nvlink_token} or better",
                    measured=exp.nvlink_token,
                    expected=exp.nvlink_token,
                )
            )
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
