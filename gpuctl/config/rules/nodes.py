"""Rules on node groups: unique valid node names, addresses, GPUs, rails, Ansible group names."""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING

from gpuctl.config.catalog import gpu_spec
from gpuctl.config.facts import effective_interconnect, nvlink_pairs, rail_nics
from gpuctl.config.findings import Loc
from gpuctl.config.nodesets import expand
from gpuctl.config.rules.common import SHOWN, dupes, fold
from gpuctl.config.values import is_host

if TYPE_CHECKING:
    from gpuctl.config.model import Cluster, Gpus

_NODE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def node_index(cluster: Cluster, out: list[tuple[Loc, str]]) -> dict[str, int]:
    """Map node name -> index of its group; report names used twice."""
    dupes(
        ((g.name, ("node_groups", i, "name")) for i, g in enumerate(cluster.node_groups)),
        "node group name",
        out,
    )
    owner: dict[str, int] = {}
    for i, group in enumerate(cluster.node_groups):
        clashes: dict[int, list[str]] = {}
        bad: list[str] = []
        for node in group.node_names():
            if node in owner:
                clashes.setdefault(owner[node], []).append(node)
            else:
                owner[node] = i
            if not _NODE_NAME.fullmatch(node):
                bad.append(node)
        if bad:
            shown = ", ".join(repr(n[:64]) for n in bad[:SHOWN])
            more = f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
            what = "is not a valid host name" if len(bad) == 1 else "are not valid host names"
            out.append((("node_groups", i, "nodes"), f"{shown}{more} {what}"))
        for other, names in clashes.items():
            other_name = cluster.node_groups[other].name
            out.append(
                (
                    ("node_groups", i, "nodes"),
                    f"{fold(names)} already in node_groups[{other}] ({other_name}); "
                    "node names must be unique across groups",
                )
            )
    return owner


