"""`gpuctl init`: commented starter cluster.yml files for common cluster shapes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import jinja2

from gpuctl.config.loader import load_cluster_text
from gpuctl.errors import UsageError
from gpuctl.resources import templates_dir


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    summary: str
    default_nodes: int
    max_nodes: int


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("lab", "the gpuctl lab: a controller and simulated HGX H100 nodes", 2, 16),
        Profile("hgx-h100", "HGX H100 8-GPU servers on NDR InfiniBand, fat tree", 4, 4096),
        Profile("a100-roce", "HGX A100 8-GPU servers on 200 GbE RoCE", 4, 4096),
        Profile("l40s-pcie", "8x L40S PCIe servers on 100 GbE RoCE", 4, 4096),
        Profile("workstation", "one single-GPU workstation (controller and compute)", 1, 1),
    )
}


def starter(profile: str, nodes: int | None = None) -> str:
    """The text of a starter cluster.yml; it always loads without problems."""
    spec = PROFILES.get(profile)
    if spec is None:
        raise UsageError(f"unknown profile {profile!r}; choose one of: {', '.join(PROFILES)}")
    count = spec.default_nodes if nodes is None else nodes
    if not 1 <= count <= spec.max_nodes:
        raise UsageError(
            f"profile {profile} takes 1 to {spec.max_nodes} compute nodes, not {count}"
        )
    width = max(3, len(str(count)))
    names = f"gpu[{1:0{width}d}-{count:0{width}d}]" if count > 1 else f"gpu{1:0{width}d}"
    per_leaf = max(1, math.ceil(count / 2)) if count <= 64 else 32
    starts = list(range(1, count + 1, per_leaf))
    lw = max(2, len(str(len(starts))))
    leaves = []
    for i, start in enumerate(starts, 1):
        end = min(count, start + per_leaf - 1)
        members = (
            f"gpu[{start:0{width}d}-{end:0{width}d}]" if end > start else f"gpu{start:0{width}d}"
        )
        leaves.append({"name": f"leaf{i:0{lw}d}", "nodes": members})
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - YAML, not HTML
    )
    text = env.get_template(f"init/{profile}.yml.j2").render(
        nodes=count,
        names=names,
        leaves=leaves,
        leaf_names=f"leaf[{1:0{lw}d}-{len(leaves):0{lw}d}]" if len(leaves) > 1 else "leaf01",
        last_address=10 + count,
    )
    load_cluster_text(text, f"<init {profile}>")  # a starter that does not load is a bug
    return text
