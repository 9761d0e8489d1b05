"""Rules that relate several fields of cluster.yml: what a strict schema alone cannot catch.

Each rule appends ``(location, message)`` pairs; the location is the path in the document
(``("node_groups", 1, "gpus", "model")``) so the loader can point at the file's line and column.
All rules run, so one pass reports every problem. One module per area: ``nodes`` (node groups),
``software``, ``fabrics``, ``slurm``, ``settings`` (access, rollout, thresholds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuctl.config.findings import Loc, RuleViolations
from gpuctl.config.rules.fabrics import check_fabrics
from gpuctl.config.rules.nodes import (
    check_addresses,
    check_gpus,
    check_group_name_collisions,
    check_rails,
    node_index,
)
from gpuctl.config.rules.settings import (
    check_levels,
    check_rollout,
    check_ssh,
    check_thresholds_enforced,
)
from gpuctl.config.rules.slurm import check_slurm
from gpuctl.config.rules.software import check_slurm_source, check_software

if TYPE_CHECKING:
    from gpuctl.config.model import Cluster


def check_rules(cluster: Cluster) -> None:
    """Raise :class:`RuleViolations` listing every broken rule (nothing when all hold)."""
    out: list[tuple[Loc, str]] = []
    nodes = node_index(cluster, out)
    check_addresses(cluster, out)
    check_gpus(cluster, out)
    check_software(cluster, out)
    check_fabrics(cluster, nodes, out)
    check_slurm(cluster, nodes, out)
    check_slurm_source(cluster, out)
    check_ssh(cluster, out)
    check_rollout(cluster, nodes, out)
    check_levels(cluster, out)
    check_group_name_collisions(cluster, out)
    check_thresholds_enforced(cluster, out)
    check_rails(cluster, out)
    if out:
        raise RuleViolations(out)
