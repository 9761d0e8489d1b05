"""Rules that relate several fields of cluster.yml: what a strict schema alone cannot catch.

Each rule appends ``(location, message)`` pairs; the location is the path in the document
(``("node_groups", 1, "gpus", "model")``) so the loader can point at the file's line and column.
All rules run, so one pass reports every problem.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from gpuctl.config.catalog import gpu_spec, ib_rates, roce_rates
from gpuctl.config.values import is_host
from gpuctl.errors import ConfigError, Problem

if TYPE_CHECKING:
    from gpuctl.config.model import Cluster, Fabric

Loc = tuple[str | int, ...]

# slurm.conf keys gpuctl writes itself; `slurm.extra` may not override them (compared lower-case).
_MANAGED = """
ClusterName SlurmctldHost ControlMachine BackupController SlurmUser AuthType StateSaveLocation
SlurmdSpoolDir SlurmctldPidFile SlurmdPidFile SlurmctldPort SlurmdPort ProctrackType TaskPlugin
SelectType SelectTypeParameters GresTypes TopologyPlugin ReturnToService SlurmctldLogFile
SlurmdLogFile SchedulerType NodeName PartitionName PropagateResourceLimitsExcept
PropagateResourceLimits
"""
MANAGED_SLURM_KEYS = frozenset(k.lower() for k in _MANAGED.split())
# written by gpuctl only while slurm.health_check is enabled (else slurm.extra may set them)
HEALTH_CHECK_KEYS = frozenset(
    k.lower() for k in ("HealthCheckProgram", "HealthCheckInterval", "HealthCheckNodeState")
)


def loc_to_str(loc: Sequence[str | int]) -> str:
    """``("node_groups", 1, "gpus")`` -> ``node_groups[1].gpus``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


class RuleViolations(ConfigError):
    """Cross-field rules failed; ``locs`` keeps each problem's path as a tuple."""

    def __init__(self, findings: Sequence[tuple[Loc, str]]) -> None:
        self.findings: tuple[tuple[Loc, str], ...] = tuple(findings)
        super().__init__([Problem(message=m, path=loc_to_str(loc)) for loc, m in self.findings])


def ansible_group_name(prefix: str, name: str) -> str:
    """Ansible group names may not contain dashes."""
    return f"{prefix}_{name.replace('-', '_')}"


def check_rules(cluster: Cluster) -> None:
    """Raise :class:`RuleViolations` listing every broken rule (nothing when all hold)."""
    out: list[tuple[Loc, str]] = []
    nodes = _node_index(cluster, out)
    _addresses(cluster, out)
    _gpus(cluster, out)
    _software(cluster, out)
    _fabrics(cluster, nodes, out)
    _slurm(cluster, nodes, out)
    _slurm_source(cluster, out)
    _ssh(cluster, out)
    _rollout(cluster, nodes, out)
    _group_name_collisions(cluster, out)
    _thresholds_not_enforced(cluster, out)
    _rails_not_supported(cluster, out)
    if out:
        raise RuleViolations(out)


# Thresholds the model has but no judge reads yet (tests/unit/test_no_dead_settings.py): a set
# value is refused rather than silently ignored. fleet_relative_min is read cluster-wide only.
UNENFORCED_THRESHOLDS = (
    "ib_write_lat_p99_us",
    "pcie_h2d_gbs",
    "pcie_d2h_gbs",
    "remapped_rows_failure_max",
    "xid_fatal",
    "ib_link_flaps_max",
)


