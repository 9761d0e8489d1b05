"""GPUDirect RDMA (issue 18, point 2): each GPU's memory through the adapter nearest it,
``ib_write_bw --use_cuda=<i>`` as a loopback on that adapter, judged against the adapter's
ib_write_bw floor. The adapter comes from topo -m (a real 8x H100 capture); the judge reads real
captures of perftest with CUDA (tests/fixtures/perftest/ib-write-bw-use-cuda-*, ADDED.md) and
what the lab's stand-in prints for the same run."""

from __future__ import annotations

import io
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT

from gpuctl.config import load_cluster
from gpuctl.config.model import KernelModules, RdmaStack
from gpuctl.lab.sim import perf, profiles, standin
from gpuctl.lab.sim.faults import apply
from gpuctl.remote import ExecResult
from gpuctl.validation import gpudirect
from gpuctl.validation.bundle import NodeFolder, load_node_bundle
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import ExpectedNic, NodeExpectation, gpudirect_method
from gpuctl.validation.gpudirect_collect import both_streams, routes, run_gpu
from gpuctl.validation.judges.base import Evidence, ProbeOutput
from gpuctl.validation.judges.gpudirect import judge_gpudirect
from gpuctl.validation.parsing import parse
from gpuctl.validation.probes import Probe, probes_for
from gpuctl.validation.results import CheckResult, Verdict

FIX = ROOT / "tests" / "fixtures"
H100_TOPO = FIX / "topo" / "nvsmi-topo-m-h100-8gpu-6nic-blank-cpuaffinity.txt"
SIX = tuple(f"mlx5_{i}" for i in range(6))


def _topo(path: Path) -> dict[str, Any]:
    result = parse("topo", capture_output(path))
    assert result.recognised, result.problems
    return dict(result.data)


def test_each_gpu_gets_the_adapter_behind_its_pcie_switch_and_the_others_share_out() -> None:
    """GPU0 has two adapters behind its switch (PIX), GPU3, GPU4 and GPU6 one each; GPU1, 2, 5
    and 7 none (NODE to all six): those take the six in turn."""
    got = gpudirect.nearest_nics(_topo(H100_TOPO), SIX, 8)
    assert isinstance(got, dict)
    assert {g: (r.hca, r.link) for g, r in got.items()} == {
        0: ("mlx5_0", "PIX"),
        1: ("mlx5_0", "NODE"),
        2: ("mlx5_1", "NODE"),
        3: ("mlx5_2", "PIX"),
        4: ("mlx5_3", "PIX"),
        5: ("mlx5_2", "NODE"),
        6: ("mlx5_5", "PIX"),
        7: ("mlx5_3", "NODE"),
    }
    # adapters cluster.yml does not list are never chosen
    only = gpudirect.nearest_nics(_topo(H100_TOPO), ("mlx5_4", "mlx5_5"), 8)
    assert isinstance(only, dict)
    assert only[4] == gpudirect.Route("mlx5_4", "PIX")
    assert only[0].hca in ("mlx5_4", "mlx5_5")


def test_without_adapter_names_or_a_gpu_row_the_route_is_a_reason_not_a_guess() -> None:
    # Azure NDv4: the NIC columns carry no names and there is no NIC Legend
    blank = _topo(FIX / "topo" / "nvsmi-topo-m-a100-40gb-8gpu-azure-ndv4-blank-nic-names-ansi.txt")
    why = gpudirect.nearest_nics(blank, ("mlx5_0",), 8)
    assert isinstance(why, str)
    assert "cannot be told" in why
    nine = gpudirect.nearest_nics(_topo(H100_TOPO), SIX, 9)
    assert nine == "nvidia-smi topo -m shows no GPU8: its nearest adapter cannot be told"


def _exp(
    method: str | None = gpudirect.PEERMEM,
    nics: tuple[ExpectedNic, ...] = (ExpectedNic("mlx5_1", "ib", "infiniband", 400),),
    gpus: int = 1,
    **thresholds: float,
) -> NodeExpectation:
    return NodeExpectation(
        node="gpu001",
        group="gpu",
        gpu_count=gpus,
        nics=nics,
        gpudirect=method,
        thresholds={"ib_write_bw_gbps": None, **thresholds},
    )


