"""Facts that follow from a validated Cluster and that the rules, the renderer and the checks
share: a group's effective interconnect, fabric rates, the topology fabric, roles, group names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuctl.config.catalog import gpu_spec, ib_rates, roce_rates

if TYPE_CHECKING:
    from gpuctl.config.model import Cluster, Fabric


def ansible_group_name(prefix: str, name: str) -> str:
    """Ansible group names may not contain dashes."""
    return f"{prefix}_{name.replace('-', '_')}"


def has_nvswitch(cluster: Cluster) -> bool:
    return any(
        g.gpus is not None
        and effective_interconnect(g.gpus.model.value, g.gpus.count, g.gpus.interconnect)
        == "nvswitch"
        for g in cluster.node_groups
    )


def effective_interconnect(model: str, count: int, interconnect: object | None) -> str:
    """The interconnect as given, or the model's usual one for that GPU count."""
    if interconnect is not None:
        return str(getattr(interconnect, "value", interconnect))
    spec = gpu_spec(model)
    if count == 1:
        return "none"
    if spec.nvswitch_gpus == count:
        return "nvswitch"
    if "nvlink" in spec.interconnects:
        return "nvlink"
    return "pcie-switch" if "pcie-switch" in spec.interconnects else spec.interconnects[0]


def fabric_rate(fabric: Fabric) -> int | None:
    """The fabric's port rate: given, or derived from the InfiniBand generation."""
    if fabric.rate_gbps is not None:
        return fabric.rate_gbps
    if fabric.generation is not None:
        return ib_rates()[fabric.generation.value].rates[0]
    return None


def allowed_rates(fabric: Fabric) -> tuple[int, ...]:
    if fabric.kind.value == "roce":
        return roce_rates().rates
    if fabric.generation is None:
        return ()
    return ib_rates()[fabric.generation.value].rates


def topology_fabric(cluster: Cluster) -> Fabric | None:
    """The fabric whose topology becomes topology.conf (None when none has one)."""
    if cluster.slurm.topology_fabric is not None:
        for fab in cluster.fabrics:
            if fab.name == cluster.slurm.topology_fabric:
                return fab
        return None
    with_topo = [f for f in cluster.fabrics if f.topology is not None]
    return with_topo[0] if len(with_topo) == 1 else None


def roles_of(cluster: Cluster) -> dict[str, set[str]]:
    """Node name -> its roles."""
    roles: dict[str, set[str]] = {}
    for group in cluster.node_groups:
        for node in group.node_names():
            roles.setdefault(node, set()).update(r.value for r in group.roles)
    return roles
