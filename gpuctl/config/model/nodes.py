"""Node groups: the nodes, their roles, GPUs, CPUs, memory, adapters and addresses."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from gpuctl.config.model.validation import GroupValidation
from gpuctl.config.nodesets import expand, expand_in_order
from gpuctl.config.types import Name, NodeSetStr, StrictModel


class GpuModel(StrEnum):
    """GPU models gpuctl knows (facts and default thresholds in ``gpuctl/data/gpu_models.yml``)."""

    A100_SXM4_40GB = "a100-sxm4-40gb"
    A100_SXM4_80GB = "a100-sxm4-80gb"
    H100_SXM = "h100-sxm"
    H200_SXM = "h200-sxm"
    B200 = "b200"
    H100_NVL = "h100-nvl"
    L40S = "l40s"
    RTX_6000_ADA = "rtx-6000-ada"


class Interconnect(StrEnum):
    NVSWITCH = "nvswitch"
    NVLINK = "nvlink"
    NVLINK_BRIDGE = "nvlink-bridge"
    PCIE_SWITCH = "pcie-switch"
    PCIE = "pcie"
    NONE = "none"


class NvlinkPair(StrictModel):
    """Two GPUs joined by NVLink and how many links join them."""

    gpus: tuple[Annotated[int, Field(ge=0, le=15)], Annotated[int, Field(ge=0, le=15)]] = Field(
        description="The two GPUs, by index (`nvidia-smi` order), e.g. `[0, 3]`."
    )
    links: int = Field(
        ge=1,
        le=18,
        description="NVLinks between them: `nvidia-smi topo -m` shows `NV<links>` for the pair.",
    )


class Gpus(StrictModel):
    """The GPUs in each node of the group."""

    model: GpuModel = Field(description="GPU model (see the table of models).")
    count: int = Field(ge=1, le=16, description="GPUs per node.")
    interconnect: Interconnect | None = Field(
        None,
        description="How GPUs connect to each other: `nvswitch` (HGX/DGX baseboard), `nvlink` "
        "(direct NVLink, 4-GPU boards), `nvlink-bridge` (PCIe cards in bridged pairs), "
        "`pcie-switch`, `pcie` (CPU root ports), `none` (one GPU). null = derived from the count: "
        "`none` for one GPU, `nvswitch` for a full NVSwitch baseboard, else `nvlink` where the "
        "model has it, else `pcie-switch`.",
    )
    nvlink_mesh: list[NvlinkPair] | None = Field(
        None,
        description="The GPU pairs NVLink joins, for `nvlink` and `nvlink-bridge` (e.g. the "
        "DGX-1 hybrid cube mesh, 4-GPU bridges); validation fails a pair with fewer links. "
        "null = the model's own: every pair of its 4-GPU NVLink board (A100 NV4, H100/H200 "
        "NV6), or bridged pairs 0-1, 2-3, ... (H100 NVL NV12). Pairs not listed are not judged.",
    )
    cpu_affinity: list[Annotated[int, Field(ge=0, le=15)]] | None = Field(
        None,
        description="CPU socket each GPU hangs off, one entry per GPU in `/dev/nvidiaN` order, "
        "e.g. `[0, 0, 0, 0, 1, 1, 1, 1]` (`nvidia-smi topo -m`: NUMA Affinity, on nodes with "
        "one NUMA node per socket). Written to gres.conf as `Cores=`: all cores of that socket, "
        "since Slurm binds GPUs to whole sockets (gres.conf(5)). Required for a compute group "
        "of several sockets unless `slurm.gres_autodetect` is `nvml` (NVML detects it); "
        "null on one socket = no `Cores=`.",
    )


class Cpu(StrictModel):
    """CPU layout of each node, for Slurm's NodeName line."""

    sockets: int = Field(ge=1, le=16, description="CPU sockets.")
    cores_per_socket: int = Field(ge=1, le=1024, description="Physical cores per socket.")
    threads_per_core: int = Field(1, ge=1, le=8, description="Hardware threads per core.")


