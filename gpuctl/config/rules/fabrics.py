"""Rules on fabrics: kinds and rates, RoCE QoS, adapters on fabrics, and each switch tree."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpuctl.config.facts import allowed_rates, multiport_devices
from gpuctl.config.findings import Loc
from gpuctl.config.model.fabrics import Fabric, FabricKind
from gpuctl.config.model.nodes import Nic
from gpuctl.config.model.software import RdmaStack
from gpuctl.config.nodesets import expand
from gpuctl.config.rules.common import choices, dupes, fold

if TYPE_CHECKING:
    from gpuctl.config.model import Cluster


# an RDMA device's name as the kernel gives it (mlx5_0, ibp12s0, rocep1s0f0, mlx5_bond_0, irdma0,
# bnxt_re0): it names commands' arguments and the bundle's output files (never a path)
_DEVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_fabrics(cluster: Cluster, nodes: dict[str, int], out: list[tuple[Loc, str]]) -> None:
    dupes(
        ((f.name, ("fabrics", i, "name")) for i, f in enumerate(cluster.fabrics)),
        "fabric name",
        out,
    )
    by_name = {f.name: f for f in cluster.fabrics}
    for i, fab in enumerate(cluster.fabrics):
        base: Loc = ("fabrics", i)
        if fab.kind.value == "infiniband":
            if fab.generation is None:
                out.append(
                    (
                        (*base, "generation"),
                        "InfiniBand fabrics need a generation (fdr, edr, hdr, ndr or xdr)",
                    )
                )
            if fab.qos is not None:
                out.append(((*base, "qos"), "qos (PFC/ECN/DSCP) applies to RoCE fabrics only"))
            if fab.gid_index is not None:
                out.append(
                    (
                        (*base, "gid_index"),
                        "gid_index applies to RoCE fabrics only (InfiniBand addresses by LID)",
                    )
                )
        else:
            if fab.generation is not None:
                out.append(
                    (
                        (*base, "generation"),
                        "generation is for InfiniBand; RoCE fabrics give rate_gbps",
                    )
                )
            if fab.rate_gbps is None:
                out.append(((*base, "rate_gbps"), "RoCE fabrics need rate_gbps (100, 200 or 400)"))
            for key in ("subnet_manager", "ipoib"):
                if getattr(fab, key) is not None:
                    out.append(((*base, key), f"{key} applies to InfiniBand fabrics only"))
            # With trust dscp the NIC maps DSCP to priority by its default table, dscp >> 3
            # (26 -> 3); NCCL (NCCL_IB_TC) and RDMA-CM send with qos.dscp, and only
            # qos.pfc_priority is lossless
            qos = fab.qos
            if qos is not None and qos.trust == "dscp" and qos.dscp >> 3 != qos.pfc_priority:
                out.append(
                    (
                        (*base, "qos", "dscp"),
                        f"dscp {qos.dscp} maps to priority {qos.dscp >> 3} (the default "
                        f"DSCP-to-priority map is dscp >> 3), not pfc_priority "
                        f"{qos.pfc_priority}: RoCE traffic would ride a lossy class; pick a dscp "
                        f"from {qos.pfc_priority * 8} to {qos.pfc_priority * 8 + 7}",
                    )
                )
        allowed = allowed_rates(fab)
        if fab.rate_gbps is not None and allowed and fab.rate_gbps not in allowed:
            kind = fab.generation.value.upper() if fab.generation else "RoCE"
            out.append(
                (
                    (*base, "rate_gbps"),
                    f"{kind} runs at {_rates(allowed)} Gb/s, not {fab.rate_gbps}",
                )
            )
        if fab.topology is not None:
            _topology(cluster, i, nodes, out)

    users: dict[str, set[str]] = {f.name: set() for f in cluster.fabrics}
    for gi, group in enumerate(cluster.node_groups):
        seen_devices: list[tuple[str, Loc]] = []
        for ni, nic in enumerate(group.nics):
            loc: Loc = ("node_groups", gi, "nics", ni)
            names = expand(nic.devices)
            bad = [d for d in names if not _DEVICE.fullmatch(d)]
            if bad:
                shown = ", ".join(repr(d[:64]) for d in bad[:3])
                what = (
                    "is not an RDMA device name" if len(bad) == 1 else "are not RDMA device names"
                )
                out.append(
                    (
                        (*loc, "devices"),
                        f"{shown} {what} (as ibstat lists them: letters, digits, _ . -; a port "
                        "goes in ports)",
                    )
                )
            for dev in names:
                seen_devices.extend(
                    (dev if p == 1 else f"{dev} port {p}", (*loc, "devices")) for p in nic.ports
                )
            dupes(((str(p), (*loc, "ports")) for p in nic.ports), "port", out)
            nic_fab = by_name.get(nic.fabric)
            if nic_fab is None:
                out.append(
                    (
                        (*loc, "fabric"),
                        f"no fabric named {nic.fabric!r} in fabrics" + choices(by_name),
                    )
                )
                continue
            out += _ports(nic, nic_fab, cluster.software.rdma.stack, loc)
            users[nic_fab.name].update(group.node_names())
            allowed = allowed_rates(nic_fab)
            if nic.rate_gbps is not None and allowed and nic.rate_gbps not in allowed:
                out.append(
                    (
                        (*loc, "rate_gbps"),
                        f"fabric {nic_fab.name} ({nic_fab.kind.value}) runs at "
                        f"{_rates(allowed)} Gb/s, "
                        f"not {nic.rate_gbps}",
                    )
                )
        dupes(seen_devices, "device", out)
        several = multiport_devices(group)
        for ni, nic in enumerate(group.nics):
            shared = sorted(several & set(expand(nic.devices)))
            if nic.rails and shared and nic.ports == [1]:
                out.append(
                    (
                        ("node_groups", gi, "nics", ni, "rails"),
                        f"rails with {', '.join(shared)} listed with other ports too: "
                        "not supported yet",
                    )
                )

    for i, fab in enumerate(cluster.fabrics):
        topo = fab.topology
        if topo is None:
            continue
        on_leaf: set[str] = set()
        for leaf in topo.leaves:
            on_leaf.update(expand(leaf.nodes))
        missing = sorted(users[fab.name] - on_leaf)
        if missing:
            out.append(
                (
                    ("fabrics", i, "topology", "leaves"),
                    f"{fold(missing)} have adapters on {fab.name} but hang off no leaf",
                )
            )
        for li, leaf in enumerate(topo.leaves):
            strays = [n for n in expand(leaf.nodes) if n in nodes and n not in users[fab.name]]
            if strays:
                out.append(
                    (
                        ("fabrics", i, "topology", "leaves", li, "nodes"),
                        f"{fold(strays)} hang off {leaf.name} but have no adapter on {fab.name}",
                    )
                )


def _ports(nic: Nic, fabric: Fabric, stack: RdmaStack, loc: Loc) -> list[tuple[Loc, str]]:
    """Ports other than 1: InfiniBand only, without rails or IPoIB (gpuctl sets those up per
    device: the rails' GPU-to-adapter affinity, the IPoIB netdev, RoCE's QoS per netdev), and
    not with DOCA-OFED, which no longer drives such devices."""
    if nic.ports == [1]:
        return []
    where = (*loc, "ports")
    unserved = [
        why
        for why, applies in (
            ("a RoCE fabric", fabric.kind is FabricKind.ROCE),
            ("rails", nic.rails),
            (f"fabric {fabric.name}'s ipoib", fabric.ipoib is not None),
        )
        if applies
    ]
    out: list[tuple[Loc, str]] = []
    if unserved:
        out.append((where, f"ports other than [1] with {unserved[0]}: not supported yet"))
    if stack is RdmaStack.DOCA_OFED:
        out.append(
            (
                where,
                "devices with several ports (ConnectX-3, ConnectX-3 Pro, Connect-IB) are not "
                "driven by DOCA-OFED (MLNX_OFED 5.1 and later dropped them, its release notes): "
                "use software.rdma.stack inbox",
            )
        )
    return out


def _rates(rates: Sequence[int]) -> str:
    return " or ".join(str(r) for r in rates)


def _topology(cluster: Cluster, fi: int, nodes: dict[str, int], out: list[tuple[Loc, str]]) -> None:
    fab = cluster.fabrics[fi]
    topo = fab.topology
    assert topo is not None  # noqa: S101 - caller checked
    base: Loc = ("fabrics", fi, "topology")
    names: list[tuple[str, Loc]] = [
        (leaf.name, (*base, "leaves", i, "name")) for i, leaf in enumerate(topo.leaves)
    ] + [(sp.name, (*base, "spines", i, "name")) for i, sp in enumerate(topo.spines)]
    dupes(names, "switch name", out)
    leaf_of: dict[str, str] = {}
    for li, leaf in enumerate(topo.leaves):
        loc: Loc = (*base, "leaves", li, "nodes")
        unknown = [n for n in expand(leaf.nodes) if n not in nodes]
        if unknown:
            out.append((loc, f"{fold(unknown)} not defined in any node group"))
        twice = [n for n in expand(leaf.nodes) if n in leaf_of]
        for n in twice:
            out.append((loc, f"{n} already hangs off {leaf_of[n]}; a node connects to one leaf"))
        for n in expand(leaf.nodes):
            leaf_of.setdefault(n, leaf.name)

    switch_names = {leaf.name for leaf in topo.leaves} | {sp.name for sp in topo.spines}
    children: dict[str, list[str]] = {}
    for si, sp in enumerate(topo.spines):
        loc = (*base, "spines", si, "switches")
        below = expand(sp.switches)
        unknown = [s for s in below if s not in switch_names]
        if unknown:
            out.append((loc, f"{fold(unknown)} not defined as leaves or spines of {fab.name}"))
        if sp.name in below:
            out.append((loc, f"{sp.name} lists itself"))
        children[sp.name] = [s for s in below if s in switch_names and s != sp.name]

    # cycles and a common root: Slurm cannot place a job across switches with no common parent
    parents: dict[str, set[str]] = {}
    for parent, kids in children.items():
        for kid in kids:
            parents.setdefault(kid, set()).add(parent)
    state: dict[str, int] = {}

    def visit(sw: str) -> bool:
        if state.get(sw) == 1:
            return False
        if state.get(sw) == 2:
            return True
        state[sw] = 1
        ok = all(visit(k) for k in children.get(sw, []))
        state[sw] = 2
        return ok

    if not all(visit(sw) for sw in sorted(children)):
        out.append(((*base, "spines"), "the switch tree has a cycle"))
        return
    roots = sorted(s for s in switch_names if s not in parents)
    if len(roots) > 1:
        out.append(
            (
                (*base, "spines") if topo.spines else (*base, "leaves"),
                f"switches {', '.join(roots)} have no common spine; Slurm could not place a job "
                "across them (add a spine that connects them)",
            )
        )