def test_the_plan_runs_one_gpudirect_ib_write_bw_per_gpu_where_perftest_has_cuda() -> None:
    plan = {p.kind: p for p in probes_for(_exp(gpus=8), "standard")}
    runs = [plan[gpudirect.kind(g)] for g in range(8)]
    assert all(p.per_gpu and p.exclusive for p in runs)
    assert shlex.join(runs[3].argv) == (
        "env CUDA_DEVICE_ORDER=PCI_BUS_ID /opt/perftest-cuda/current/bin/ib_write_bw -d '{hca}' "
        "-p 19318 -s 8388608 -F --report_gbits --use_cuda=3"
    )
    dmabuf = {p.kind: p for p in probes_for(_exp(gpudirect.DMABUF, gpus=8), "standard")}
    assert dmabuf[gpudirect.kind(0)].argv[-1] == "--use_cuda_dmabuf"
    # not at quick, not without a perftest built with CUDA, not without GPUs
    assert not any(p.per_gpu for p in probes_for(_exp(gpus=8), "quick"))
    assert not any(p.per_gpu for p in probes_for(_exp(None, gpus=8), "standard"))
    assert not any(p.per_gpu for p in probes_for(_exp(gpus=0), "standard"))


def _output(text: str | None, rc: int | None = 0, error: str | None = None) -> ProbeOutput:
    return ProbeOutput(gpudirect.kind(0), text, rc=rc, error=error)


def _judge(exp: NodeExpectation, *outputs: ProbeOutput, **extra: ProbeOutput) -> list[CheckResult]:
    kinds = {gpudirect.kind(i): out for i, out in enumerate(outputs)}
    return judge_gpudirect(exp, Evidence({**kinds, **extra}))


def _fixture(name: str) -> str:
    return capture_output(FIX / "perftest" / name)


A40 = "ib-write-bw-use-cuda-dmabuf-a40-cx7-roce-16qp-60s-gbits-client.txt"  # mlx5_1, 181.46
H200 = "ib-write-bw-use-cuda-dmabuf-h200-gke-roce-all-sizes-gbits-client.txt"  # mlx5_3, 140.40


def test_a_gpu_buffer_run_is_judged_against_the_adapters_floor_both_ways() -> None:
    roce200 = (ExpectedNic("mlx5_1", "roce", "roce", 200),)
    ok = _judge(_exp(gpudirect.DMABUF, roce200, ib_write_bw_gbps=180), _output(_fixture(A40)))
    assert [(r.verdict, r.subject, r.measured) for r in ok] == [(Verdict.OK, "GPU0", 181.46)]
    assert "via mlx5_1 (DMA-BUF)" in ok[0].message
    low = _judge(_exp(gpudirect.DMABUF, roce200, ib_write_bw_gbps=190), _output(_fixture(A40)))
    assert [r.verdict for r in low] == [Verdict.FAIL]
    assert low[0].message.startswith("181.46 Gb/s < 190 Gb/s")
    # an H200 behind a VM's RoCE 400 adapter: 140.4 Gb/s, far below the 360 floor
    roce400 = (ExpectedNic("mlx5_3", "roce", "roce", 400),)
    h200 = _judge(_exp(gpudirect.DMABUF, roce400, ib_write_bw_gbps=360), _output(_fixture(H200)))
    assert [(r.verdict, r.measured) for r in h200] == [(Verdict.FAIL, 140.4)]


def _smi(bus: str) -> ProbeOutput:
    xml = (
        '<?xml version="1.0" ?><nvidia_smi_log><driver_version>550.90.07</driver_version>'
        "<attached_gpus>1</attached_gpus>"
        f'<gpu id="{bus}"><product_name>NVIDIA H200</product_name><minor_number>0</minor_number>'
        f"<pci><pci_bus_id>{bus}</pci_bus_id></pci></gpu></nvidia_smi_log>"
    )
    return ProbeOutput("smi-xml", xml)


def test_a_run_on_another_gpu_than_asked_is_not_judged() -> None:
    roce400 = (ExpectedNic("mlx5_3", "roce", "roce", 400),)
    exp = _exp(gpudirect.DMABUF, roce400, ib_write_bw_gbps=100)
    same = _judge(exp, _output(_fixture(H200)), **{"smi-xml": _smi("00000000:8F:00.0")})
    assert [r.verdict for r in same] == [Verdict.OK]
    other = _judge(exp, _output(_fixture(H200)), **{"smi-xml": _smi("00000000:18:00.0")})
    assert [r.verdict for r in other] == [Verdict.UNKNOWN]
    assert other[0].message == "ib_write_bw used the GPU at 8f:00, not GPU0 (18:00): not judged"


@pytest.mark.parametrize(
    "fixture",
    [
        "ib-write-bw-use-cuda-no-dmabuf-couldnt-allocate-mr-error14-fragment.txt",
        "ib-write-bw-use-cuda-a30-vgpu-couldnt-allocate-mr-rdma-cm-segfault-client.txt",
        "ib-write-bw-use-cuda-k80-old-perftest-couldnt-allocate-mr-server.txt",
    ],
)
def test_an_adapter_that_cannot_register_gpu_memory_fails_the_gpu(fixture: str) -> None:
    results = _judge(_exp(ib_write_bw_gbps=375), _output(_fixture(fixture), rc=1))
    assert [(r.verdict, r.subject) for r in results] == [(Verdict.FAIL, "GPU0")]
    assert "could not register GPU0's memory (Couldn't allocate MR" in results[0].message
    assert "nvidia-peermem is not loaded or not effective" in results[0].message


