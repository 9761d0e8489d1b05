"""What each node should look like, derived from cluster.yml (the judges' expectations)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuctl.config.catalog import gpu_spec
from gpuctl.config.derived import effective_thresholds
from gpuctl.config.facts import (
    effective_interconnect,
    fabric_rate,
    multiport_devices,
    nvlink_pairs,
    rail_nics,
)
from gpuctl.config.model import (
    Cluster,
    Fabric,
    FabricKind,
    KernelModules,
    NodeGroup,
    RdmaStack,
    RoceQos,
    Role,
)
from gpuctl.validation.gpudirect import DMABUF, PEERMEM


@dataclass(frozen=True, slots=True)
class ExpectedNic:
    device: str
    fabric: str
    kind: str  # infiniband | roce
    rate_gbps: int | None
    # RoCE: the GID index ib_write_bw uses (-x; None: perftest's own choice) and the traffic
    # class it sends with (--tclass: DSCP << 2, the lossless class the roce_qos role sets up)
    gid_index: int | None = None
    traffic_class: int | None = None
    # the port of the device (``nics[].ports``): 1 on ConnectX-4 and later, where each port is
    # its own device; a device with several ports (``mlx4_0``) has one ExpectedNic per port
    port: int = 1
    # whether the name says the port (the device has another port listed, or this is not 1)
    qualified: bool = False

    @property
    def link_layer(self) -> str:
        return "InfiniBand" if self.kind == "infiniband" else "Ethernet"

    @property
    def name(self) -> str:
        """The port as validation names it: its subject, its outputs' kinds, NCCL's notation
        (``NCCL_IB_HCA``: ``mlx4_0:2``), the device alone for a device's only port 1."""
        return port_name(self.device, self.port, self.qualified)

    @property
    def port_subject(self) -> str:
        """The port as the ibstat checks name it: ``mlx5_0/1``."""
        return f"{self.device}/{self.port}"


PORT_SEP = ":"  # NCCL_IB_HCA's and UCX_NET_DEVICES' device:port


def port_name(device: str, port: int = 1, qualified: bool = False) -> str:
    return f"{device}{PORT_SEP}{port}" if qualified or port != 1 else device


def split_port(name: str) -> tuple[str, int]:
    """(device, port) of a port's :attr:`ExpectedNic.name`."""
    device, sep, port = name.rpartition(PORT_SEP)
    if sep and port.isdigit():
        return device, int(port)
    return name, 1


def nic_named(nics: Sequence[ExpectedNic], name: str) -> ExpectedNic | None:
    return next((n for n in nics if n.name == name), None)


@dataclass(frozen=True, slots=True)
class ExpectedMount:
    """A file system the node must have (``validation.mounts``, the group's added)."""

    path: str
    fstype: str | None = None
    min_free_gib: float | None = None


@dataclass(frozen=True, slots=True)
class NodeExpectation:
    node: str
    group: str
    gpu_model: str | None = None
    product_name: str | None = None
    gpu_count: int = 0
    interconnect: str | None = None
    nvlink_token: str | None = None  # what topo -m shows between two GPUs (NV18, NV12)
    # the GPU pairs NVLink joins, (a, b, links) with a < b: every pair of an NVSwitch board,
    # gpus.nvlink_mesh, or the model's NVLink board or bridged pairs; and where that came from
    nvlink_pairs: tuple[tuple[int, int, int], ...] = ()
    nvlink_source: str = ""
    # (GPU index, its rail adapter) for adapters marked nics[].rails
    rails: tuple[tuple[int, str], ...] = ()
    pcie_gen: int | None = None
    driver_version: str | None = None
    fabric_manager: bool = False
    nics: tuple[ExpectedNic, ...] = ()
    level: str = "standard"
    thresholds: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    nccl_version: str | None = None  # software.nccl as pinned ("2.26.2-1+cuda12.8")
    # software.rdma.doca_version where the DOCA-OFED stack is installed (rdma.stack doca-ofed)
    doca_version: str | None = None
    # what gpuctl wrote on the node's NodeName line (compute nodes only: slurmd runs there):
    # (sockets, cores per socket, threads per core) and RealMemory in MiB
    slurm_cpu: tuple[int, int, int] | None = None
    slurm_memory_mb: int | None = None
    mounts: tuple[ExpectedMount, ...] = ()
    # software.mft pinned: the NVIDIA Firmware Tools (mlxlink) are on the node's adapters' hosts
    mft: bool = False
    # node_groups[].validation.hugepages: (default hugepage size in KiB, least number of them)
    hugepages: tuple[int, int] | None = None
    # GPU nodes with DCGM 4 (which ships nvbandwidth): the CUDA major of its package
    # (datacenter-gpu-manager-4-cuda<major>), where the probe finds nvbandwidth
    nvbandwidth_cuda: str | None = None
    # GPUDirect RDMA measured (GPU nodes with RDMA adapters where software.perftest builds
    # perftest with CUDA): how the adapter registers GPU memory, "peermem" (nvidia-peermem, where
    # the rdma role loads it: DOCA-OFED) or "dmabuf" (inbox rdma-core); None: not measured
    gpudirect: str | None = None
    # level burn: how long the burn loop runs, seconds (--duration; gpuctl/validation/burn.py)
    burn_s: int | None = None


