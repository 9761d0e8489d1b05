"""Rules on the pinned software: driver branch and version against the GPUs, Fabric Manager,
NCCL against CUDA, RDMA, MPI, and the version a Slurm repository needs."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gpuctl.config.catalog import gpu_spec
from gpuctl.config.facts import has_nvswitch
from gpuctl.config.findings import Loc

if TYPE_CHECKING:
    from gpuctl.config.model import Cluster


def check_software(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
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


def check_slurm_source(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
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
