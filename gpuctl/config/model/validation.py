"""Validation settings: levels, thresholds (cluster-wide and per group) and multi-node runs."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from gpuctl.config.types import AbsPath, Percent, StrictModel


# The validation levels: the one definition (probes, bundles, node-check and rollout use it).
# No docstring: pydantic would put it into the JSON schema as the enum's description.
class Level(StrEnum):
    QUICK = "quick"
    STANDARD = "standard"
    LONG = "long"
    # acceptance of new hardware: long, then DCGM r4 and the burn loop for `--duration`
    # (gpuctl/validation/burn.py); asked for on the command line only (rules refuse it here)
    BURN = "burn"


# the level names, in order (quick < standard < long < burn)
LEVELS: tuple[str, ...] = tuple(level.value for level in Level)


class Thresholds(StrictModel):
    """Validation thresholds; unset values are inherited.

    Resolution, last wins: gpuctl defaults (data/health.yml, data/xid.yml), the group's GPU
    model (data/gpu_models.yml), the group's fabric rate (data/fabrics.yml),
    `validation.thresholds`, `node_groups[].validation.thresholds`. ECC and row-remap limits
    count per GPU.
    """

    nccl_all_reduce_busbw_gbs: float | None = Field(
        None, gt=0, description="Minimum single-node all_reduce bus bandwidth, GB/s."
    )
    nccl_all_gather_busbw_gbs: float | None = Field(
        None, gt=0, description="Minimum single-node all_gather bus bandwidth, GB/s."
    )
    nccl_reduce_scatter_busbw_gbs: float | None = Field(
        None, gt=0, description="Minimum single-node reduce_scatter bus bandwidth, GB/s."
    )
    nccl_alltoall_busbw_gbs: float | None = Field(
        None, gt=0, description="Minimum single-node alltoall bus bandwidth, GB/s."
    )
    nccl_sendrecv_busbw_gbs: float | None = Field(
        None, gt=0, description="Minimum single-node sendrecv bus bandwidth, GB/s."
    )
    nccl_multinode_busbw_gbs: float | None = Field(
        None, gt=0, description="Minimum multi-node all_reduce bus bandwidth, GB/s."
    )
    ib_write_bw_gbps: Annotated[float, Field(gt=0)] | Percent | None = Field(
        None,
        description="Minimum ib_write_bw per adapter: Gb/s, or a share of the port's line rate "
        '("90%").',
    )
    ib_write_lat_p99_us: float | None = Field(
        None,
        gt=0,
        description="Maximum 99th percentile of ib_write_lat's 2-byte writes between two "
        "nodes, per adapter, microseconds (run after ib_write_bw at standard and long).",
    )
    pcie_h2d_gbs: float | None = Field(
        None,
        gt=0,
        description="Minimum host-to-device copy bandwidth of each GPU, GB/s (nvbandwidth "
        "host_to_device_memcpy_ce, at standard and long).",
    )
    pcie_d2h_gbs: float | None = Field(
        None,
        gt=0,
        description="Minimum device-to-host copy bandwidth of each GPU, GB/s (nvbandwidth "
        "device_to_host_memcpy_ce, at standard and long).",
    )
    p2p_read_gbs: float | None = Field(
        None,
        gt=0,
        description="Minimum copy bandwidth of each GPU reading from each peer over NVSwitch, "
        "GB/s (nvbandwidth device_to_device_memcpy_read_ce, at standard and long).",
    )
    p2p_write_gbs: float | None = Field(
        None,
        gt=0,
        description="Minimum copy bandwidth of each GPU writing to each peer over NVSwitch, "
        "GB/s (nvbandwidth device_to_device_memcpy_write_ce, at standard and long).",
    )
    fleet_relative_min: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Fail a node below this fraction of the median of its peers: the nodes "
        "of its group (nccl-tests busbw), the HCAs of its fabric at its port rate (ib_write_bw); "
        "a class of fewer than 3 nodes is not judged (a warning).",
    )
    remapped_rows_pending_max: int | None = Field(
        None, ge=0, description='Most row remaps pending per GPU (nvidia-smi "Pending: Yes" is 1).'
    )
    remapped_rows_failure_max: int | None = Field(
        None,
        ge=0,
        description='Most failed row remaps per GPU (nvidia-smi "Remapping Failure Occurred: '
        'Yes" is 1).',
    )
    sram_uncorrectable_max: int | None = Field(
        None, ge=0, description="Most SRAM uncorrectable ECC errors."
    )
    sram_correctable_max: int | None = Field(
        None, ge=0, description="Most SRAM correctable ECC errors."
    )
    dram_correctable_max: int | None = Field(
        None, ge=0, description="Most DRAM correctable ECC errors."
    )
    xid_fatal: list[int] | None = Field(
        None,
        description="Xid codes that fail a node; any other Xid is a warning. Set, it replaces "
        "the default (the isolate, reboot and reset Xids of gpuctl/data/xid.yml).",
    )
    ib_link_flaps_max: int | None = Field(
        None,
        ge=0,
        description="Most link-down events (growth of LinkDownedCounter) per InfiniBand HCA "
        "port during one validation run (standard, long); more fail, up to it warn. Default 0.",
    )
    clock_offset_max_s: float | None = Field(
        None,
        gt=0,
        le=3600,
        description="Most a node's clock may differ from gpuctl's, seconds (`date` on the node "
        "against the times gpuctl sent the command and got its answer; standard, long). "
        "Default 1.",
    )


class Mount(StrictModel):
    """A file system each node must have mounted, judged by `gpuctl validate` at every level
    (check `node.mount`, from `df` on the node): mounted at exactly ``path``, of ``fstype``
    where given, with at least ``min_free_gib`` free where given."""

    path: Literal["/"] | AbsPath = Field(
        description="Mount point, absolute (`/home`, `/scratch`, `/` for the root file system)."
    )
    fstype: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._]{0,31}$")] | None = Field(
        None, description="File system type as `df` shows it (`nfs4`, `lustre`, `xfs`); null = any."
    )
    min_free_gib: float | None = Field(
        None, gt=0, description="Least free space for unprivileged users (`df` Avail), GiB."
    )


def _unique_mounts(mounts: list[Mount]) -> list[Mount]:
    paths = [m.path for m in mounts]
    twice = sorted({p for p in paths if paths.count(p) > 1})
    if twice:
        raise ValueError(f"mount {', '.join(twice)} listed twice")
    return mounts


Mounts = Annotated[list[Mount], AfterValidator(_unique_mounts)]


class Hugepages(StrictModel):
    """The hugepage pool the group's nodes must have reserved (`/proc/meminfo`, check
    `node.hugepages`, standard and long): the default hugepage size and at least so many."""

    size_kib: Literal[2048, 1048576] = Field(
        2048, description="The default hugepage size (`Hugepagesize`), KiB: 2048 or 1048576."
    )
    min_total: int = Field(ge=1, description="Least hugepages of that size (`HugePages_Total`).")


class GroupValidation(StrictModel):
    """Validation settings for one node group."""

    level: Level | None = Field(None, description="Default check level; null = the cluster's.")
    thresholds: Thresholds = Field(
        default_factory=lambda: Thresholds(), description="Overrides for this group."
    )
    mounts: Mounts = Field(
        default_factory=list,
        description="File systems this group's nodes must have, besides `validation.mounts` "
        "(an entry for the same path replaces the cluster-wide one).",
    )
    hugepages: Hugepages | None = Field(
        None,
        description="Hugepages the nodes must have reserved (by the operator's kernel command "
        "line or sysctl; gpuctl does not set them); null = not checked.",
    )


class Multinode(StrictModel):
    """Multi-node nccl-tests at the `long` level: how `srun` starts them (docs/validate.md)."""

    mpi: Literal["pmix", "pmi2", "none"] = Field(
        "pmix",
        description="`srun --mpi=` plugin; nccl-tests built with Open MPI needs `pmix` (the "
        "compute nodes then need the PMIx library; the slurm_node role installs it).",
    )
    partition: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$")] | None = Field(
        None, description="`srun --partition=`; null = Slurm's default partition."
    )
    reservation: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")] | None = Field(
        None, description="`srun --reservation=`, e.g. a maintenance reservation of the nodes."
    )
    rank_per: Literal["gpu", "node"] = Field(
        "gpu",
        description="`gpu`: one rank per GPU (`--ntasks-per-node=<GPUs>`, `-g 1`); `node`: one "
        "rank per node driving all its GPUs (`--ntasks-per-node=1`, `-g <GPUs>`), for nodes "
        "Slurm gives fewer CPUs than GPUs.",
    )
    launch_node: str | None = Field(
        None,
        min_length=1,
        description="Node gpuctl runs `srun` on (over SSH): a login node or any node with the "
        "Slurm client, munge and, for `pmix`, the PMIx library; null = `slurm.controller`.",
    )
    max_runs: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Most runs per node group, the first included; null = 3 x log2(nodes) + 4 "
        "(enough to locate and confirm two slow nodes).",
    )


class Validation(StrictModel):
    """Cluster-wide validation settings."""

    level: Level = Field(Level.STANDARD, description="Default check level.")
    unknown_is_failure: bool = Field(
        True,
        description="A check that could not run or be read (UNKNOWN) fails its node; set false "
        "only to report UNKNOWN without failing (never counted as a pass).",
    )
    thresholds: Thresholds = Field(
        default_factory=lambda: Thresholds(),
        description="Overrides for every group (group overrides win).",
    )
    multinode: Multinode = Field(
        default_factory=lambda: Multinode(),
        description="Multi-node nccl-tests through Slurm (`long` level).",
    )
    mounts: Mounts = Field(
        default_factory=list,
        description="File systems every node must have mounted (`/home`, `/scratch`), with "
        "their type and least free space; judged at every level.",
    )
