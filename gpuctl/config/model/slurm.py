"""Slurm: controllers, partitions, cgroup.conf, the node health check and extra slurm.conf keys."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from gpuctl.config.types import AbsPath, Name, NodeSetStr, StrictModel


class Partition(StrictModel):
    """A Slurm partition."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$")] = Field(description="Partition name.")
    node_groups: list[Name] = Field(
        default_factory=list, description="Node groups whose nodes belong to it."
    )
    nodes: NodeSetStr | None = Field(
        None,
        description="More member nodes, as a node set; each must be in a node group with the "
        "`compute` role.",
    )
    default: bool = Field(False, description="The default partition (at most one).")
    max_time: str = Field(
        "INFINITE",
        pattern=r"^(INFINITE|UNLIMITED|\d+|\d+:\d{2}(:\d{2})?|\d+-\d+(:\d{2}(:\d{2})?)?)$",
        description="MaxTime: `INFINITE`, minutes, `HH:MM:SS` or `D-HH:MM:SS`.",
    )
    state: Literal["UP", "DOWN", "DRAIN", "INACTIVE"] = Field("UP", description="Partition state.")


class Cgroup(StrictModel):
    """cgroup.conf."""

    constrain_cores: bool = Field(True, description="ConstrainCores.")
    constrain_devices: bool = Field(True, description="ConstrainDevices (GPU isolation).")
    constrain_ram_space: bool = Field(True, description="ConstrainRAMSpace.")


TaskPlugin = Literal["task/cgroup", "task/affinity", "task/none"]


def _default_task_plugins() -> list[TaskPlugin]:
    return ["task/cgroup", "task/affinity"]


HealthCheckState = Literal["ANY", "ALLOC", "IDLE", "MIXED", "NONDRAINED_IDLE", "CYCLE"]


def _any_state() -> list[HealthCheckState]:
    return ["ANY"]


class HealthCheck(StrictModel):
    """Slurm's node health check: slurmd runs `gpuctl node-check` (HealthCheckProgram) on every
    compute node; a failing node drains itself, and resumes once it passes again."""

    enabled: bool = Field(
        False,
        description="Install gpuctl's node check on the compute nodes (role gpuctl_node_check, "
        "from `package_sources.gpuctl_wheelhouse` or `pypi_index`) and name it in slurm.conf.",
    )
    interval_s: int = Field(
        300, ge=10, le=86400, description="HealthCheckInterval: seconds between two runs."
    )
    node_state: list[HealthCheckState] = Field(
        default_factory=_any_state,
        min_length=1,
        description="HealthCheckNodeState. `ANY` (default) includes drained nodes, so a node "
        "the check drained is resumed when it passes; `NONDRAINED_IDLE` never resumes one.",
    )
    level: Literal["quick"] = Field(
        "quick",
        description="Check level: `quick` (seconds). slurmd ends a health check after 60 s, and "
        "`standard` loads the GPUs for minutes: run it from a prolog or by hand instead.",
    )


class Slurm(StrictModel):
    """Slurm: controller, partitions and what slurm.conf, gres.conf and topology.conf need."""

    controller: str = Field(
        min_length=1,
        description="Node that runs slurmctld; in a node group with the `controller` role.",
    )
    backup_controller: str | None = Field(
        None,
        description="Node that runs a backup slurmctld; in a node group with the `controller` "
        "role.",
    )
    cluster_name: Annotated[str, Field(pattern=r"^[a-z0-9_-]{1,40}$")] | None = Field(
        None, description="ClusterName; null = the cluster's `name`."
    )
    state_save_location: AbsPath = Field(
        "/var/lib/slurm/slurmctld",
        description="StateSaveLocation: the directory where slurmctld keeps its state (the "
        "controller role creates it, owned by SlurmUser). With `backup_controller` it must be "
        "given explicitly, on storage both controllers mount (slurm.conf(5)); gpuctl mounts "
        "nothing.",
    )
    partitions: list[Partition] = Field(min_length=1, description="Partitions.")
    gres_autodetect: Literal["off", "nvml"] = Field(
        "off",
        description="`nvml` needs slurmd built with NVML; `off` lists `/dev/nvidiaN` files.",
    )
    select_type_parameters: Literal["CR_Core", "CR_Core_Memory", "CR_CPU", "CR_CPU_Memory"] = Field(
        "CR_Core_Memory", description="SelectTypeParameters for select/cons_tres."
    )
    proctrack: Literal["cgroup", "linuxproc"] = Field(
        "cgroup", description="ProctrackType plugin (`linuxproc` where cgroups are unavailable)."
    )
    task_plugins: list[TaskPlugin] = Field(
        default_factory=_default_task_plugins,
        description="TaskPlugin list.",
    )
    return_to_service: Literal[0, 1, 2] = Field(
        1, description="ReturnToService (0 never, 1 if down for non-response, 2 any valid)."
    )
    topology_fabric: Name | None = Field(
        None,
        description="Fabric whose topology becomes topology.conf; needed when several have one.",
    )
    cgroup: Cgroup = Field(default_factory=lambda: Cgroup(), description="cgroup.conf settings.")
    health_check: HealthCheck = Field(
        default_factory=lambda: HealthCheck(),
        description="HealthCheckProgram: gpuctl's node check, run by slurmd on every node.",
    )
    extra: dict[Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9]*$")], str | int | bool] = Field(
        default_factory=dict,
        description="More slurm.conf parameters (`Key: value`); keys gpuctl manages are refused.",
    )
