"""Rules on how gpuctl operates: root on the nodes, rollout batches, thresholds no check reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuctl.config.facts import roles_of
from gpuctl.config.findings import Loc

if TYPE_CHECKING:
    from gpuctl.config.model import Cluster

# Thresholds the model has but no judge reads yet (tests/unit/test_no_dead_settings.py): a set
# value is refused rather than silently ignored. fleet_relative_min is read cluster-wide only.
UNENFORCED_THRESHOLDS = (
    "ib_write_lat_p99_us",
    "pcie_h2d_gbs",
    "pcie_d2h_gbs",
    "remapped_rows_failure_max",
    "xid_fatal",
    "ib_link_flaps_max",
)


def check_thresholds_enforced(cluster: Cluster, out: list[tuple[Loc, str]]) -> None:
    places: list[tuple[Loc, Any, tuple[str, ...]]] = [
        (("validation", "thresholds"), cluster.validation.thresholds, UNENFORCED_THRESHOLDS)
    ]
    for i, group in enumerate(cluster.node_groups):
        places.append(
            (
                ("node_groups", i, "validation", "thresholds"),
                group.validation.thresholds,
                (*UNENFORCED_THRESHOLDS, "fleet_relative_min"),
            )
        )
    for loc, thresholds, keys in places:
        for key in keys:
            if getattr(thresholds, key) is not None:
                where = "per node group" if key == "fleet_relative_min" else "by any check"
                out.append(
                    (
                        (*loc, key),
                        f"not enforced yet: no check reads {key} {where}; remove it"
                        + (
                            " (validation.thresholds.fleet_relative_min is)"
                            if key == "fleet_relative_min"
                            else ""
                        ),
                    )
                )


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
