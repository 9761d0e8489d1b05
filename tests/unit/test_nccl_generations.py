"""nccl-tests from the first layout (2017) to the current one, and runs smaller than asked.

Layouts, from nccl-tests' own history (NVIDIA/nccl-tests src/common.cu, src/util.cu):
- b188a15 (2017-08, the first): ``nThread ...`` and the ``Out of bounds``/``Avg bus bandwidth``
  trailer printed without a leading ``#``, ``#   Rank  0 on <host> device ...`` without a Pid,
  the header ``bytes N type op time algbw busbw res`` with the time in milliseconds;
- cbe7f65 (2019-03, NCCL 2.4): ``#`` on every header/trailer line, ``Pid`` in the rank lines,
  ``size count type redop time algbw busbw error`` (us);
- 51af557/d313d20 (2022, 2.13): ``#wrong``, ``root``, ``Group``;
- 2.16.7 ``# Collective test starting``, 2.18.5 ``# nccl-tests version``, 2.18.2 ``unalign``.

The busbw threshold holds for a run on every GPU of the node up to the probe's -e (8G).
"""

from __future__ import annotations

import dataclasses

from helpers import ROOT

from gpuctl.config.loader import load_cluster
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import NodeExpectation, expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.nccl import judge_nccl, threshold_size
from gpuctl.validation.parsers.nccl import nccl_run_of, nccl_size
from gpuctl.validation.parsing import parse
from gpuctl.validation.results import CheckResult, Verdict

FIX = ROOT / "tests" / "fixtures" / "nccl-tests"
K80 = "all-reduce-perf-k80-4gpu-azureml-error-column-stops-below-maxbytes.txt"
A100_FULL = "all-reduce-perf-a100-sxm4-40gb-8gpu-with-nccl-info-line.txt"
TABLE_ONLY = "all-reduce-perf-2node-p5-h100-srun-prefix-table-only.txt"


def text(name: str) -> str:
    return capture_output(FIX / name)


def a100(**changes: object) -> NodeExpectation:
    exp = expectations(load_cluster(ROOT / "inventories" / "a100-roce.yml"))["gpu001"]
    return dataclasses.replace(exp, **changes)  # type: ignore[arg-type]