def _thresholds_not_enforced(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
    places: list[tuple[Loc, Any, tuple[str, ...]]] = [
        (("validation", "thresholds"), cluster.validation.thresholds, UNENFORCED_THRESHOLDS)
    ]
    for i, group in enumerate(cluster.node_groups):
        places.append(
            (
                ("node_groups", i, "validation", "thresholds"),
                group.validation.thresholds,
                (*UNENFORCED_THRESHOLDS, "fleet_relative_min"),
            )
        )
    for loc, thresholds, keys in places:
        for key in keys:
            if getattr(thresholds, key) is not None:
                where = "per node group" if key == "fleet_relative_min" else "by any check"
                out.append(
                    (
                        (*loc, key),
                        f"not enforced yet: no check reads {key} {where}; remove it"
                        + (
                            " (validation.thresholds.fleet_relative_min is)"
                            if key == "fleet_relative_min"
                            else ""
                        ),
                    )
                )


def _rails_not_supported(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
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


_NODE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_SHOWN = 5  # names quoted in one message; the rest are counted


def _dupes(items: Iterable[tuple[str, Loc]], what: str, out: list[tuple[Loc, str]]) -> None:
    seen: dict[str, Loc] = {}
    for value, loc in items:
        if value in seen:
            out.append((loc, f"{what} {value!r} is already used at {loc_to_str(seen[value])}"))
        else:
            seen[value] = loc


def _node_index(cluster: Cluster, out: list[tuple[Loc, str]]) -> dict[str, int]:
    """Map node name -> index of its group; report names used twice."""
    _dupes(
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
            shown = ", ".join(repr(n[:64]) for n in bad[:_SHOWN])
            more = f" and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
            what = "is not a valid host name" if len(bad) == 1 else "are not valid host names"
            out.append((("node_groups", i, "nodes"), f"{shown}{more} {what}"))
        for other, names in clashes.items():
            other_name = cluster.node_groups[other].name
            out.append(
                (
                    ("node_groups", i, "nodes"),
                    f"{_fold(names)} already in node_groups[{other}] ({other_name}); "
                    "node names must be unique across groups",
                )
            )
    return owner


def _fold(names: Iterable[str]) -> str:
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(list(names)))


def _addresses(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
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
    _dupes(seen, "address", out)
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
    _dupes(bmcs, "BMC address", out)


def _gpus(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
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


def _software(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
    sw = cluster.software
    drv = sw.driver
    if not re.fullmatch(r"\d{3}", drv.branch):
        out.append(
            (
                ("software", "driver", "branch"),
                f'driver branch is three digits like "570", not "{drv.branch}"',
            )
        )
    if not re.fullmatch(r"\d{3}\.\d{2,3}(\.\d{2,3})?", drv.version):
        out.append(
            (
                ("software", "driver", "version"),
                f'"{drv.version}" is not a driver version like "570.133.20"',
            )
        )
    elif not drv.version.startswith(drv.branch + "."):
        out.append(
            (
                ("software", "driver", "version"),
                f"driver {drv.version} is not on branch {drv.branch}",
            )
        )
    for i, group in enumerate(cluster.node_groups):
        if group.gpus is None:
            continue
        spec = gpu_spec(group.gpus.model.value)
        have = _version_key(drv.version)
        need = _version_key(spec.min_driver) if spec.min_driver else None
        if have is not None and need is not None and have < need:
            out.append(
                (
                    ("software", "driver", "version"),
                    f"{group.gpus.model.value} GPUs (node_groups[{i}]) need driver "
                    f"{spec.min_driver} or later, not {drv.version}",
                )
            )
        if spec.open_modules == "required" and drv.kernel_modules.value != "open":
            out.append(
                (
                    ("software", "driver", "kernel_modules"),
                    f"{group.gpus.model.value} GPUs (node_groups[{i}]) need open kernel modules",
                )
            )
    fm = sw.fabric_manager
    nvswitch = has_nvswitch(cluster)
    if nvswitch:
        if fm.enabled is False:
            out.append(
                (
                    ("software", "fabric_manager", "enabled"),
                    "NVSwitch GPUs need Fabric Manager; without it CUDA fails with error 802",
                )
            )
        if fm.version is not None and fm.version != drv.version:
            out.append(
                (
                    ("software", "fabric_manager", "version"),
                    f"Fabric Manager {fm.version} must equal the driver version {drv.version} "
                    "exactly, or it refuses to start",
                )
            )
    elif fm.enabled is True or fm.version is not None:
        field = "enabled" if fm.enabled is True else "version"
        out.append(
            (
                ("software", "fabric_manager", field),
                "Fabric Manager is only for NVSwitch systems; no node group has NVSwitch GPUs",
            )
        )
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)-(\d+)\+cuda(\d+\.\d+)", sw.nccl)
    if m is None:
        out.append(
            (
                ("software", "nccl"),
                f'"{sw.nccl}" is not an NCCL package version like "2.26.2-1+cuda12.8"',
            )
        )
    elif m.group(5) != sw.cuda:
        out.append(
            (
                ("software", "nccl"),
                f"NCCL {sw.nccl} is built for CUDA {m.group(5)}, but software.cuda is {sw.cuda}",
            )
        )
    rdma = sw.rdma
    if rdma.stack.value == "doca-ofed" and rdma.doca_version is None:
        out.append((("software", "rdma", "doca_version"), "doca-ofed needs doca_version"))
    if rdma.stack.value == "inbox" and rdma.doca_version is not None:
        out.append(
            (("software", "rdma", "doca_version"), "doca_version is only used with doca-ofed")
        )
    mpi = sw.mpi
    if mpi.flavor.value == "hpcx" and (mpi.version is None or mpi.url is None):
        out.append((("software", "mpi"), "hpcx needs version and url"))


def _version_key(version: str) -> tuple[int, ...] | None:
    """``570.133.20`` -> (570, 133, 20); None when it is not all numbers."""
    parts = version.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


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


def _fabrics(cluster: Cluster, nodes: dict[str, int], out: list[tuple[Loc, str]]) -> None:
    _dupes(
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
                        "InfiniBand fabrics need a generation (edr, hdr, ndr or xdr)",
                    )
                )
            if fab.qos is not None:
                out.append(((*base, "qos"), "qos (PFC/ECN/DSCP) applies to RoCE fabrics only"))
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
            for dev in _expand(nic.devices):
                seen_devices.append((dev, (*loc, "devices")))
            nic_fab = by_name.get(nic.fabric)
            if nic_fab is None:
                out.append(
                    (
                        (*loc, "fabric"),
                        f"no fabric named {nic.fabric!r} in fabrics" + _choices(by_name),
                    )
                )
                continue
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
        _dupes(seen_devices, "device", out)

    for i, fab in enumerate(cluster.fabrics):
        topo = fab.topology
        if topo is None:
            continue
        on_leaf: set[str] = set()
        for leaf in topo.leaves:
            on_leaf.update(_expand(leaf.nodes))
        missing = sorted(users[fab.name] - on_leaf)
        if missing:
            out.append(
                (
                    ("fabrics", i, "topology", "leaves"),
                    f"{_fold(missing)} have adapters on {fab.name} but hang off no leaf",
                )
            )
        for li, leaf in enumerate(topo.leaves):
            strays = [n for n in _expand(leaf.nodes) if n in nodes and n not in users[fab.name]]
            if strays:
                out.append(
                    (
                        ("fabrics", i, "topology", "leaves", li, "nodes"),
                        f"{_fold(strays)} hang off {leaf.name} but have no adapter on {fab.name}",
                    )
                )


def _rates(rates: Sequence[int]) -> str:
    return " or ".join(str(r) for r in rates)


def _choices(names: Iterable[str]) -> str:
    names = sorted(names)
    return f"; defined: {', '.join(names)}" if names else "; none is defined"


def _expand(nodeset: str) -> list[str]:
    from gpuctl.config.nodesets import expand

    return expand(nodeset)


def _topology(cluster: Cluster, fi: int, nodes: dict[str, int], out: list[tuple[Loc, str]]) -> None:
    fab = cluster.fabrics[fi]
    topo = fab.topology
    assert topo is not None  # noqa: S101 - caller checked
    base: Loc = ("fabrics", fi, "topology")
    names: list[tuple[str, Loc]] = [
        (leaf.name, (*base, "leaves", i, "name")) for i, leaf in enumerate(topo.leaves)
    ] + [(sp.name, (*base, "spines", i, "name")) for i, sp in enumerate(topo.spines)]
    _dupes(names, "switch name", out)
    leaf_of: dict[str, str] = {}
    for li, leaf in enumerate(topo.leaves):
        loc: Loc = (*base, "leaves", li, "nodes")
        unknown = [n for n in _expand(leaf.nodes) if n not in nodes]
        if unknown:
            out.append((loc, f"{_fold(unknown)} not defined in any node group"))
        twice = [n for n in _expand(leaf.nodes) if n in leaf_of]
        for n in twice:
            out.append((loc, f"{n} already hangs off {leaf_of[n]}; a node connects to one leaf"))
        for n in _expand(leaf.nodes):
            leaf_of.setdefault(n, leaf.name)

    switch_names = {leaf.name for leaf in topo.leaves} | {sp.name for sp in topo.spines}
    children: dict[str, list[str]] = {}
    for si, sp in enumerate(topo.spines):
        loc = (*base, "spines", si, "switches")
        below = _expand(sp.switches)
        unknown = [s for s in below if s not in switch_names]
        if unknown:
            out.append((loc, f"{_fold(unknown)} not defined as leaves or spines of {fab.name}"))
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


def _slurm(cluster: Cluster, nodes: dict[str, int], out: list[tuple[Loc, str]]) -> None:
    slurm = cluster.slurm
    roles = roles_of(cluster)
    for key in ("controller", "backup_controller"):
        host = getattr(slurm, key)
        if host is None:
            continue
        if host not in nodes:
            out.append((("slurm", key), f"{host!r} is not a node of the cluster"))
        elif "controller" not in roles[host]:
            out.append((("slurm", key), f"{host} is in a node group without the controller role"))
    if slurm.backup_controller is not None and slurm.backup_controller == slurm.controller:
        out.append((("slurm", "backup_controller"), "the backup controller is the controller"))
    if slurm.backup_controller is not None and "state_save_location" not in slurm.model_fields_set:
        out.append(
            (
                ("slurm", "backup_controller"),
                "a backup controller resumes from the state the primary saved: slurm.conf(5) "
                "needs StateSaveLocation readable and writable by both controllers; set "
                "slurm.state_save_location to a directory on storage both mount (gpuctl mounts "
                "nothing; the default /var/lib/slurm/slurmctld is local to each)",
            )
        )
    _slurm_nodes(cluster, out)
    if not any("controller" in r for r in roles.values()):
        out.append((("node_groups",), "no node group has the controller role"))
    if not any("compute" in r for r in roles.values()):
        out.append((("node_groups",), "no node group has the compute role"))

    group_names = {g.name: g for g in cluster.node_groups}
    _dupes(
        ((p.name, ("slurm", "partitions", i, "name")) for i, p in enumerate(slurm.partitions)),
        "partition name",
        out,
    )
    defaults = [i for i, p in enumerate(slurm.partitions) if p.default]
    for i in defaults[1:]:
        out.append(
            (
                ("slurm", "partitions", i, "default"),
                f"partitions[{defaults[0]}] is already the default partition",
            )
        )
    for i, part in enumerate(slurm.partitions):
        base: Loc = ("slurm", "partitions", i)
        members: list[str] = []
        for gi, gname in enumerate(part.node_groups):
            group = group_names.get(gname)
            if group is None:
                out.append(
                    (
                        (*base, "node_groups", gi),
                        f"no node group named {gname!r}" + _choices(group_names),
                    )
                )
            else:
                members.extend(group.node_names())
        if part.nodes is not None:
            listed = _expand(part.nodes)
            unknown = [n for n in listed if n not in nodes]
            if unknown:
                out.append(((*base, "nodes"), f"{_fold(unknown)} not defined in any node group"))
            members.extend(n for n in listed if n in nodes)
        if not part.node_groups and part.nodes is None:
            out.append((base, "a partition needs node_groups or nodes"))
        not_compute = sorted({n for n in members if n in roles and "compute" not in roles[n]})
        if not_compute:
            out.append((base, f"{_fold(not_compute)} run no slurmd (no compute role)"))

    if slurm.topology_fabric is not None:
        chosen = next((f for f in cluster.fabrics if f.name == slurm.topology_fabric), None)
        if chosen is None:
            out.append(
                (
                    ("slurm", "topology_fabric"),
                    f"no fabric named {slurm.topology_fabric!r}"
                    + _choices(f.name for f in cluster.fabrics),
                )
            )
        elif chosen.topology is None:
            out.append((("slurm", "topology_fabric"), f"fabric {chosen.name} has no topology"))
    elif len([f for f in cluster.fabrics if f.topology is not None]) > 1:
        out.append(
            (
                ("slurm", "topology_fabric"),
                "several fabrics have a topology; name the one for topology.conf",
            )
        )
    for key in slurm.extra:
        if key.lower() in MANAGED_SLURM_KEYS:
            out.append(
                (
                    ("slurm", "extra", key),
                    f"{key} is written by gpuctl from other fields; it cannot be overridden",
                )
            )
        elif slurm.health_check.enabled and key.lower() in HEALTH_CHECK_KEYS:
            out.append(
                (
                    ("slurm", "extra", key),
                    f"{key} is written from slurm.health_check, which is enabled",
                )
            )
    src = cluster.package_sources
    if slurm.health_check.enabled and src.gpuctl_wheelhouse is None and src.pypi_index is None:
        out.append(
            (
                ("slurm", "health_check", "enabled"),
                "the nodes install gpuctl from package_sources.gpuctl_wheelhouse (a directory "
                "of wheels, copied to them) or package_sources.pypi_index (a site mirror): "
                "set one",
            )
        )


def _slurm_source(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
    """package_sources.slurm: the version is pinned (the preflight gate reads it before the
    Slurm roles add the repository, and every node gets the same one)."""
    source = cluster.package_sources.slurm
    if source is None:
        return
    version = cluster.software.slurm
    if version is None:
        out.append(
            (
                ("package_sources", "slurm"),
                "a Slurm repository needs software.slurm (the version to install): the "
                "preflight gate checks it against the nodes' cgroup version before the "
                "repository is added, and every node must get the same version",
            )
        )


def _slurm_nodes(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
    """What each compute group's NodeName and gres.conf lines need to describe the hardware."""
    nvml = cluster.slurm.gres_autodetect == "nvml"
    for i, group in enumerate(cluster.node_groups):
        base: Loc = ("node_groups", i)
        compute = any(r.value == "compute" for r in group.roles)
        if compute and group.cpu is None:
            out.append(
                (
                    (*base, "cpu"),
                    "compute nodes need cpu (sockets, cores_per_socket, threads_per_core): "
                    "without it slurm.conf's NodeName line leaves Slurm at 1 CPU per node",
                )
            )
        if compute and group.memory_mb is None:
            out.append(
                (
                    (*base, "memory_mb"),
                    "compute nodes need memory_mb (RealMemory, at most what `slurmd -C` "
                    "reports): Slurm's default is 1 MiB, which with CR_*_Memory and "
                    "ConstrainRAMSpace gives every job a 1 MiB memory limit",
                )
            )
        gpus = group.gpus
        if gpus is None:
            continue
        loc: Loc = (*base, "gpus", "cpu_affinity")
        affinity = gpus.cpu_affinity
        if affinity is not None:
            if nvml:
                out.append(
                    (
                        loc,
                        "slurm.gres_autodetect nvml detects each GPU's cores; leave "
                        "cpu_affinity out or set gres_autodetect off",
                    )
                )
            if len(affinity) != gpus.count:
                out.append(
                    (loc, f"{len(affinity)} entries for {gpus.count} GPUs; give one per GPU")
                )
            if group.cpu is None:
                out.append((loc, "cpu_affinity names sockets: declare cpu (sockets, cores)"))
            else:
                beyond = sorted({s for s in affinity if s >= group.cpu.sockets})
                if beyond:
                    out.append(
                        (
                            loc,
                            f"socket {', '.join(map(str, beyond))} does not exist: the nodes have "
                            f"{group.cpu.sockets} (numbered from 0)",
                        )
                    )
        elif compute and not nvml and group.cpu is not None and group.cpu.sockets > 1:
            out.append(
                (
                    (*base, "gpus"),
                    f"each GPU of a {group.cpu.sockets}-socket node hangs off one socket: give "
                    "gpus.cpu_affinity (the socket of each GPU, e.g. from `nvidia-smi topo -m`) "
                    "or set slurm.gres_autodetect: nvml; without either gres.conf has no Cores= "
                    "and Slurm gives jobs CPUs far from their GPUs",
                )
            )


def _ssh(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
    if cluster.ssh.user != "root" and not cluster.ssh.become:
        out.append(
            (
                ("ssh", "become"),
                f"provisioning needs root: user {cluster.ssh.user} must become root (sudo)",
            )
        )


def _rollout(cluster: Cluster, nodes: dict[str, int], out: list[tuple[Loc, str]]) -> None:
    ro = cluster.rollout
    if ro.batch_size is not None and ro.max_unavailable is not None:
        out.append((("rollout", "max_unavailable"), "give batch_size or max_unavailable, not both"))
    compute = sum(1 for r in roles_of(cluster).values() if "compute" in r)
    if compute and ro.canary > compute:
        out.append(
            (
                ("rollout", "canary"),
                f"canary of {ro.canary} nodes, but the cluster has {compute} compute nodes",
            )
        )
    if isinstance(ro.max_unavailable, int) and ro.max_unavailable < 1:
        out.append((("rollout", "max_unavailable"), "max_unavailable must be at least 1"))


def _group_name_collisions(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
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