class Nic(StrictModel):
    """Network adapters of one kind in each node of the group."""

    devices: NodeSetStr = Field(
        description="RDMA device names as a node set, e.g. `mlx5_[0-7]` (as `ibstat` lists them: "
        "letters, digits, `_`, `.`, `-`)."
    )
    fabric: Name = Field(description="Name of the fabric (in `fabrics`) these ports connect to.")
    rate_gbps: int | None = Field(
        None,
        description="Link rate in Gb/s; null = the fabric's rate. Must be a rate the fabric "
        "runs at (NDR: 400 or 200).",
    )
    rails: bool = Field(
        False,
        description="The adapters are rails, one per GPU or per equal share of the GPUs in "
        "order: GPU i uses `devices`' adapter i x adapters / GPUs (rail-optimised servers, "
        "DGX/HGX). Validation then fails a GPU whose rail adapter is not its nearest in "
        "`nvidia-smi topo -m` (a NIC in another slot, names shifted by a missing adapter).",
    )
    ports: list[Annotated[int, Field(ge=1, le=254)]] = Field(
        default_factory=lambda: [1],
        min_length=1,
        description="The ports of each device that are cabled to the fabric, e.g. `[1, 2]`. "
        "On ConnectX-4 and later every port is its own device (port 1); a device with several "
        "ports (ConnectX-3 `mlx4_0`, `Number of ports: 2` in `ibstat`) lists the ports in use. "
        "Validation then judges each port on its own and names it as NCCL does (`mlx4_0:2`). "
        "Ports other than `[1]` are InfiniBand only, without `rails` or the fabric's `ipoib` "
        "(not supported yet), with `software.rdma.stack: inbox` (DOCA-OFED no longer drives "
        "ConnectX-3 or Connect-IB).",
    )


class Role(StrEnum):
    CONTROLLER = "controller"
    LOGIN = "login"
    COMPUTE = "compute"


class GroupSlurm(StrictModel):
    """Slurm settings for the group's NodeName line."""

    features: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]] = Field(
        default_factory=list, description="Node features (constraints), e.g. `[h100, ib]`."
    )
    weight: int | None = Field(None, ge=0, description="Scheduling weight (lower is used first).")


class NodeGroup(StrictModel):
    """Nodes of one shape and purpose."""

    name: Name = Field(description="Group name (becomes the Ansible group `ng_<name>`).")
    nodes: NodeSetStr = Field(description="Host names, e.g. `gpu[001-064]`.")
    addresses: NodeSetStr | None = Field(
        None,
        description="Management addresses as a node set (`10.0.0.[11-74]`), one per node: the "
        "i-th address (in the order written) belongs to the i-th node of `nodes` (in sorted "
        "order). null = reach nodes by name.",
    )
    roles: list[Role] = Field(
        min_length=1, description="`controller`, `login`, `compute` (one or more)."
    )
    gpus: Gpus | None = Field(None, description="GPUs per node; null for CPU-only nodes.")
    cpu: Cpu | None = Field(
        None,
        description="CPU layout (Slurm NodeName); required for compute groups (Slurm reads a "
        "missing one as 1 CPU). null = undeclared.",
    )
    memory_mb: int | None = Field(
        None,
        ge=1,
        description="Memory Slurm may allocate (RealMemory), MiB, at most what `slurmd -C` "
        "reports; required for compute groups (Slurm's default is 1 MiB).",
    )
    nics: list[Nic] = Field(default_factory=list, description="High-speed network adapters.")
    validation: GroupValidation = Field(
        default_factory=lambda: GroupValidation(), description="Validation settings."
    )
    slurm: GroupSlurm = Field(
        default_factory=lambda: GroupSlurm(), description="Slurm node settings."
    )
    bmc_addresses: NodeSetStr | None = Field(
        None,
        description="BMC (Redfish) addresses as a node set, one per node, paired with `nodes` "
        "like `addresses`; needed by `gpuctl rollout` for gpu-firmware and bmc-firmware "
        "(settings in the top-level `bmc`). null = no BMC access.",
    )

    def node_names(self) -> list[str]:
        return expand(self.nodes)

    def address_list(self) -> list[str] | None:
        """Addresses in the order written; the i-th belongs to the i-th name of ``nodes``."""
        return expand_in_order(self.addresses) if self.addresses is not None else None

    def bmc_address_list(self) -> list[str] | None:
        """BMC addresses in the order written; the i-th belongs to the i-th name of ``nodes``."""
        return expand_in_order(self.bmc_addresses) if self.bmc_addresses is not None else None
