"""GPUDirect RDMA: each GPU's memory through its nearest adapter (``gpudirect.write_bw``).

Reads the ``perftest.gdr.gpu<i>`` runs of :mod:`gpuctl.validation.gpudirect` (``ib_write_bw
--use_cuda=<i>``, a loopback on the adapter nearest GPU *i*; stdout and stderr in one text).
Per GPU:

- FAIL where the adapter could not register the GPU's memory (perftest's ``Couldn't allocate
  MR``, ``Failed to create MR``: nvidia-peermem missing or not effective, or DMA-BUF refused),
  where the run failed otherwise, or where its bandwidth at 8 MiB is below the adapter's
  ``ib_write_bw_gbps`` floor (the published floors are GPUDirect figures: Azure's health
  checks measure ib_write_bw with GPU memory) or above what the port can carry;
- UNKNOWN where it did not run (no perftest built with CUDA: ``software.perftest``; no adapter
  per GPU in topo -m; a timeout), where perftest printed none of its CUDA lines (a build
  without CUDA ignored ``--use_cuda``: linux-rdma/perftest#61, never judged as GPUDirect), or
  where it ran on another GPU than asked (its PCIe address against nvidia-smi's);
- OK with the bandwidth, the adapter and the path (``mlx5_3 (PIX)``).

`gpuctl node-check` leaves it out (``evidence.pairs``), as it does ib_write_bw.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpuctl.config.catalog import port_ceiling
from gpuctl.validation.expect import ExpectedNic, NodeExpectation
from gpuctl.validation.gpudirect import DMABUF, KIND_PREFIX, kind
from gpuctl.validation.judges.base import (
    Evidence,
    finding,
    node_judge,
    record,
    threshold_value,
    usable_parse,
)
from gpuctl.validation.judges.infiniband import MB_PER_SEC_TO_GBPS
from gpuctl.validation.parsers.nvsmi_gpu import smi_of
from gpuctl.validation.parsers.perftest import perftest_of
from gpuctl.validation.plausible import finite, implausible
from gpuctl.validation.probes import collects
from gpuctl.validation.results import CheckResult, Verdict

CHECK = "gpudirect.write_bw"
# perftest's lines when the adapter cannot register a GPU buffer (src/perftest_resources.c:
# "Couldn't allocate MR", "Couldn't allocate MR with error=%d", "Failed to create MR"; the
# DMA-BUF path: ibv_reg_dmabuf_mr)
_MR = re.compile(r"allocate MR|create MR|create mr|reg_dmabuf_mr", re.IGNORECASE)
_NO_CUDA = re.compile(r"unrecognized option '?--use[_-]cuda", re.IGNORECASE)


def _applies(exp: NodeExpectation) -> bool:
    return exp.gpudirect is not None and exp.gpu_count > 0 and collects(exp, kind(0))


def _bus_ids(exp: NodeExpectation, evidence: Evidence) -> dict[int, str]:
    """GPU index -> ``bb:dd`` (perftest's form of a PCIe address), from nvidia-smi."""
    result, _ = usable_parse(exp, evidence, ["smi-xml", "smi-q"], CHECK)
    if result is None:
        return {}
    out: dict[int, str] = {}
    for gpu in record(result, smi_of).gpus:
        bus = (gpu.pci_bus_id or "").lower()
        parts = bus.split(":")
        if gpu.index is not None and len(parts) == 3:
            out[gpu.index] = f"{parts[1][-2:]}:{parts[2][:2]}"
    return out


def _how(exp: NodeExpectation) -> str:
    return "DMA-BUF" if exp.gpudirect == DMABUF else "nvidia-peermem"


def _fix(exp: NodeExpectation) -> str:
    if exp.gpudirect == DMABUF:
        return (
            "DMA-BUF needs the open GPU kernel modules, a kernel with DMA-BUF (5.12+) and "
            "rdma-core 34+"
        )
    return (
        "nvidia-peermem is not loaded or not effective (loaded before the adapter's driver; "
        "with inbox rdma-core a kernel without the peer memory API cannot load it)"
    )


def judge_one(
    exp: NodeExpectation, gpu: int, evidence: Evidence, buses: Mapping[int, str]
) -> CheckResult:
    """GPU ``gpu``'s result."""
    subject = f"GPU{gpu}"
    out = evidence.outputs.get(kind(gpu))
    if out is None:
        return finding(exp, CHECK, Verdict.UNKNOWN, "not measured", subject=subject)
    text = out.text or ""
    if _NO_CUDA.search(text):
        return finding(
            exp,
            CHECK,
            Verdict.UNKNOWN,
            "this perftest is built without CUDA (it does not know --use_cuda): GPUDirect "
            "RDMA not measured",
            subject=subject,
        )
    why = out.failure()
    if why is not None and not text.strip():
        return finding(exp, CHECK, Verdict.UNKNOWN, f"{kind(gpu)}: {why}", subject=subject)
    parsed = out.parse_as(kind(gpu))
    data = parsed.data
    errors = [str(e) for e in data.get("errors") or ()]
    cuda = data.get("cuda")
    if not (parsed.recognised or errors or isinstance(cuda, dict)):
        said = "; ".join(parsed.problems)[:200]
        message = f"{kind(gpu)}: output not recognised ({said})"
        return finding(exp, CHECK, Verdict.UNKNOWN, message, subject=subject)
    device = data.get("device")
    nic = next((n for n in exp.nics if n.device == device), None)
    via = f" via {device}" if device else ""
    mr = next((e for e in errors if _MR.search(e)), None)
    if mr is not None:
        return finding(
            exp,
            CHECK,
            Verdict.FAIL,
            f"the adapter{via} could not register {subject}'s memory ({mr}): GPUDirect RDMA "
            f"through {_how(exp)} does not work; {_fix(exp)}",
            subject=subject,
        )
    if not isinstance(cuda, dict):
        if errors:
            return finding(
                exp,
                CHECK,
                Verdict.FAIL,
                f"ib_write_bw{via} failed before it used {subject}'s memory: {errors[0]}",
                subject=subject,
            )
        return finding(
            exp,
            CHECK,
            Verdict.UNKNOWN,
            "ib_write_bw printed none of perftest's CUDA lines: its buffer was not in GPU "
            "memory (a build without CUDA ignores --use_cuda); not judged as GPUDirect RDMA",
            subject=subject,
        )
    picked = cuda.get("device")
    listed = {e.get("index"): e.get("pci") for e in cuda.get("listed") or () if isinstance(e, dict)}
    used, asked = listed.get(picked), buses.get(gpu)
    if used is not None and asked is not None and used != asked:
        return finding(
            exp,
            CHECK,
            Verdict.UNKNOWN,
            f"ib_write_bw used the GPU at {used}, not {subject} ({asked}): not judged",
            subject=subject,
        )
    if nic is None:
        message = (
            f"ib_write_bw failed{via}: {errors[0]}"
            if errors
            else f"ib_write_bw ran on {device or 'no adapter it named'}, none of the node's "
            "adapters in cluster.yml: not judged"
        )
        return finding(
            exp, CHECK, Verdict.FAIL if errors else Verdict.UNKNOWN, message, subject=subject
        )
    return _bandwidth(exp, subject, nic, data, errors, out.rc)


def _bandwidth(
    exp: NodeExpectation,
    subject: str,
    nic: ExpectedNic,
    data: Mapping[str, Any],
    errors: list[str],
    rc: int | None,
) -> CheckResult:
    threshold = threshold_value(exp.thresholds.get("ib_write_bw_gbps"), nic.rate_gbps)
    run = perftest_of(data)
    where = f"{subject}'s memory via {nic.device} ({_how(exp)})"
    rows = run.bw_rows
    if not rows:
        verdict = Verdict.FAIL if errors or rc not in (0, None) else Verdict.UNKNOWN
        said = f": {errors[0]}" if errors else ""
        return finding(exp, CHECK, verdict, f"no result row for {where}{said}", subject=subject)
    row = max(rows, key=lambda r: finite(r.bytes) or 0.0)
    bw = finite(row.bw_average)
    if bw is not None and run.bw_unit == "MB/sec":
        bw = round(bw * MB_PER_SEC_TO_GBPS, 2)
    elif run.bw_unit != "Gb/sec":
        bw = None
    if bw is None:
        return finding(
            exp,
            CHECK,
            Verdict.UNKNOWN,
            f"{where}: bandwidth not readable ({row.bw_average!r} {run.bw_unit})",
            subject=subject,
        )
    ceiling = port_ceiling(nic.rate_gbps or 0, "the port's line rate") if nic.rate_gbps else None
    lie = implausible(bw, ceiling, "ib_write_bw", "Gb/s") if ceiling else None
    if lie is not None:
        return finding(exp, CHECK, Verdict.FAIL, f"{where}: {lie}", subject=subject)
    if threshold is None:
        return finding(
            exp,
            CHECK,
            Verdict.UNKNOWN,
            f"{bw:g} Gb/s, {where}; no threshold set",
            subject=subject,
            measured=bw,
            unit="Gb/s",
        )
    ok = bw >= threshold and rc in (0, None)
    failed = f"; ib_write_bw exited with {rc}" if rc not in (0, None) else ""
    return finding(
        exp,
        CHECK,
        Verdict.OK if ok else Verdict.FAIL,
        f"{bw:g} Gb/s " + (">=" if bw >= threshold else "<") + f" {threshold:g} Gb/s, {where}"
        f"{failed}",
        subject=subject,
        measured=bw,
        expected=threshold,
        unit="Gb/s",
        limit=float(nic.rate_gbps) if nic.rate_gbps else None,
        source=exp.sources.get("ib_write_bw_gbps"),
    )


@node_judge(KIND_PREFIX, applies=_applies)  # per GPU: perftest.gdr.gpu<i>
def judge_gpudirect(exp: NodeExpectation, evidence: Evidence) -> list[CheckResult]:
    """Each GPU's GPUDirect RDMA run (none where the node is judged alone)."""
    if not evidence.pairs:
        return []
    buses = _bus_ids(exp, evidence)
    return [judge_one(exp, g, evidence, buses) for g in range(exp.gpu_count)]
