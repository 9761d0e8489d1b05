"""The records the nccl, dcgm, Xid, topology, NVLink, Fabric Manager and Slurm judges read, each
built from its parser's data by one function next to the parser: what the output did not show
is None (never 0), a number is kept as it is (also one that is not finite: the judge FAILs
it), and the data itself is not changed."""

from __future__ import annotations

import copy
import math
from typing import Any

from helpers import ROOT

from gpuctl.validation.capture import capture_output
from gpuctl.validation.parsers.dcgm import diag_of
from gpuctl.validation.parsers.fabricmanager import fabric_manager_of
from gpuctl.validation.parsers.kernel import FallenOffBus, XidEvent, kernel_log_of
from gpuctl.validation.parsers.nccl import NcclRank, NcclSide, nccl_rows_of, nccl_run_of
from gpuctl.validation.parsers.nvlink_status import nvlink_gpus_of
from gpuctl.validation.parsers.slurm import ScontrolNode, scontrol_nodes_of
from gpuctl.validation.parsers.topo import topology_of
from gpuctl.validation.parsing import parse

FIX = ROOT / "tests" / "fixtures"


def data_of(kind: str, rel: str) -> dict[str, Any]:
    result = parse(kind, capture_output(FIX / rel))
    assert result.recognised, result.problems
    return result.data


def test_nccl_run() -> None:
    data = data_of("nccl", "nccl-tests/all-reduce-perf-a100-sxm4-40gb-8gpu-with-nccl-info-line.txt")
    before = copy.deepcopy(data)
    run = nccl_run_of(data)
    assert data == before
    assert len(run.rows) == 34
    last = run.rows[-1]
    assert last.size == 8589934592
    # this table has the old "error" column: no #wrong count, None (not 0)
    assert last.out_of_place == NcclSide(busbw=235.26, wrong=None)
    assert run.ranks[0] == NcclRank(host="localhost", device=0, busid="0x00")
    assert (run.errors, run.out_of_bounds) == ((), 0)
    assert nccl_rows_of(data) == run.rows
    assert run.table()[-1] == {
        "size": 8589934592,
        "out_of_place": {"busbw": 235.26},
        "in_place": {"busbw": 235.03},
    }


def test_nccl_values_kept_as_they_are() -> None:
    data: dict[str, Any] = {
        "rows": [
            {"size": 8, "out_of_place": {"busbw": math.nan, "wrong": 10**400}, "in_place": None}
        ],
        "out_of_bounds": math.inf,
    }
    run = nccl_run_of(data)
    side = run.rows[0].out_of_place
    assert side is not None
    assert math.isnan(side.busbw or 0.0)
    assert side.wrong == 10**400
    assert run.rows[0].in_place is None
    assert run.out_of_bounds == math.inf
    assert (run.ranks, run.errors) == ((), ())
    assert run.table() == [{"size": 8, "out_of_place": {"busbw": side.busbw}, "in_place": None}]


def test_dcgm_diag() -> None:
    diag = diag_of(
        data_of("dcgm-diag", "dcgm/dcgmi-diag-r2-gpu-memory-fail-thermal-warning-fragment.txt")
    )
    assert diag.overall == "Fail"
    [test] = diag.tests
    assert (test.name, test.result) == ("GPU Memory", "Fail")
    # the messages as the evidence has always shown them: their entries, printed
    assert test.messages[0].startswith("{'level': 'Warning', 'text': 'GPU 0 Thermal violations")
    assert diag_of({}).overall is None
    assert diag_of({"tests": [{"name": "x", "messages": 5}]}).tests[0].messages == ()


def test_kernel_log() -> None:
    log = kernel_log_of(
        data_of("xid", "kernel-xid/journal-kernel-xid-79-fallen-off-bus-companion-44.txt")
    )
    assert log.events[0] == XidEvent(
        pci="0000:01:00", xid=79, message="GPU has fallen off the bus.", timestamp="Nov 07 18:17:15"
    )
    assert log.fallen_off_bus == (FallenOffBus(pci="0000:01:00", timestamp="Nov 07 18:17:15"),)
    odd = kernel_log_of({"events": [{"pci": "x", "xid": "79", "timestamp": 5}]})
    # an Xid that is not a number is not counted; an entry without a message shows ""
    assert odd.events == (XidEvent(pci="x", xid=None, message="", timestamp=None),)


def test_topology() -> None:
    topo = topology_of(data_of("topo", "topo/nvsmi-topo-m-h100-8gpu-6nic-blank-cpuaffinity.txt"))
    assert topo.gpus == tuple(f"GPU{i}" for i in range(8))
    assert topo.nics == tuple(f"NIC{i}" for i in range(6))
    assert (topo.link("GPU0", "GPU1"), topo.link("GPU0", "NIC0")) == ("NV18", "PIX")
    assert topo.link("GPU0", "GPU9") is None
    assert topology_of({}) == topology_of({"gpus": None, "nics": 3, "links": None})


def test_nvlink() -> None:
    gpus = nvlink_gpus_of(data_of("nvlink", "nvidia-smi/nvlink-s-v100-8gpu-inactive-links.txt"))
    assert [g.index for g in gpus] == [0, 1, 2, 3, 4, 5, 6]  # the capture lists seven
    assert gpus[3].index == 3
    assert gpus[3].uuid == "GPU-50b1bd2e-77ee-2731-fd2f-17c44103b7b9"
    assert (gpus[3].links, gpus[3].inactive) == ((0, 1, 2, 3, 4, 5), (3, 5))
    assert [g.index for g in gpus if g.inactive] == [3, 4, 5, 6]
    # a link whose state could not be read is not inactive
    [gpu] = nvlink_gpus_of({"gpus": [{"index": 0, "links": [{"link": 0, "active": None}]}]})
    assert (gpu.uuid, gpu.links, gpu.inactive) == (None, (0,), ())


def test_fabric_manager() -> None:
    running = fabric_manager_of(
        data_of(
            "fabricmanager",
            "fabric-manager/systemctl-status-fabricmanager-active-running-h100-rhel-ai.txt",
        )
    )
    assert (running.active, running.state, running.errors) == (True, "active (running)", ())
    failed = fabric_manager_of(
        data_of(
            "fabricmanager",
            "fabric-manager/systemctl-restart-fabricmanager-failed-plus-journal-h20.txt",
        )
    )
    assert (failed.active, failed.version) == (None, None)  # not systemctl status: not known
    assert failed.errors[0].startswith("{'timestamp': None, 'message': 'Job for nvidia-fabric")
    assert fabric_manager_of({"active": "yes"}).active is None


def test_scontrol_nodes() -> None:
    [node] = scontrol_nodes_of(
        data_of("scontrol-node", "slurm/scontrol-show-node-idle-drain-gres-count-lower-rtx3090.txt")
    )
    assert node == ScontrolNode(
        name="yigou-dev-102-68",
        state="IDLE",
        state_flags=("DRAIN",),
        reason="gres/gpu count reported lower than configured (0 < 1)",
    )
    assert node.state_record() == {
        "state": "IDLE",
        "state_flags": ["DRAIN"],
        "reason": "gres/gpu count reported lower than configured (0 < 1)",
    }