def check_addresses(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
    seen: list[tuple[str, Loc]] = []
    for i, group in enumerate(cluster.node_groups):
        addrs = group.address_list()
        if addrs is None:
            continue
        loc: Loc = ("node_groups", i, "addresses")
        n_nodes = len(group.node_names())
        if len(addrs) != n_nodes:
            out.append((loc, f"{len(addrs)} addresses for {n_nodes} nodes; give one per node"))
        for addr in addrs:
            try:
                ipaddress.ip_address(addr)
            except ValueError:
                out.append((loc, f"{addr!r} is not an IP address"))
            seen.append((addr, loc))
    dupes(seen, "address", out)
    bmcs: list[tuple[str, Loc]] = []
    for i, group in enumerate(cluster.node_groups):
        addrs = group.bmc_address_list()
        if addrs is None:
            continue
        loc = ("node_groups", i, "bmc_addresses")
        n_nodes = len(group.node_names())
        if len(addrs) != n_nodes:
            out.append((loc, f"{len(addrs)} BMC addresses for {n_nodes} nodes; give one per node"))
        for addr in addrs:
            if not is_host(addr):
                out.append((loc, f"{addr!r} is neither an IP address nor a host name"))
            bmcs.append((addr, loc))
    dupes(bmcs, "BMC address", out)


def check_gpus(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
    for i, group in enumerate(cluster.node_groups):
        gpus = group.gpus
        if gpus is None:
            continue
        base: Loc = ("node_groups", i, "gpus")
        spec = gpu_spec(gpus.model.value)
        if gpus.count > spec.max_per_node:
            out.append(
                (
                    (*base, "count"),
                    f"{gpus.model.value} servers hold at most {spec.max_per_node} GPUs, "
                    f"not {gpus.count}",
                )
            )
        ic = effective_interconnect(gpus.model.value, gpus.count, gpus.interconnect)
        ic_loc: Loc = (*base, "interconnect") if gpus.interconnect is not None else base
        if ic not in spec.interconnects:
            out.append(
                (
                    ic_loc,
                    f"{gpus.model.value} GPUs do not connect by {ic}; "
                    f"expected one of: {', '.join(spec.interconnects)}",
                )
            )
            continue
        if ic == "nvswitch" and gpus.count != spec.nvswitch_gpus:
            out.append(
                (
                    (*base, "count"),
                    f"an NVSwitch baseboard of {gpus.model.value} has {spec.nvswitch_gpus} GPUs, "
                    f"not {gpus.count}",
                )
            )
        if ic == "none" and gpus.count != 1:
            out.append((ic_loc, f"interconnect none means one GPU, but count is {gpus.count}"))
        if ic != "none" and gpus.count == 1:
            out.append((ic_loc, f"a single GPU has no {ic} interconnect; use none"))
        if ic == "nvlink-bridge" and gpus.count % 2 and gpus.nvlink_mesh is None:
            out.append((ic_loc, f"NVLink bridges join GPUs in pairs; count {gpus.count} is odd"))
        _check_mesh(gpus, ic, base, out)


def _check_mesh(gpus: Gpus, ic: str, base: Loc, out: list[tuple[Loc, str]]) -> None:
    """``gpus.nvlink_mesh``: only where GPUs connect by NVLink without NVSwitch; pairs of two
    GPUs the node has, each once. Without it, ``nvlink`` and ``nvlink-bridge`` need a board the
    model has (its 4-GPU board, its bridged pairs)."""
    loc: Loc = (*base, "nvlink_mesh")
    if gpus.nvlink_mesh is None:
        if nvlink_pairs(gpus) is None:
            board = gpu_spec(gpus.model.value).nvlink_board
            known = f" (its NVLink board has {board[0]} GPUs)" if board else ""
            out.append(
                (
                    base,
                    f"gpuctl knows no {ic} board of {gpus.count} {gpus.model.value} GPUs"
                    f"{known}: list the NVLink pairs in nvlink_mesh",
                )
            )
        return
    if ic not in ("nvlink", "nvlink-bridge"):
        out.append(
            (
                loc,
                f"nvlink_mesh describes nvlink and nvlink-bridge GPUs, not {ic}"
                + (" (NVSwitch joins every pair)" if ic == "nvswitch" else ""),
            )
        )
        return
    seen: set[tuple[int, int]] = set()
    for k, pair in enumerate(gpus.nvlink_mesh):
        a, b = pair.gpus
        where: Loc = (*loc, k, "gpus")
        if a == b:
            out.append((where, f"GPU {a} paired with itself"))
        elif max(a, b) >= gpus.count:
            out.append((where, f"GPU {max(a, b)} is not one of the {gpus.count} GPUs (0-based)"))
        elif (min(a, b), max(a, b)) in seen:
            out.append((where, f"the pair {min(a, b)}-{max(a, b)} is listed twice"))
        seen.add((min(a, b), max(a, b)))


def check_rails(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
    """nics[].rails: a group with GPUs, and adapters (of each fabric, all rails entries
    together) that the GPUs share evenly: as many, a divisor or a multiple of the GPU count."""
    for i, group in enumerate(cluster.node_groups):
        flagged = [j for j, nic in enumerate(group.nics) if nic.rails]
        if not flagged:
            continue
        loc: Loc = ("node_groups", i, "nics", flagged[0], "rails")
        if group.gpus is None:
            out.append((loc, "rails pair adapters with GPUs; this group has no GPUs"))
        elif not rail_nics(group):
            count: dict[str, int] = {}
            for j in flagged:
                nic = group.nics[j]
                count[nic.fabric] = count.get(nic.fabric, 0) + len(expand(nic.devices))
            shown = ", ".join(f"{n} on {f}" for f, n in count.items())
            out.append(
                (
                    loc,
                    f"{shown} rail adapters cannot be shared evenly by {group.gpus.count} GPUs "
                    "(give as many adapters, a divisor or a multiple of the GPU count)",
                )
            )


def check_group_name_collisions(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
    """Names that differ only by - and _ would become the same Ansible group."""
    kinds: list[list[tuple[str, Loc]]] = [
        [(g.name, ("node_groups", i, "name")) for i, g in enumerate(cluster.node_groups)],
        [(f.name, ("fabrics", i, "name")) for i, f in enumerate(cluster.fabrics)],
    ]
    for fi, fab in enumerate(cluster.fabrics):
        if fab.topology is not None:
            kinds.append(
                [
                    (leaf.name, ("fabrics", fi, "topology", "leaves", li, "name"))
                    for li, leaf in enumerate(fab.topology.leaves)
                ]
            )
    for items in kinds:
        first: dict[str, str] = {}
        for name, loc in items:
            key = name.replace("-", "_")
            if key in first and first[key] != name:
                out.append(
                    (
                        loc,
                        f"{name!r} and {first[key]!r} would be the same Ansible group "
                        f"({key}); rename one",
                    )
                )
            first.setdefault(key, name)
