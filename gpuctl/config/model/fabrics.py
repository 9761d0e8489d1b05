"""High-speed fabrics: InfiniBand subnets and RoCE fabrics, with their switch trees."""

from __future__ import annotations

import ipaddress
from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from gpuctl.config.types import Name, NodeSetStr, StrictModel


class FabricKind(StrEnum):
    INFINIBAND = "infiniband"
    ROCE = "roce"


class IbGeneration(StrEnum):
    FDR = "fdr"
    EDR = "edr"
    HDR = "hdr"
    NDR = "ndr"
    XDR = "xdr"


class SubnetManager(StrEnum):
    SWITCH = "switch"
    OPENSM = "opensm"


class RoceQos(StrictModel):
    """Lossless RoCE settings (NVIDIA's recommended defaults)."""

    trust: Literal["dscp", "pcp"] = Field("dscp", description="QoS trust mode.")
    pfc_priority: int = Field(3, ge=0, le=7, description="Priority with PFC enabled.")
    dscp: int = Field(26, ge=0, le=63, description="DSCP value for RoCE traffic.")
    ecn: bool = Field(True, description="ECN / DCQCN congestion control.")


class Ipoib(StrictModel):
    """IP over InfiniBand addressing."""

    network: str = Field(description="IPv4 network for IPoIB interfaces, e.g. `10.10.0.0/16`.")

    @model_validator(mode="after")
    def _network(self) -> Ipoib:
        try:
            ipaddress.IPv4Network(self.network, strict=True)
        except ValueError as exc:
            raise ValueError(f"not an IPv4 network: {exc}") from None
        return self


class Leaf(StrictModel):
    """A leaf (edge) switch and the nodes cabled to it."""

    name: Name = Field(description="Switch name (as in topology.conf).")
    nodes: NodeSetStr = Field(description="Nodes that hang off this leaf.")


class Spine(StrictModel):
    """A spine switch and the switches below it."""

    name: Name = Field(description="Switch name (as in topology.conf).")
    switches: NodeSetStr = Field(
        description="Leaves (or lower spines) below it, e.g. `leaf[01-04]`."
    )


class Topology(StrictModel):
    """The fabric's switch tree, for Slurm's topology.conf."""

    kind: Literal["fat-tree"] = Field("fat-tree", description="Only `fat-tree` for now.")
    leaves: list[Leaf] = Field(min_length=1, description="Leaf switches.")
    spines: list[Spine] = Field(default_factory=list, description="Spine (and core) switches.")


class Fabric(StrictModel):
    """One high-speed network (InfiniBand subnet or RoCE fabric)."""

    name: Name = Field(description="Fabric name, referenced by `nics[].fabric`.")
    kind: FabricKind = Field(description="`infiniband` or `roce`.")
    generation: IbGeneration | None = Field(
        None,
        description="InfiniBand generation (`fdr`, `edr`, `hdr`, `ndr`, `xdr`); InfiniBand only.",
    )
    rate_gbps: int | None = Field(
        None,
        description="Port rate in Gb/s. InfiniBand: null = the generation's full rate. "
        "RoCE: required (100, 200 or 400).",
    )
    subnet_manager: SubnetManager | None = Field(
        None,
        description="InfiniBand only: `switch` (managed switch) or `opensm` on a node; null = "
        "an SM already runs elsewhere and gpuctl installs none.",
    )
    ipoib: Ipoib | None = Field(None, description="InfiniBand only: IPoIB addressing.")
    qos: RoceQos | None = Field(None, description="RoCE only: lossless settings (PFC/ECN/DSCP).")
    gid_index: int | None = Field(
        None,
        ge=0,
        le=255,
        description="RoCE only: the GID table index ib_write_bw (`-x`) and NCCL "
        "(`NCCL_IB_GID_INDEX`) use; on a routed RoCE v2 fabric the RoCE v2 GID of the "
        "adapter's IPv4 address (often 3 on mlx5: `show_gids`). Null: each tool picks its own.",
    )
    topology: Topology | None = Field(
        None, description="Switch tree; null for a single node or when not modelled."
    )
