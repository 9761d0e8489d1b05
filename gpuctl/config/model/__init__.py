"""The cluster.yml model: pydantic v2, strict about unknown keys, documented field by field.

This package is the model's public face: the root :class:`Cluster` is defined here, and every
other model and enum is re-exported from the module of its area: ``access`` (ssh, package
sources), ``software``, ``nodes`` (node groups), ``fabrics``, ``slurm``, ``validation`` (levels,
thresholds, multi-node runs) and ``rollout`` (rollout defaults, BMC access). Field types that
several areas share (versions, names, node sets, URLs) are in ``gpuctl.config.types``.

Structure and types are checked here; rules that relate several fields to each other live in
``gpuctl.config.rules`` and run from the root model's after-validator, so that every path to a
``Cluster`` (the loader, ``Cluster.model_validate``) enforces them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from gpuctl.config.findings import RuleViolations
from gpuctl.config.model.access import JumpHost, PackageSources, SlurmSource, Ssh
from gpuctl.config.model.fabrics import (
    Fabric,
    FabricKind,
    IbGeneration,
    Ipoib,
    Leaf,
    RoceQos,
    Spine,
    SubnetManager,
    Topology,
)
from gpuctl.config.model.nodes import (
    Cpu,
    GpuModel,
    Gpus,
    GroupSlurm,
    Interconnect,
    Nic,
    NodeGroup,
    NvlinkPair,
    Role,
)
from gpuctl.config.model.rollout import Bmc, BmcCredentials, Rollout
from gpuctl.config.model.slurm import (
    Cgroup,
    HealthCheck,
    HealthCheckState,
    Partition,
    Slurm,
    TaskPlugin,
)
from gpuctl.config.model.software import (
    Driver,
    FabricManager,
    KernelModules,
    Mpi,
    MpiFlavor,
    Rdma,
    RdmaStack,
    Software,
)
from gpuctl.config.model.validation import (
    LEVELS,
    GroupValidation,
    Level,
    Multinode,
    Thresholds,
    Validation,
)
from gpuctl.config.nodesets import MAX_CLUSTER_NODES, MAX_NODESET, estimated_size
from gpuctl.config.rules import check_rules
from gpuctl.config.types import StrictModel
from gpuctl.config.values import unsafe_values

SCHEMA_VERSION = 1

__all__ = [
    "LEVELS",
    "SCHEMA_VERSION",
    "Bmc",
    "BmcCredentials",
    "Cgroup",
    "Cluster",
    "Cpu",
    "Driver",
    "Fabric",
    "FabricKind",
    "FabricManager",
    "GpuModel",
    "Gpus",
    "GroupSlurm",
    "GroupValidation",
    "HealthCheck",
    "HealthCheckState",
    "IbGeneration",
    "Interconnect",
    "Ipoib",
    "JumpHost",
    "KernelModules",
    "Leaf",
    "Level",
    "Mpi",
    "MpiFlavor",
    "Multinode",
    "Nic",
    "NodeGroup",
    "NvlinkPair",
    "PackageSources",
    "Partition",
    "Rdma",
    "RdmaStack",
    "RoceQos",
    "Role",
    "Rollout",
    "Slurm",
    "SlurmSource",
    "Software",
    "Spine",
    "Ssh",
    "SubnetManager",
    "TaskPlugin",
    "Thresholds",
    "Topology",
    "Validation",
]


class Cluster(StrictModel):
    """A GPU cluster: the one file every gpuctl command reads."""

    schema_version: Literal[1] = Field(1, description="Version of this file's schema (1).")
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,39}$")] = Field(
        description="Cluster name (lower case, digits, dashes)."
    )
    ssh: Ssh = Field(default_factory=lambda: Ssh(), description="SSH access.")
    package_sources: PackageSources = Field(
        default_factory=lambda: PackageSources(), description="Package repositories."
    )
    software: Software = Field(description="Pinned software versions.")
    fabrics: list[Fabric] = Field(
        default_factory=list, description="High-speed fabrics (empty for a single node)."
    )
    node_groups: list[NodeGroup] = Field(min_length=1, description="Groups of nodes.")
    slurm: Slurm = Field(description="Slurm settings.")
    validation: Validation = Field(
        default_factory=lambda: Validation(), description="Validation defaults."
    )
    rollout: Rollout = Field(default_factory=lambda: Rollout(), description="Rollout defaults.")
    bmc: Bmc = Field(
        default_factory=lambda: Bmc(),
        description="Redfish access to the BMCs named by `node_groups[].bmc_addresses`.",
    )

    @model_validator(mode="before")
    @classmethod
    def _data_not_code(cls, data: Any) -> Any:
        """Before any field is read: refuse unsafe strings, and clusters too big to expand."""
        if not isinstance(data, dict):
            return data
        findings = unsafe_values(data)
        groups = data.get("node_groups")
        if isinstance(groups, list):
            sizes = [
                estimated_size(g["nodes"].strip())
                for g in groups
                if isinstance(g, dict) and isinstance(g.get("nodes"), str)
            ]
            total = sum(sizes)
            # one set over MAX_NODESET is named by its own field's check, more precisely
            if total > MAX_CLUSTER_NODES and max(sizes) <= MAX_NODESET:
                findings.append(
                    (
                        ("node_groups",),
                        f"the node groups name about {total} nodes in all; gpuctl handles at "
                        f"most {MAX_CLUSTER_NODES} nodes in one cluster.yml",
                    )
                )
        if findings:
            raise RuleViolations(findings)
        return data

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Cluster:
        check_rules(self)
        return self
