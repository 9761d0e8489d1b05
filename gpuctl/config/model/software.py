"""Pinned software: the driver, Fabric Manager, CUDA, NCCL, DCGM, RDMA, MPI and Slurm versions."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from gpuctl.config.types import StrictModel, Url, Version


class KernelModules(StrEnum):
    OPEN = "open"
    PROPRIETARY = "proprietary"


class Driver(StrictModel):
    """The NVIDIA data center driver."""

    branch: Version = Field(description='Driver branch, e.g. "570" (packages are pinned to it).')
    version: Version = Field(
        description='Exact driver version, e.g. "570.133.20"; must belong to `branch`.'
    )
    kernel_modules: KernelModules = Field(
        KernelModules.OPEN,
        description="`open` (default since R560, required on Blackwell) or `proprietary`.",
    )
    secure_boot_signed: bool = Field(
        False,
        description="The nodes sign the driver's DKMS modules with a key their firmware trusts "
        "(a MOK enrolled, DKMS set to sign). false: a node with Secure Boot on stops before "
        "the driver is installed, since the kernel would refuse the unsigned modules.",
    )


class FabricManager(StrictModel):
    """NVIDIA Fabric Manager: implied on NVSwitch systems, at exactly the driver's version."""

    enabled: bool | None = Field(
        None,
        description="null = installed exactly where GPUs sit on NVSwitch (the normal case). "
        "true/false may only confirm that: false is refused on NVSwitch systems, true without "
        "them.",
    )
    version: Version | None = Field(
        None, description="Must equal `software.driver.version`; null = the driver's version."
    )


class RdmaStack(StrEnum):
    INBOX = "inbox"
    DOCA_OFED = "doca-ofed"


class Rdma(StrictModel):
    """The RDMA user space and drivers."""

    stack: RdmaStack = Field(
        RdmaStack.INBOX, description="`inbox` (distribution rdma-core) or `doca-ofed`."
    )
    doca_version: Version | None = Field(
        None, description='DOCA version, required with `doca-ofed` (e.g. "2.9.1").'
    )
    peermem: bool = Field(
        True,
        description="GPUDirect RDMA through nvidia-peermem: loaded where the kernel has the "
        "peer memory API (DOCA-OFED / MLNX_OFED); with inbox rdma-core GPUDirect RDMA goes "
        "through DMA-BUF instead and provisioning reports that.",
    )


class MpiFlavor(StrEnum):
    OPENMPI = "openmpi"
    HPCX = "hpcx"


class Mpi(StrictModel):
    """MPI used to build and launch nccl-tests."""

    flavor: MpiFlavor = Field(MpiFlavor.OPENMPI, description="`openmpi` (distribution) or `hpcx`.")
    version: Version | None = Field(None, description="Version (required for `hpcx`).")
    url: Url | None = Field(None, description="Download URL of the HPC-X tarball (for `hpcx`).")


class Software(StrictModel):
    """Pinned versions of everything gpuctl installs. Drift between them breaks clusters."""

    driver: Driver = Field(description="NVIDIA driver branch, version and kernel modules.")
    fabric_manager: FabricManager = Field(
        default_factory=lambda: FabricManager(), description="Fabric Manager."
    )
    cuda: Version = Field(description='CUDA toolkit version, major.minor, e.g. "12.8".')
    nccl: Version = Field(
        description='NCCL package version as the CUDA repository names it: "2.26.2-1+cuda12.8".'
    )
    nccl_tests: Version = Field(description='nccl-tests release tag without the v, e.g. "2.14.1".')
    dcgm: Version = Field(description='DCGM version, e.g. "4.2.3".')
    perftest: Version | None = Field(
        None,
        description="linux-rdma/perftest release tag, exactly as tagged (e.g. "
        '"25.10.0-0.128"), built with CUDA on GPU nodes with RDMA NICs for the GPUDirect RDMA '
        "check (`ib_write_bw --use_cuda`): the distributions' perftest has no CUDA. null = not "
        "built, and the check does not run.",
    )
    rdma: Rdma = Field(default_factory=lambda: Rdma(), description="RDMA stack.")
    mpi: Mpi = Field(default_factory=lambda: Mpi(), description="MPI for nccl-tests.")
    slurm: Version | None = Field(
        None, description="Slurm version to install; null = the distribution's package."
    )
    mft: Version | None = Field(
        None,
        description="NVIDIA Firmware Tools (package `mft`, from the site's DOCA/MLNX mirror), "
        "for `gpuctl rollout --component nic-firmware`; null = not installed by gpuctl.",
    )
    unverified_versions: list[Literal["cuda", "nccl", "dcgm", "gpu_models", "slurm"]] = Field(
        default_factory=list,
        description="Versions the preflight version gate may let through although it has no "
        "rule for them (a CUDA minor, DCGM major or GPU model its tables do not list, an NCCL "
        "version without `+cudaX.Y`, a Slurm release series without a cgroup rule): reported "
        "as warnings instead of refused. Empty = every version without a rule is refused "
        "(docs/compatibility.md).",
    )

    @model_validator(mode="after")
    def _cuda_major_minor(self) -> Software:
        if not re.fullmatch(r"\d+\.\d+", self.cuda):
            raise ValueError(f'cuda must be major.minor like "12.8", not "{self.cuda}"')
        return self
