"""Per-rail multi-node nccl-tests (level ``long``, node groups whose adapters are rails).

The group's multi-node run (:mod:`gpuctl.validation.multinode`) uses every adapter of every
node at once: one slow rail (a port trained down, a bad cable or switch port on that rail)
costs the run only its share and hides in it. So, where cluster.yml declares the adapters as
rails (``nics[].rails``: GPU i uses adapter ``i x adapters // GPUs``), gpuctl then runs
all_reduce_perf across the group's nodes once per rail, one rank per node driving that rail's
GPUs, with NCCL held to that rail's adapter::

    srun --nodes=3 --ntasks-per-node=1 --gpus-per-node=8 --nodelist=gpu[001-003] ...
         --job-name=gpuctl-nccl-rail env NCCL_IB_HCA==mlx5_3 CUDA_DEVICE_ORDER=PCI_BUS_ID
         CUDA_VISIBLE_DEVICES=3 all_reduce_perf -b 8 -e 8G -f 2 -g 1

``NCCL_IB_HCA`` with a leading ``=`` names the adapter exactly (NCCL's environment variables:
without it ``mlx5_1`` would also match ``mlx5_10``); ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA
number the GPUs as nvidia-smi does, so ``CUDA_VISIBLE_DEVICES`` picks the rail's GPUs. Each
rail's run is judged against its floor (``nccl.multinode.rail``, subject the adapter) and,
below it, the locator of the group's run finds the node (or the link) that slows that rail.
The runs are recorded in ``<bundle>/_multinode/<group>@<adapter>/``. Pure functions (no I/O).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpuctl.config.catalog import Ceiling, fastest_rate, multinode_busbw_ceiling
from gpuctl.resources import load_data
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.multinode import SrunOptions, srun_options
from gpuctl.validation.results import CheckResult

RAIL_CHECK = "nccl.multinode.rail"
SEP = "@"  # a rail's folder: <group>@<adapter> (group names and adapter names have no @)
JOB_NAME = "gpuctl-nccl-rail"
NCCL_ARGS = ("all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g")


def folder_name(group: str, hca: str) -> str:
    return f"{group}{SEP}{hca}"


def split_folder(name: str) -> tuple[str, str | None]:
    """``"hgx@mlx5_3"`` -> ``("hgx", "mlx5_3")``; a group's own folder -> ``(name, None)``."""
    group, sep, hca = name.partition(SEP)
    return (group, hca) if sep and hca else (name, None)


def rail_gpus(exp: NodeExpectation) -> dict[str, tuple[int, ...]]:
    """Each rail adapter of the node and the GPUs that use it, in the order of their GPUs."""
    out: dict[str, list[int]] = {}
    for gpu, hca in sorted(exp.rails):
        out.setdefault(hca, []).append(gpu)
    return {hca: tuple(gpus) for hca, gpus in out.items()}


def rail_argv(
    nodes: Sequence[str],
    hca: str,
    gpus: Sequence[int],
    gpus_per_node: int,
    options: SrunOptions,
) -> tuple[str, ...]:
    """One rail's run: one rank per node with the rail's GPUs (``-g <their count>``), NCCL on
    that adapter alone. The whole node is allocated (``--exclusive``, all its GPUs) so that
    nothing else runs beside it and ``CUDA_VISIBLE_DEVICES`` can name any of its GPUs."""
    if len(nodes) < 2:
        raise ValueError("a multi-node run needs two or more nodes")
    if not gpus:
        raise ValueError("a rail run needs the rail's GPUs")
    argv = srun_options(nodes, 1, gpus_per_node, options, JOB_NAME)
    env = (
        "env",
        f"NCCL_IB_HCA=={hca}",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        f"CUDA_VISIBLE_DEVICES={','.join(str(g) for g in gpus)}",
    )
    return (*argv, *env, *NCCL_ARGS, str(len(gpus)))


def rail_limits(exp: NodeExpectation, hca: str) -> tuple[float | None, str, Ceiling | None]:
    """One rail's busbw floor, where it comes from, and the most its adapter carries.

    The floor: cluster.yml's ``nccl_multinode_busbw_gbs`` shared by the node's rails, else
    ``line_rate_share`` (gpuctl/data/multinode.yml, the share of the group's floor) of the
    adapter's line rate."""
    rails = rail_gpus(exp)
    nic = next((n for n in exp.nics if n.device == hca), None)
    rate = (nic.rate_gbps or fastest_rate(nic.kind)) if nic is not None else None
    ceiling = multinode_busbw_ceiling([rate], exp.gpu_model) if rate else None
    configured = exp.thresholds.get("nccl_multinode_busbw_gbs")
    if isinstance(configured, int | float) and not isinstance(configured, bool) and rails:
        where = exp.sources.get("nccl_multinode_busbw_gbs") or "cluster.yml"
        return (
            round(float(configured) / len(rails), 1),
            f"nccl_multinode_busbw_gbs {configured:g} ({where}) shared by {len(rails)} rails",
            ceiling,
        )
    if nic is None or not nic.rate_gbps:
        return None, "not set", ceiling
    share = float(load_data("multinode.yml")["line_rate_share"])
    line = nic.rate_gbps / 8.0
    return (
        round(share * line, 1),
        f"derived: {share:g} x {hca}'s line rate ({nic.rate_gbps} Gb/s = {line:g} GB/s), "
        "data/multinode.yml",
        ceiling,
    )


def as_rail(result: CheckResult, hca: str) -> CheckResult:
    """A result of the group's judge (``nccl.multinode``) as the result of rail ``hca``."""
    return replace(result, check=RAIL_CHECK, subject=hca, message=f"rail {hca}: {result.message}")
