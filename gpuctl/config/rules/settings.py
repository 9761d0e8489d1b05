"""Rules on how gpuctl operates: root on the nodes, rollout batches, thresholds no check reads
(and the one table of which check reads each threshold)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuctl.config.facts import roles_of
from gpuctl.config.findings import Loc

if TYPE_CHECKING:
    from gpuctl.config.model import Cluster

# Every threshold key of the model (gpuctl/config/model/validation.py `Thresholds`) is in exactly
# one of the two tables below; tests/unit/test_every_threshold.py fails a key that is in neither.
#
# THRESHOLD_CHECKS: the checks whose verdict a key decides (the `check` of their results).
# `gpuctl check --json` lists them per threshold ("checked_by"), and the test moves each key
# across a measured value and sees the verdict of these checks flip.
THRESHOLD_CHECKS: dict[str, tuple[str, ...]] = {
    "nccl_all_reduce_busbw_gbs": ("nccl.busbw",),
    "nccl_all_gather_busbw_gbs": ("nccl.all_gather.busbw",),
    "nccl_reduce_scatter_busbw_gbs": ("nccl.reduce_scatter.busbw",),
    "nccl_alltoall_busbw_gbs": ("nccl.alltoall.busbw",),
    "nccl_sendrecv_busbw_gbs": ("nccl.sendrecv.busbw",),
    "nccl_multinode_busbw_gbs": ("nccl.multinode",),
    "ib_write_bw_gbps": ("ib.write_bw", "gpudirect.write_bw"),
    "ib_write_lat_p99_us": ("ib.write_lat",),
    "fleet_relative_min": (
        "nccl.busbw.fleet",
        "nccl.all_gather.busbw.fleet",
        "nccl.reduce_scatter.busbw.fleet",
        "nccl.alltoall.busbw.fleet",
        "nccl.sendrecv.busbw.fleet",
        "ib.write_bw.fleet",
    ),
    "remapped_rows_pending_max": ("gpu.remap",),
    "remapped_rows_failure_max": ("gpu.remap",),
    "sram_uncorrectable_max": ("gpu.ecc.sram_uncorrectable",),
    "sram_correctable_max": ("gpu.ecc.sram_correctable",),
    "dram_correctable_max": ("gpu.ecc.dram_correctable",),
    "xid_fatal": ("xid",),
    "ib_link_flaps_max": ("ib.port.errors",),
    "clock_offset_max_s": ("node.clock",),
    "pcie_h2d_gbs": ("pcie.h2d",),
    "pcie_d2h_gbs": ("pcie.d2h",),
    "p2p_read_gbs": ("p2p.read",),
    "p2p_write_gbs": ("p2p.write",),
}

# The single-node nccl-tests busbw floors, one per collective gpuctl runs (the probe table,
# gpuctl/validation/probes.py NCCL_COLLECTIVES): `gpuctl check` warns where one has no value.
NCCL_BUSBW_KEYS = (
    "nccl_all_reduce_busbw_gbs",
    "nccl_all_gather_busbw_gbs",
    "nccl_reduce_scatter_busbw_gbs",
    "nccl_alltoall_busbw_gbs",
    "nccl_sendrecv_busbw_gbs",
)

# UNENFORCED_THRESHOLDS: keys the model has but no check reads yet (none today). A set value
# is refused, in validation.thresholds and in node_groups[].validation.thresholds, rather than
# silently ignored; they have no default, and `gpuctl check --json` does not list them.
UNENFORCED_THRESHOLDS: tuple[str, ...] = ()


def check_thresholds_enforced(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
    places: list[tuple[Loc, Any]] = [(("validation", "thresholds"), cluster.validation.thresholds)]
    for i, group in enumerate(cluster.node_groups):
        places.append((("node_groups", i, "validation", "thresholds"), group.validation.thresholds))
    for loc, thresholds in places:
        for key in UNENFORCED_THRESHOLDS:
            if getattr(thresholds, key) is not None:
                out.append(
                    (
                        (*loc, key),
                        f"not enforced yet: no check reads {key}; remove it",
                    )
                )


_BURN_ONLY_ASKED = (
    "burn runs for a duration asked for on the command line "
    "(gpuctl validate --level burn --duration 4h), not as a default level"
)


def check_levels(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
    """The burn level is asked for with its duration, never a default of cluster.yml."""
    places: list[tuple[Loc, Any]] = [(("validation", "level"), cluster.validation.level)]
    for i, group in enumerate(cluster.node_groups):
        places.append((("node_groups", i, "validation", "level"), group.validation.level))
    places.append((("rollout", "validate_level"), cluster.rollout.validate_level))
    for loc, level in places:
        if level is not None and level.value == "burn":
            out.append((loc, f"not supported here: {_BURN_ONLY_ASKED}"))


def check_ssh(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
    if cluster.ssh.user != "root" and not cluster.ssh.become:
        out.append(
            (
                ("ssh", "become"),
                f"provisioning needs root: user {cluster.ssh.user} must become root (sudo)",
            )
        )


def check_rollout(cluster: Cluster, nodes: dict[str, int], out: list[tuple[Loc, str]]) -> None:
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