def test_what_did_not_measure_gpu_memory_is_unknown_never_a_pass() -> None:
    exp = _exp(ib_write_bw_gbps=1)
    no_cuda = _judge(
        exp, _output(_fixture("ib-write-bw-built-without-cuda-unrecognized-option.txt"))
    )
    assert [r.verdict for r in no_cuda] == [Verdict.UNKNOWN]
    assert "built without CUDA" in no_cuda[0].message
    # a host-memory run (a perftest that ignored --use_cuda) is no GPUDirect measurement
    host = _judge(exp, _output(_fixture("ib-write-bw-loopback-ib-8M-server-and-client-mbsec.txt")))
    assert [r.verdict for r in host] == [Verdict.UNKNOWN]
    assert "none of perftest's CUDA lines" in host[0].message
    assert [r.message for r in _judge(_exp(gpus=2), _output(_fixture(A40)))][1] == "not measured"
    missing = _output(None, rc=None, error="not run: nvidia-smi topo -m did not run cleanly")
    assert [(r.verdict, r.message) for r in _judge(exp, missing)] == [
        (Verdict.UNKNOWN, "perftest.gdr.gpu0: not run: nvidia-smi topo -m did not run cleanly")
    ]
    # node-check judges a node alone: no GPUDirect result at all
    alone = judge_gpudirect(exp, Evidence({gpudirect.kind(0): _output(_fixture(A40))}, pairs=False))
    assert alone == []


# -- the lab's stand-in: the same layout, judged the same way ------------------------------

H100 = "hgx-h100-ndr"


def _standin_run(gpu: int, *faults: str, dmabuf: bool = False) -> tuple[str, str, int]:
    profile = profiles.load(H100)
    found: dict[str, Any] = {}
    for text in faults:
        name, _, value = text.partition("=")
        found = apply(found, name, value)
    args = perf.PerftestArgs(
        server="198.18.0.11", device="mlx5_3", size=8 << 20, gbits=True, cuda=gpu, dmabuf=dmabuf
    )
    try:
        return perf.ib_write_bw(profile, found, "gpu001", args), "", 0
    except perf.ToolFailure as exc:
        return exc.stdout, exc.output, exc.status


def test_the_standin_prints_perftests_cuda_layout_and_the_judge_passes_it() -> None:
    out, err, rc = _standin_run(3)
    assert (err, rc) == ("", 0)
    data = parse("perftest", out).data
    assert data["cuda"]["device"] == 3
    assert data["cuda"]["listed"][3] == {"index": 3, "pci": "5d:00"}  # the profile's 4th GPU
    nic = (ExpectedNic("mlx5_3", "ib", "infiniband", 400),)
    runs = [_output(_standin_run(g)[0]) for g in range(4)]
    results = _judge(_exp(nics=nic, gpus=4, ib_write_bw_gbps=375), *runs)
    assert [r.verdict for r in results] == [Verdict.OK] * 4, [r.message for r in results]
    assert results[3].message.startswith("390") or " >= 375 Gb/s" in results[3].message


@pytest.mark.parametrize("dmabuf", [False, True])
def test_the_gpudirect_fault_makes_the_standin_fail_as_perftest_does(dmabuf: bool) -> None:
    out, err, rc = _standin_run(3, "gpudirect_broken=3", dmabuf=dmabuf)
    assert rc == 1
    assert err.startswith("Couldn't allocate MR")
    text = both_streams(ExecResult(out.encode(), err.encode(), rc)).stdout.decode()
    nic = (ExpectedNic("mlx5_3", "ib", "infiniband", 400),)
    method = gpudirect.DMABUF if dmabuf else gpudirect.PEERMEM
    results = _judge(_exp(method, nic, ib_write_bw_gbps=375), _output(text, rc=1))
    assert [r.verdict for r in results] == [Verdict.FAIL]
    assert _standin_run(2, "gpudirect_broken=3")[2] == 0  # another GPU is fine


def test_the_distributions_perftest_refuses_use_cuda() -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    rc = standin._bw_test(
        "ib_write_bw", "gpu001", ["-d", "mlx5_0", "--use_cuda=0"], standin._Out(stdout, stderr)
    )
    assert rc == 1
    assert stderr.getvalue().startswith("ib_write_bw: unrecognized option '--use_cuda=0'")


# -- the collector's side: the adapter from this run's topo -m, server then client ----------


class _Running:
    def __init__(self, ready: bool, result: ExecResult) -> None:
        self.ready, self.result = ready, result

    def wait_for(self, text: str, timeout: float) -> bool:
        return self.ready

    def finish(self, wait_s: float | None = None) -> ExecResult:
        return self.result


