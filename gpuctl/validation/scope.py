"""Which nodes a run covers, at which level: `--limit` and `--level` applied to a loaded
cluster (shared by `gpuctl validate`, `gpuctl node-check` and `gpuctl rollout`)."""

from __future__ import annotations

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from gpuctl.config.derived import nodes as cluster_nodes
from gpuctl.config.derived import split_top_level
from gpuctl.config.model import LEVELS, Cluster, Level
from gpuctl.errors import UsageError


def with_level(cluster: Cluster, level: str | None) -> Cluster:
    """The cluster with every node at ``level`` (None: unchanged, each group's own level)."""
    if level is None:
        return cluster
    if level not in LEVELS:
        raise UsageError(f"unknown level {level!r}; levels: {', '.join(LEVELS)}")
    lvl = Level(level)
    return cluster.model_copy(
        update={
            "validation": cluster.validation.model_copy(update={"level": lvl}),
            "node_groups": [
                g.model_copy(update={"validation": g.validation.model_copy(update={"level": lvl})})
                for g in cluster.node_groups
            ],
        }
    )


def select_nodes(cluster: Cluster, limit: str | None) -> list[str]:
    """The nodes ``limit`` names (node sets such as ``gpu[001-004]``, node group names, comma
    separated), in the order of cluster.yml; every node when ``limit`` is None."""
    every = [n.name for n in cluster_nodes(cluster)]
    if limit is None:
        return every
    groups = {g.name: g.node_names() for g in cluster.node_groups}
    wanted: set[str] = set()
    unknown: list[str] = []
    for piece in split_top_level(limit):
        if piece in groups:
            wanted.update(groups[piece])
            continue
        try:
            names = list(NodeSet(piece))
        except NodeSetParseError as exc:
            raise UsageError(f"--limit: {piece!r} is not a node set: {exc}") from None
        unknown += [n for n in names if n not in every]
        wanted.update(names)
    if unknown:
        shown = str(NodeSet.fromlist(unknown))
        raise UsageError(f"--limit: not in the cluster: {shown}")
    chosen = [n for n in every if n in wanted]
    if not chosen:
        raise UsageError("--limit selects no node")
    return chosen
