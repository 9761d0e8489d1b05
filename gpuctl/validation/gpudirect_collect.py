"""Running one GPU's GPUDirect RDMA loopback on its node (:mod:`gpuctl.validation.gpudirect`).

The collector calls :func:`run_gpu` for each ``perftest.gdr.gpu<i>`` probe of a node, on the
node's own connection, after its other exclusive probes (the GPUs are free): the adapter
nearest the GPU is read from the node's ``topo.txt`` (collected earlier in the same run), the
server starts on that adapter, and once it prints perftest's ``Waiting for client to connect``
the client runs on the same adapter against the node's address. The client's result is the
GPU's; where the server could not start, what the server printed is (perftest says there why:
``Couldn't allocate MR``, an option it does not know). Both streams are kept in the bundle file
(stdout, then stderr), as perftest prints its GPU and registration errors on stderr.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from gpuctl.remote import GRACE_S, KILL_AFTER_S, ExecResult, LinkSession
from gpuctl.validation import gpudirect
from gpuctl.validation.bundle import (
    BundleFileError,
    NodeFolder,
    read_bundle_file,
    said,
    sent_received,
)
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.parsing import parse
from gpuctl.validation.probes import IB_WRITE_BW_SERVER_START_S, SERVER_READY, Probe

TOPO_LIMIT = 1 << 20  # topo -m of a large node is a few KiB


def routes(folder: NodeFolder, exp: NodeExpectation) -> dict[int, gpudirect.Route] | str:
    """Each GPU's nearest adapter, from the node's topo -m of this run; or why not."""
    with folder.lock:
        info = dict(folder.probes.get("topo") or {})
    if info.get("rc") != 0 or info.get("error"):
        return "nvidia-smi topo -m did not run cleanly in this run: no adapter per GPU"
    try:
        data = read_bundle_file(folder.folder.parent, f"{folder.folder.name}/topo.txt", TOPO_LIMIT)
    except BundleFileError as exc:
        return f"topo.txt cannot be read: {exc}"
    if data is None:
        return "topo.txt is missing: no adapter per GPU"
    result = parse("topo", data.decode("utf-8", errors="replace"))
    if not result.recognised:
        return "nvidia-smi topo -m was not recognised: no adapter per GPU"
    # topo -m names devices: a device with several ports is measured on its first listed port
    devices = list(dict.fromkeys(n.device for n in exp.nics))
    return gpudirect.nearest_nics(result.data, devices, exp.gpu_count)


def both_streams(result: ExecResult) -> ExecResult:
    """stdout then stderr, as one text (perftest's errors go to stderr)."""
    if not result.stderr:
        return result
    sep = b"" if not result.stdout or result.stdout.endswith(b"\n") else b"\n"
    return replace(result, stdout=result.stdout + sep + result.stderr)


def run_gpu(
    folder: NodeFolder,
    session: LinkSession,
    probe: Probe,
    exp: NodeExpectation,
    address: str,
    routed: dict[int, gpudirect.Route] | str,
    options: Callable[[str], Sequence[str]],
) -> None:
    """One GPU's loopback (``probe``: its ``perftest.gdr.gpu<i>`` probe), recorded in
    ``folder``; ``routed``: :func:`routes`; ``options``: an adapter's RoCE addressing."""
    gpu = gpudirect.gpu_of(probe.kind)
    t = probe.timeout_s
    route = routed.get(gpu) if isinstance(routed, dict) and gpu is not None else None
    if route is None:
        why = routed if isinstance(routed, str) else f"no adapter found for GPU{gpu}"
        at = sent_received(time.time())
        folder.record(probe.kind, ExecResult(error=f"not run: {why}"), probe.argv, t, **at)
        return
    server = (*(a.replace("{hca}", route.hca) for a in probe.argv), *options(route.hca))
    client = (*server, address)
    extra: dict[str, object] = {"hca": route.hca, "link": route.link, "streams": "stdout+stderr"}
    sent = time.time()
    running = session.spawn(server, t)
    if not running.wait_for(SERVER_READY, IB_WRITE_BW_SERVER_START_S):
        s_res = running.finish(KILL_AFTER_S + GRACE_S)
        if s_res.rc in (0, None) and s_res.error is None:
            s_res = replace(
                s_res,
                error=f"not run: the server printed no '{SERVER_READY}' within "
                f"{IB_WRITE_BW_SERVER_START_S} s: {said(s_res.stderr) or 'nothing on stderr'}",
            )
        extra |= sent_received(sent)
        folder.record(probe.kind, both_streams(s_res), server, t, role="server", **extra)
        return
    c_res = session.run(client, t)
    s_res = running.finish(KILL_AFTER_S + GRACE_S)
    if c_res.rc == 0 and s_res.rc not in (0, None):
        c_res = replace(
            c_res,
            rc=s_res.rc,
            stderr=c_res.stderr + s_res.stderr,
        )  # the server's failure is the same GPU's (one node, one adapter)
    extra |= sent_received(sent)
    folder.record(probe.kind, both_streams(c_res), client, t, role="client", **extra)
