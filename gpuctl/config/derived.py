"""Views derived from a validated Cluster: nodes, effective thresholds, `check`'s summary."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpuctl.config.catalog import (
    default_fatal_xids,
    gpu_spec,
    health_defaults,
    ib_rates,
    roce_rates,
)
from gpuctl.config.facts import effective_interconnect, fabric_rate, has_nvswitch
from gpuctl.config.model import Cluster, Fabric, NodeGroup, Thresholds
from gpuctl.config.rules.settings import NCCL_BUSBW_KEYS, THRESHOLD_CHECKS


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    group: str
    roles: tuple[str, ...]
    address: str | None
    bmc_address: str | None = None


def nodes(cluster: Cluster) -> list[Node]:
    """Every node, in the order of the file (groups in order, names in node-set order)."""
    out: list[Node] = []
    for group in cluster.node_groups:
        names = group.node_names()
        given = group.address_list()
        addrs: list[str | None] = list(given) if given else [None] * len(names)
        bmc = group.bmc_address_list()
        bmcs: list[str | None] = list(bmc) if bmc else [None] * len(names)
        roles = tuple(r.value for r in group.roles)
        out.extend(
            Node(n, group.name, roles, a, b) for n, a, b in zip(names, addrs, bmcs, strict=True)
        )
    return out


@dataclass(frozen=True, slots=True)
class ThresholdValue:
    value: Any
    source: str
    checked_by: tuple[str, ...] = ()  # the checks whose verdict it decides (THRESHOLD_CHECKS)


def effective_thresholds(cluster: Cluster, group: NodeGroup, gi: int) -> dict[str, ThresholdValue]:
    """Each threshold a check reads, for one group: its value, where it comes from (group >
    cluster > fabric > GPU model > gpuctl defaults) and the checks that read it. Keys no check
    reads yet (UNENFORCED_THRESHOLDS, refused when set) are not listed."""
    values: dict[str, ThresholdValue] = {}
    for key, value in health_defaults().items():
        values[key] = ThresholdValue(value, "gpuctl default (data/health.yml)")
    values.setdefault("xid_fatal", ThresholdValue(list(default_fatal_xids()), _XID_SOURCE))
    if group.gpus is not None:
        spec = gpu_spec(group.gpus.model.value)
        for key, value in spec.thresholds.items():
            values[key] = ThresholdValue(value, f"gpu model {spec.key} (data/gpu_models.yml)")
    floor = _ib_write_bw_floor(cluster, group)
    if floor is not None:
        values["ib_write_bw_gbps"] = floor
    for key in Thresholds.model_fields:
        values.setdefault(key, ThresholdValue(None, "not set"))
    for source, th in (
        ("validation.thresholds", cluster.validation.thresholds),
        (f"node_groups[{gi}].validation.thresholds", group.validation.thresholds),
    ):
        for key, value in th.model_dump(exclude_none=True).items():
            values[key] = ThresholdValue(value, source)
    return {
        key: ThresholdValue(v.value, v.source, THRESHOLD_CHECKS[key])
        for key, v in sorted(values.items())
        if key in THRESHOLD_CHECKS
    }


_XID_SOURCE = "gpuctl default (data/xid.yml: the isolate, reboot and reset actions)"


def _ib_write_bw_floor(cluster: Cluster, group: NodeGroup) -> ThresholdValue | None:
    fabrics = {f.name: f for f in cluster.fabrics}
    floors: list[tuple[float, str]] = []
    for nic in group.nics:
        fab = fabrics.get(nic.fabric)
        if fab is None:
            continue
        rate = nic.rate_gbps or fabric_rate(fab)
        if rate is None:
            continue
        spec = roce_rates() if fab.generation is None else ib_rates()[fab.generation.value]
        if rate in spec.ib_write_bw_gbps:
            how = "derived 0.9 x line rate" if spec.derived else "Azure/azurehpc-health-checks"
            kind = fab.generation.value.upper() if fab.generation else "RoCE"
            source = f"fabric {fab.name} ({kind}) at {rate} Gb/s ({how})"
            floors.append((spec.ib_write_bw_gbps[rate], source))
    if not floors:
        return None
    value, source = min(floors)
    return ThresholdValue(value, source)


@dataclass(frozen=True, slots=True)
class GroupSummary:
    name: str
    roles: tuple[str, ...]
    nodes: str
    node_count: int
    gpu_model: str | None
    gpus_per_node: int
    interconnect: str | None
    nics: tuple[str, ...]
    validation_level: str
    thresholds: dict[str, ThresholdValue]


@dataclass(frozen=True, slots=True)
class FabricSummary:
    name: str
    kind: str
    generation: str | None
    rate_gbps: int | None
    leaves: int
    spines: int
    nodes: int


@dataclass(frozen=True, slots=True)
class ClusterSummary:
    name: str
    node_count: int
    nodes_by_role: dict[str, int]
    gpu_count: int
    gpus_by_model: dict[str, int]
    groups: tuple[GroupSummary, ...]
    fabrics: tuple[FabricSummary, ...]
    versions: dict[str, str | None]
    controller: str
    partitions: tuple[str, ...]
    fabric_manager: bool
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        """Stable keys for ``gpuctl check --json``."""
        return {
            "name": self.name,
            "node_count": self.node_count,
            "nodes_by_role": self.nodes_by_role,
            "gpu_count": self.gpu_count,
            "gpus_by_model": self.gpus_by_model,
            "controller": self.controller,
            "partitions": list(self.partitions),
            "fabric_manager": self.fabric_manager,
            "versions": self.versions,
            "groups": [
                {
                    "name": g.name,
                    "roles": list(g.roles),
                    "nodes": g.nodes,
                    "node_count": g.node_count,
                    "gpu_model": g.gpu_model,
                    "gpus_per_node": g.gpus_per_node,
                    "interconnect": g.interconnect,
                    "nics": list(g.nics),
                    "validation_level": g.validation_level,
                    "thresholds": {
                        k: {"value": v.value, "source": v.source, "checked_by": list(v.checked_by)}
                        for k, v in g.thresholds.items()
                    },
                }
                for g in self.groups
            ],
            "fabrics": [
                {
                    "name": f.name,
                    "kind": f.kind,
                    "generation": f.generation,
                    "rate_gbps": f.rate_gbps,
                    "leaves": f.leaves,
                    "spines": f.spines,
                    "nodes": f.nodes,
                }
                for f in self.fabrics
            ],
            "warnings": list(self.warnings),
        }


def summarize(cluster: Cluster) -> ClusterSummary:
    all_nodes = nodes(cluster)
    by_role: Counter[str] = Counter()
    for node in all_nodes:
        for role in node.roles:
            by_role[role] += 1
    gpus: Counter[str] = Counter()
    groups: list[GroupSummary] = []
    for gi, group in enumerate(cluster.node_groups):
        count = len(group.node_names())
        model = group.gpus.model.value if group.gpus else None
        per_node = group.gpus.count if group.gpus else 0
        if model is not None:
            gpus[model] += per_node * count
        groups.append(
            GroupSummary(
                name=group.name,
                roles=tuple(r.value for r in group.roles),
                nodes=group.nodes,
                node_count=count,
                gpu_model=model,
                gpus_per_node=per_node,
                interconnect=(
                    effective_interconnect(model, per_node, group.gpus.interconnect)
                    if group.gpus and model
                    else None
                ),
                nics=tuple(
                    f"{n.devices}{'' if n.ports == [1] else ':' + ','.join(map(str, n.ports))}"
                    f"@{n.fabric}"
                    for n in group.nics
                ),
                validation_level=(group.validation.level or cluster.validation.level).value,
                thresholds=effective_thresholds(cluster, group, gi),
            )
        )
    sw = cluster.software
    versions: dict[str, str | None] = {
        "driver": sw.driver.version,
        "driver_branch": sw.driver.branch,
        "kernel_modules": sw.driver.kernel_modules.value,
        "fabric_manager": sw.driver.version if has_nvswitch(cluster) else None,
        "cuda": sw.cuda,
        "nccl": sw.nccl,
        "nccl_tests": sw.nccl_tests,
        "dcgm": sw.dcgm,
        "rdma": sw.rdma.stack.value + (f" {sw.rdma.doca_version}" if sw.rdma.doca_version else ""),
        "mpi": sw.mpi.flavor.value + (f" {sw.mpi.version}" if sw.mpi.version else ""),
        "slurm": sw.slurm or "distribution",
    }
    warnings = [
        f"node_groups[{gi}] ({g.name}): no {key} threshold for {g.gpu_model or 'this group'}; "
        "set one under validation.thresholds or the check judges fleet-relative only"
        for gi, g in enumerate(groups)
        for key in NCCL_BUSBW_KEYS
        if g.gpu_model is not None and g.gpus_per_node > 1 and g.thresholds[key].value is None
    ]
    return ClusterSummary(
        name=cluster.name,
        node_count=len(all_nodes),
        nodes_by_role=dict(sorted(by_role.items())),
        gpu_count=sum(gpus.values()),
        gpus_by_model=dict(sorted(gpus.items())),
        groups=tuple(groups),
        fabrics=tuple(_fabric_summary(cluster, f) for f in cluster.fabrics),
        versions=versions,
        controller=cluster.slurm.controller,
        partitions=tuple(p.name for p in cluster.slurm.partitions),
        fabric_manager=has_nvswitch(cluster),
        warnings=tuple(warnings),
    )


def _fabric_summary(cluster: Cluster, fab: Fabric) -> FabricSummary:
    members = {
        n
        for g in cluster.node_groups
        if any(x.fabric == fab.name for x in g.nics)
        for n in g.node_names()
    }
    return FabricSummary(
        name=fab.name,
        kind=fab.kind.value,
        generation=fab.generation.value if fab.generation else None,
        rate_gbps=fabric_rate(fab),
        leaves=len(fab.topology.leaves) if fab.topology else 0,
        spines=len(fab.topology.spines) if fab.topology else 0,
        nodes=len(members),
    )


def split_top_level(text: str) -> list[str]:
    """Split a --limit on commas outside brackets: ``gpu[001-004],ng_ctl`` -> two pieces."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]
