"""Rules on Slurm: controllers, partitions, the topology fabric, slurm.conf keys gpuctl manages,
the health check's install source, and what each compute group's NodeName line needs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuctl.config.facts import roles_of
from gpuctl.config.findings import Loc
from gpuctl.config.nodesets import expand
from gpuctl.config.rules.common import choices, dupes, fold

if TYPE_CHECKING:
    from gpuctl.config.model import Cluster

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


def check_slurm(cluster: Cluster, nodes: dict[str, int], out: list[tuple[Loc, str]]) -> None:
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
    dupes(
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
                        f"no node group named {gname!r}" + choices(group_names),
                    )
                )
            else:
                members.extend(group.node_names())
        if part.nodes is not None:
            listed = expand(part.nodes)
            unknown = [n for n in listed if n not in nodes]
            if unknown:
                out.append(((*base, "nodes"), f"{fold(unknown)} not defined in any node group"))
            members.extend(n for n in listed if n in nodes)
        if not part.node_groups and part.nodes is None:
            out.append((base, "a partition needs node_groups or nodes"))
        not_compute = sorted({n for n in members if n in roles and "compute" not in roles[n]})
        if not_compute:
            out.append((base, f"{fold(not_compute)} run no slurmd (no compute role)"))

    if slurm.topology_fabric is not None:
        chosen = next((f for f in cluster.fabrics if f.name == slurm.topology_fabric), None)
        if chosen is None:
            out.append(
                (
                    ("slurm", "topology_fabric"),
                    f"no fabric named {slurm.topology_fabric!r}"
                    + choices(f.name for f in cluster.fabrics),
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