class _Session:
    def __init__(self, server: _Running, client: ExecResult) -> None:
        self.server, self.client = server, client
        self.started: list[tuple[str, ...]] = []

    def spawn(self, argv: tuple[str, ...], timeout_s: float) -> _Running:
        self.started.append(argv)
        return self.server

    def run(self, argv: tuple[str, ...], timeout_s: float) -> ExecResult:
        self.started.append(argv)
        return self.client


def _folder(tmp_path: Path) -> NodeFolder:
    folder = NodeFolder(tmp_path / "gpu001")
    folder.folder.mkdir()
    topo = capture_output(H100_TOPO).encode()
    folder.record("topo", ExecResult(topo, b"", 0), ("nvidia-smi", "topo", "-m"), 30)
    return folder


def _probe(gpu: int) -> Probe:
    exp = _exp(nics=tuple(ExpectedNic(h, "ib", "infiniband", 400) for h in SIX), gpus=8)
    return next(p for p in probes_for(exp, "standard") if p.kind == gpudirect.kind(gpu))


def test_the_collector_runs_the_loopback_on_the_gpus_nearest_adapter(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    exp = _exp(nics=tuple(ExpectedNic(h, "ib", "infiniband", 400) for h in SIX), gpus=8)
    routed = routes(folder, exp)
    out, _, _ = _standin_run(4)
    session = _Session(_Running(True, ExecResult(b"", b"", 0)), ExecResult(out.encode(), b"", 0))
    run_gpu(folder, session, _probe(4), exp, "198.18.0.11", routed, lambda hca: ())  # type: ignore[arg-type]
    server, client = session.started
    assert server[server.index("-d") + 1] == "mlx5_3"
    assert "--use_cuda=4" in server
    assert client == (*server, "198.18.0.11")
    folder.write_meta()
    bundle = load_node_bundle("gpu001", folder.folder)
    assert folder.probes[gpudirect.kind(4)]["hca"] == "mlx5_3"
    assert bundle.outputs[gpudirect.kind(4)].text == out


def test_a_server_that_fails_leaves_its_own_words_and_no_topo_leaves_a_reason(
    tmp_path: Path,
) -> None:
    folder = _folder(tmp_path)
    exp = _exp(nics=tuple(ExpectedNic(h, "ib", "infiniband", 400) for h in SIX), gpus=8)
    out, err, rc = _standin_run(0, "gpudirect_broken")
    failed = _Running(False, ExecResult(out.encode(), err.encode(), rc))
    session = _Session(failed, ExecResult(error="never run"))
    run_gpu(folder, session, _probe(0), exp, "a", routes(folder, exp), lambda hca: ())  # type: ignore[arg-type]
    assert len(session.started) == 1  # no client without a server
    text = (folder.folder / f"{gpudirect.kind(0)}.txt").read_text()
    assert "Couldn't allocate MR" in text
    assert "Picking device No. 0" in text
    empty = NodeFolder(tmp_path / "gpu002")
    empty.folder.mkdir()
    why = routes(empty, exp)
    assert why == "nvidia-smi topo -m did not run cleanly in this run: no adapter per GPU"
    run_gpu(empty, session, _probe(1), exp, "a", why, lambda hca: ())  # type: ignore[arg-type]
    assert empty.probes[gpudirect.kind(1)]["error"] == f"not run: {why}"
    assert replace(exp, gpudirect=None).gpudirect is None


def test_the_registration_follows_the_stack_and_the_kernel_modules() -> None:
    """nvidia-peermem with DOCA-OFED, or with the proprietary modules (no DMA-BUF there);
    DMA-BUF with the open modules and inbox rdma-core; nothing without software.perftest."""
    cluster = load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml")

    def method(
        stack: str, modules: str, peermem: bool = True, perftest: str | None = "x"
    ) -> str | None:
        sw = cluster.software
        rdma = sw.rdma.model_copy(update={"stack": RdmaStack(stack), "peermem": peermem})
        driver = sw.driver.model_copy(update={"kernel_modules": KernelModules(modules)})
        update = {"rdma": rdma, "driver": driver, "perftest": perftest}
        return gpudirect_method(
            cluster.model_copy(update={"software": sw.model_copy(update=update)})
        )

    assert method("doca-ofed", "open") == gpudirect.PEERMEM
    assert method("doca-ofed", "proprietary") == gpudirect.PEERMEM
    assert method("inbox", "open") == gpudirect.DMABUF
    assert method("inbox", "proprietary") == gpudirect.PEERMEM
    assert method("doca-ofed", "open", peermem=False) == gpudirect.DMABUF
    assert method("inbox", "open", perftest=None) is None