def gpudirect_method(cluster: Cluster) -> str | None:
    """How GPUDirect RDMA registers GPU memory on the cluster's GPU nodes with adapters
    (:data:`NodeExpectation.gpudirect`); None where no perftest with CUDA is built."""
    if cluster.software.perftest is None:
        return None
    rdma, modules = cluster.software.rdma, cluster.software.driver.kernel_modules
    # DMA-BUF needs the open kernel modules; with the proprietary ones only nvidia-peermem can
    # (the rdma role loads it with DOCA-OFED, or where an inbox kernel has the peer memory API)
    proprietary = modules is KernelModules.PROPRIETARY
    if rdma.peermem and (rdma.stack is RdmaStack.DOCA_OFED or proprietary):
        return PEERMEM
    return DMABUF


def nvbandwidth_cuda(dcgm_version: str, cuda_version: str) -> str | None:
    """The CUDA major of the DCGM package that ships nvbandwidth (DCGM 4, the one the dcgm
    role installs, built for software.cuda's major); None for a DCGM without it."""
    dcgm_major, cuda_major = dcgm_version.split(".", 1)[0], cuda_version.split(".", 1)[0]
    return cuda_major if dcgm_major == "4" and cuda_major.isdigit() else None


def _roce_addressing(fabric: Fabric) -> tuple[int | None, int | None]:
    """(GID index, traffic class) of a RoCE fabric's ib_write_bw; (None, None) on InfiniBand.
    The traffic class is the IP ToS byte, DSCP << 2, as NCCL_IB_TC in /etc/nccl.conf."""
    if fabric.kind is not FabricKind.ROCE:
        return None, None
    return fabric.gid_index, (fabric.qos or RoceQos()).dscp << 2


def expectations(cluster: Cluster) -> dict[str, NodeExpectation]:
    fabrics = {f.name: f for f in cluster.fabrics}
    rdma = cluster.software.rdma
    doca_version = rdma.doca_version if rdma.stack is RdmaStack.DOCA_OFED else None
    nvb_cuda = nvbandwidth_cuda(cluster.software.dcgm, cluster.software.cuda)
    gdr = gpudirect_method(cluster)
    out: dict[str, NodeExpectation] = {}
    for gi, group in enumerate(cluster.node_groups):
        th = effective_thresholds(cluster, group, gi)
        gpus = group.gpus
        spec = gpu_spec(gpus.model.value) if gpus else None
        ic = (
            effective_interconnect(gpus.model.value, gpus.count, gpus.interconnect)
            if gpus
            else None
        )
        nics = _nics(group, fabrics)
        compute = Role.COMPUTE in group.roles
        pairs = (nvlink_pairs(gpus) or ()) if gpus else ()
        pairs_from = (
            "cluster.yml (gpus.nvlink_mesh)"
            if gpus and gpus.nvlink_mesh is not None
            else "gpu model (data/gpu_models.yml)"
        )
        huge = group.validation.hugepages
        cpu = group.cpu if compute else None
        mounts = {m.path: m for m in cluster.validation.mounts}
        mounts |= {m.path: m for m in group.validation.mounts}  # the group's entry wins
        for node in group.node_names():
            out[node] = NodeExpectation(
                node=node,
                group=group.name,
                gpu_model=spec.key if spec else None,
                product_name=spec.product_name if spec else None,
                gpu_count=gpus.count if gpus else 0,
                interconnect=ic,
                nvlink_token=spec.nvlink_per_pair if spec and ic == "nvswitch" else None,
                nvlink_pairs=pairs,
                nvlink_source=pairs_from if pairs else "",
                rails=rail_nics(group),
                pcie_gen=spec.pcie_gen if spec else None,
                driver_version=cluster.software.driver.version if gpus else None,
                nccl_version=cluster.software.nccl if gpus else None,
                doca_version=doca_version if nics else None,
                fabric_manager=ic == "nvswitch",
                nics=nics,
                level=(group.validation.level or cluster.validation.level).value,
                thresholds={k: v.value for k, v in th.items()},
                sources={k: v.source for k, v in th.items()},
                slurm_cpu=(cpu.sockets, cpu.cores_per_socket, cpu.threads_per_core)
                if cpu
                else None,
                slurm_memory_mb=group.memory_mb if compute else None,
                mft=cluster.software.mft is not None and bool(nics),
                hugepages=(huge.size_kib, huge.min_total) if huge else None,
                nvbandwidth_cuda=nvb_cuda if gpus else None,
                gpudirect=gdr if gpus and nics else None,
                mounts=tuple(
                    ExpectedMount(m.path, m.fstype, m.min_free_gib) for m in mounts.values()
                ),
            )
    return out


def _nics(group: NodeGroup, fabrics: Mapping[str, Fabric]) -> tuple[ExpectedNic, ...]:
    """One per port of each device of the group's ``nics``; a device with several ports
    listed (in one entry or several) names each port with its number."""
    several = multiport_devices(group)
    listed = [
        (nic, dev, port) for nic in group.nics for dev in _expand(nic.devices) for port in nic.ports
    ]
    return tuple(
        ExpectedNic(
            dev,
            nic.fabric,
            fabrics[nic.fabric].kind.value,
            nic.rate_gbps or fabric_rate(fabrics[nic.fabric]),
            *_roce_addressing(fabrics[nic.fabric]),
            port=port,
            qualified=dev in several,
        )
        for nic, dev, port in listed
    )


def _expand(nodeset: str) -> list[str]:
    from gpuctl.config.nodesets import expand

    return expand(nodeset)
