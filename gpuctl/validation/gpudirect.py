"""GPUDirect RDMA on one node: each GPU's memory through the adapter nearest it.

Pure functions (no I/O). `gpuctl validate` (``standard`` and ``long``) runs, on every node with
GPUs and RDMA adapters where cluster.yml builds a perftest with CUDA (``software.perftest``),
one ``ib_write_bw`` per GPU with its buffers in that GPU's memory (``--use_cuda=<index>``),
over the adapter nearest the GPU in ``nvidia-smi topo -m`` (PIX before PXB before PHB before
NODE before SYS), as a loopback on that adapter: server and client on the same node and HCA,
so the adapter reads from and writes into the GPU's memory both ways and nothing outside the
node takes part (AzureHPC's health checks run their GPUDirect test the same way). What it
proves: the HCA can register and reach the GPU's memory (nvidia-peermem loaded and effective,
or DMA-BUF), at a bandwidth the link rate allows. What it does not: the cable and the switch,
which ib_write_bw between nodes measures.

The GPU index is CUDA's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (the order nvidia-smi numbers
GPUs in); perftest prints each CUDA device's PCIe address and the one it picked, and the judge
checks that it is the GPU asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuctl.validation.parsers.topo import adapter_names

# How each link token of topo -m ranks as a path from a GPU to a NIC: nearest first
# (nvidia-smi topo -m legend: PIX one PCIe bridge, PXB several, PHB the host bridge, NODE
# across host bridges of one NUMA node, SYS across the SMP interconnect; SOC: older SYS)
PATH_RANK = {"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4, "SOC": 4}

PEERMEM, DMABUF = "peermem", "dmabuf"
KIND_PREFIX = "perftest.gdr.gpu"  # bundle file perftest.gdr.gpu<index>.txt, parsed as perftest
# where software.perftest's build is installed (playbooks/roles/validation_tools)
PERFTEST_CUDA_BIN = "/opt/perftest-cuda/current/bin/ib_write_bw"
# GPU i on port BASE_PORT + i: away from the pairs' ib_write_bw (18515 + 16 * shift + i, up to
# 19042) and ib_write_lat (those + 1024, from 19539)
BASE_PORT = 19315
TIMEOUT_S = 30  # per GPU (8 MiB x 5000 iterations: 40 GiB, seconds at any GPUDirect rate)


def kind(gpu: int) -> str:
    """The bundle name of one GPU's GPUDirect run."""
    return f"{KIND_PREFIX}{gpu}"


def gpu_of(kind_name: str) -> int | None:
    """The GPU index of a GPUDirect run's kind (None: not one)."""
    rest = kind_name.removeprefix(KIND_PREFIX)
    return int(rest) if rest != kind_name and rest.isdigit() else None


@dataclass(frozen=True, slots=True)
class Route:
    """A GPU's nearest adapter: its name and the topo -m token between them."""

    hca: str
    link: str


def nearest_nics(
    topo: Mapping[str, Any], hcas: Sequence[str], gpu_count: int
) -> dict[int, Route] | str:
    """GPU index -> its nearest adapter among ``hcas`` (the node's RDMA adapters, in
    cluster.yml's order), from :func:`gpuctl.validation.parsers.topo.parse_topo`'s data; or
    why that cannot be told. Ties (two adapters behind the GPU's switch, or none nearer than
    the NUMA node) are shared out in turn: the GPU's position among the GPUs with the same
    choice picks one, so that GPUs spread over adapters as NCCL spreads its rails."""
    links: Mapping[str, Mapping[str, str | None]] = topo.get("links") or {}
    by_name = adapter_names(topo)
    wanted = [h for h in hcas if h in by_name]
    if not wanted:
        listed = ", ".join(sorted(by_name)) or "no NIC Legend"
        return (
            f"nvidia-smi topo -m names none of the adapters {', '.join(hcas)} ({listed}): the "
            "adapter nearest each GPU cannot be told"
        )
    out: dict[int, Route] = {}
    seen: dict[tuple[str, ...], int] = {}
    for g in range(gpu_count):
        row = links.get(f"GPU{g}")
        if row is None:
            return f"nvidia-smi topo -m shows no GPU{g}: its nearest adapter cannot be told"
        ranked = [(h, row.get(by_name[h])) for h in wanted]
        known = [(h, t) for h, t in ranked if t in PATH_RANK]
        if not known:
            return f"nvidia-smi topo -m shows no PCIe path from GPU{g} to {', '.join(wanted)}"
        best = min(PATH_RANK[t] for _, t in known if t is not None)
        ties = tuple(h for h, t in known if t is not None and PATH_RANK[t] == best)
        turn = seen.get(ties, 0)
        seen[ties] = turn + 1
        hca = ties[turn % len(ties)]
        out[g] = Route(hca, str(dict(known)[hca]))
    return out


def cuda_options(method: str) -> tuple[str, ...]:
    """perftest's flags for a buffer in GPU memory registered ``method``'s way: nvidia-peermem
    (``--use_cuda`` alone) or DMA-BUF (``--use_cuda_dmabuf`` too: inbox rdma-core, open
    kernel modules)."""
    return ("--use_cuda_dmabuf",) if method == DMABUF else ()


def server_argv(
    hca: str, port: int, gpu: int, method: str, size: int, options: Sequence[str] = ()
) -> tuple[str, ...]:
    """The server side of GPU ``gpu``'s run on ``hca`` (the client adds the node's address);
    ``options``: the adapter's RoCE addressing (``perftest_options``)."""
    return (
        "env",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        PERFTEST_CUDA_BIN,
        "-d",
        hca,
        "-p",
        str(port),
        "-s",
        str(size),
        "-F",
        "--report_gbits",
        f"--use_cuda={gpu}",
        *cuda_options(method),
        *options,
    )
