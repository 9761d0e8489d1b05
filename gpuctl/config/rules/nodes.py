"""Rules on node groups: unique valid node names, addresses, GPUs, rails, Ansible group names."""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING

from gpuctl.config.catalog import gpu_spec
from gpuctl.config.facts import effective_interconnect
from gpuctl.config.findings import Loc
from gpuctl.config.rules.common import SHOWN, dupes, fold
from gpuctl.config.values import is_host

if TYPE_CHECKING:
    from gpuctl.config.model import Cluster

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
        if ic == "nvlink-bridge" and gpus.count % 2:
            out.append((ic_loc, f"NVLink bridges join GPUs in pairs; count {gpus.count} is odd"))


def check_no_rails(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
    """nics[].rails is refused: no role, file or check reads a rail numbering yet (ib_write_bw
    pairs a node's HCAs with its peer's by index either way)."""
    for i, group in enumerate(cluster.node_groups):
        for j, nic in enumerate(group.nics):
            if nic.rails:
                out.append(
                    (
                        ("node_groups", i, "nics", j, "rails"),
                        "not supported yet: nothing reads a rail numbering (the ib_write_bw "
                        "pairs match HCAs by index either way); remove it",
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
