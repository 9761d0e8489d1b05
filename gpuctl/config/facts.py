"""Facts that follow from a validated Cluster and that the rules, the renderer and the checks
share: a group's effective interconnect, fabric rates, the topology fabric, roles, group names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuctl.config.catalog import gpu_spec, ib_rates, roce_rates

if TYPE_CHECKING:
    from gpuctl.config.model import Cluster, Fabric, Gpus, NodeGroup


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


def nvlink_pairs(gpus: Gpus) -> tuple[tuple[int, int, int], ...] | None:
    """The GPU pairs NVLink joins, ``(a, b, links)`` with ``a < b``: every pair of an NVSwitch
    baseboard; ``gpus.nvlink_mesh``; else the model's 4-GPU NVLink board or bridged pairs
    0-1, 2-3, ...; () where no NVLink is expected. None: ``nvlink`` or ``nvlink-bridge`` with no
    mesh given and none the model's own (the rules refuse it)."""
    ic = effective_interconnect(gpus.model.value, gpus.count, gpus.interconnect)
    spec = gpu_spec(gpus.model.value)
    if ic == "nvswitch":
        token = spec.nvlink_per_pair
        if token is None:
            return None
        n = int(token[2:])
        return tuple((a, b, n) for a in range(gpus.count) for b in range(a + 1, gpus.count))
    if ic not in ("nvlink", "nvlink-bridge"):
        return ()
    if gpus.nvlink_mesh is not None:
        return tuple(sorted((min(p.gpus), max(p.gpus), p.links) for p in gpus.nvlink_mesh))
    if ic == "nvlink" and spec.nvlink_board is not None and spec.nvlink_board[0] == gpus.count:
        n = int(spec.nvlink_board[1][2:])
        return tuple((a, b, n) for a in range(gpus.count) for b in range(a + 1, gpus.count))
    if ic == "nvlink-bridge" and spec.nvlink_bridge is not None and gpus.count % 2 == 0:
        n = int(spec.nvlink_bridge[2:])
        return tuple((a, a + 1, n) for a in range(0, gpus.count, 2))
    return None


def rail_nics(group: NodeGroup) -> tuple[tuple[int, str], ...]:
    """``(GPU index, its rail adapter)`` for every GPU of the group and every ``nics`` entry
    marked ``rails`` (adapters of one fabric count on across entries): GPU i uses adapter
    ``i * adapters // GPUs``. () without GPUs or rails, or where the adapters cannot be shared
    evenly (the rules refuse that)."""
    if group.gpus is None:
        return ()
    from gpuctl.config.nodesets import expand_in_order

    by_fabric: dict[str, list[str]] = {}
    for nic in group.nics:
        if nic.rails:
            by_fabric.setdefault(nic.fabric, []).extend(expand_in_order(nic.devices))
    count = group.gpus.count
    out: list[tuple[int, str]] = []
    for devices in by_fabric.values():
        if not devices or (count % len(devices) and len(devices) % count):
            return ()
        out += [(g, devices[g * len(devices) // count]) for g in range(count)]
    return tuple(out)


def multiport_devices(group: NodeGroup) -> set[str]:
    """The group's devices listed with more than one port (over all ``nics`` entries): each of
    their ports is named with its number (``mlx4_0:1``) and served on its own."""
    from gpuctl.config.nodesets import expand

    ports: dict[str, set[int]] = {}
    for nic in group.nics:
        for dev in expand(nic.devices):
            ports.setdefault(dev, set()).update(nic.ports)
    return {dev for dev, listed in ports.items() if len(listed) > 1}


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