def h100() -> NodeExpectation:
    return expectations(load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml"))["gpu001"]


def busbw(results: list[CheckResult]) -> CheckResult:
    [only] = [r for r in results if r.check == "nccl.busbw"]
    return only


def test_the_threshold_size_is_the_probes_requested_maximum() -> None:
    assert threshold_size() == 8 * 1024**3  # all_reduce_perf ... -e 8G
    assert [nccl_size(s) for s in ("8", "64K", "128M", "8G", "8g")] == [
        8,
        64 << 10,
        128 << 20,
        8 << 30,
        8 << 30,
    ]
    assert nccl_size("eight") is None


def test_the_record_says_how_many_gpus_and_the_largest_size() -> None:
    run = nccl_run_of(parse("nccl", text(K80)).data)
    assert (run.gpus_used, run.largest_size, run.max_bytes) == (4, 2 << 30, 8 << 30)
    full = nccl_run_of(parse("nccl", text(A100_FULL)).data)
    assert (full.gpus_used, full.largest_size, full.max_bytes) == (8, 8 << 30, 8 << 30)
    # two hosts whose names are placeholders: counted by rank, not as one host's 8 devices
    two = parse("nccl", text("all-reduce-perf-a100-2node-16rank-nccl2.12-host-placeholders.txt"))
    assert nccl_run_of(two.data).gpus_used == 16
    assert nccl_run_of(parse("nccl", text(TABLE_ONLY)).data).gpus_used is None


def test_a_run_that_stopped_below_the_threshold_size_is_not_judged() -> None:
    """The K80 run was asked for 8G and stopped at 2G (all_reduce_perf lowers -e to what fits):
    its 2.56 GB/s is not a full-size result. The old code failed it against 228 GB/s."""
    exp = a100(gpu_count=4)
    result = busbw(judge_nccl(exp, {"nccl": ProbeOutput("nccl", text(K80))}))
    assert result.verdict is Verdict.UNKNOWN
    assert "below the 8589934592 B the threshold is defined at" in result.message
    assert (result.measured, result.expected) == (2.56, 228)


def test_a_run_on_fewer_gpus_than_the_node_has_is_not_judged() -> None:
    """4 ranks on an 8-GPU node: "ran on 4 of 8 GPUs", UNKNOWN (the old code: FAIL)."""
    result = busbw(judge_nccl(a100(), {"nccl": ProbeOutput("nccl", text(K80))}))
    assert result.verdict is Verdict.UNKNOWN
    assert "ran on 4 of 8 GPUs" in result.message


def test_a_run_without_a_device_list_is_not_judged() -> None:
    """No '#  Rank' lines: on how many GPUs it ran is unknown (the old code judged it)."""
    result = busbw(judge_nccl(h100(), {"nccl": ProbeOutput("nccl", text(TABLE_ONLY))}))
    assert result.verdict is Verdict.UNKNOWN
    assert "lists no devices" in result.message


def test_a_full_size_run_is_still_judged() -> None:
    ok = busbw(judge_nccl(a100(), {"nccl": ProbeOutput("nccl", text(A100_FULL))}))
    assert (ok.verdict, ok.measured, ok.expected) == (Verdict.OK, 235.26, 228)
    slow = busbw(judge_nccl(h100(), {"nccl": ProbeOutput("nccl", text(A100_FULL))}))
    assert slow.verdict is Verdict.FAIL


# The first layout, line by line as nccl-tests@b188a15 prints it (src/common.cu: printf
# "nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d
# validation: %d \n", "#   Rank %2d on %10s device %2d [0x%02x] %s\n", PRINT(" Out of bounds
# values : %d %s\n"), PRINT(" Avg bus bandwidth    : %g %s\n"); src/all_reduce.cu
# print_header and print_line_header; BenchTime "  %7.3f  %5.2f  %5.2f  %7.0le" in ms). The
# header and rank lines are those of a 2019 run of that layout (RTX 2080 Ti "ncrh", NCCL 2.4);
# no complete public capture of this layout was found.
FIRST_LAYOUT = (
    "nThread 1 nGpus 2 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20 "
    "validation: 1 \n"
    """\
# Using devices
#   Rank  0 on       ncrh device  0 [0x05] GeForce RTX 2080 Ti
#   Rank  1 on       ncrh device  1 [0x06] GeForce RTX 2080 Ti

#                                                 out-of-place                    in-place
#      bytes             N    type      op     time  algbw  busbw      res     time  algbw  busbw      res
           8             2   float     sum    0.010   0.00   0.00    0e+00    0.009   0.00   0.00    0e+00
          16             4   float     sum    0.010   0.00   0.00    0e+00    0.009   0.00   0.00    0e+00

 Out of bounds values : 0 OK
 Avg bus bandwidth    : 0.00125"""  # noqa: E501
    " \n\n"
)


def test_the_first_layout_is_read() -> None:
    """The old parser read no header, no device list, no trailer: rows with nothing around
    them (and the time in ms read as us)."""
    result = parse("nccl", FIRST_LAYOUT)
    assert result.recognised
    assert result.problems == ()
    data = result.data
    assert (data["params"]["n_gpus"], data["params"]["max_bytes"]) == (2, 16)
    assert [(r["rank"], r["pid"], r["host"], r["device"]) for r in data["ranks"]] == [
        (0, None, "ncrh", 0),
        (1, None, "ncrh", 1),
    ]
    assert data["error_column"] == "error"
    trailer = (data["out_of_bounds"], data["out_of_bounds_ok"], data["avg_busbw"])
    assert trailer == (0, True, 0.00125)
    first = data["rows"][0]["out_of_place"]
    assert first["time_us"] == 10.0  # 0.010 ms
    assert (first["error"], first["wrong"]) == (0.0, None)
    assert nccl_run_of(data).gpus_used == 2


def test_current_layouts_still_read_the_same() -> None:
    """2.17.9 (#wrong, Group, 'Collective test' lines): version, column and ranks as before."""
    name = "all-reduce-perf-gh200-4node-16rank-nccl-tests2.17.9-wrong-nonzero.txt"
    gh200 = parse("nccl", text(name))
    assert gh200.data["nccl_tests_version"] == "2.17.9"
    assert gh200.data["error_column"] == "wrong"
    assert nccl_run_of(gh200.data).gpus_used == 16
