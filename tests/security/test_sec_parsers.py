"""Security issue 14: numbers that no tool prints must neither crash a parser nor come out as
NaN, infinity or a size past any plausible reading.

Python's ``int()`` refuses strings of more than 4,300 digits with a ValueError; through one
node's output that used to abort ``gpuctl validate`` for the whole cluster. ``float()`` turns
``nan``, ``inf`` and ``1e400`` into non-finite floats that JSON cannot hold and that every
comparison of a judge gets wrong. A parser refuses such a field (None, "unknown"), never
crashes, never returns it, never returns 0 in its place.

Every parser kind in the registry is run on its real fixtures (tests/fixtures/**/*.txt with a
``.expect.yml``) with their numbers replaced by a 5,000-digit integer, all at once and one at a
time; then a few direct cases: nan/inf/1e308 in an nccl-tests table, 1e308 in an ib_write_bw
result line, inf in nvidia-smi CSV, NaN and huge integers in JSON. The rollout tool parsers
(mlxfwmanager, flint, nvfwupd) fail closed: on such input they raise ToolOutputError, nothing else.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT

from gpuctl.rollout import tools
from gpuctl.validation.capture import capture_output
from gpuctl.validation.numbers import implausible_numbers
from gpuctl.validation.parsing import ParseResult, registry

FIXTURES = ROOT / "tests" / "fixtures"
HUGE = "9" * 5000
# No parsed number may reach this size (gpuctl.validation.numbers refuses more than 30 digits).
# Positions tried per fixture when one number at a time is replaced (spread over the body).
PER_FIXTURE = 24
_DIGITS = re.compile(r"\d+")


def _corpus() -> dict[str, list[tuple[Path, str, dict[str, Any]]]]:
    out: dict[str, list[tuple[Path, str, dict[str, Any]]]] = defaultdict(list)
    for path in sorted(FIXTURES.rglob("*.txt")):
        expect = path.with_suffix(".expect.yml")
        if expect.is_file():
            exp = yaml.safe_load(expect.read_text(encoding="utf-8"))
            out[exp["kind"]].append((path, capture_output(path), exp.get("options") or {}))
    return out


CORPUS = _corpus()
KINDS = sorted(registry())


bad_numbers = implausible_numbers  # the numbers module's contract, checked on every result


def parsed(kind: str, text: str, options: dict[str, Any], label: str = "") -> ParseResult:
    """Parse ``text``: no exception, a result of the kind, no bad number, valid strict JSON."""
    try:
        result = registry()[kind].func(text, **options)
    except Exception as exc:  # the point of the test: name the input that crashed
        raise AssertionError(f"{kind} {label}: {type(exc).__name__}: {str(exc)[:160]}") from exc
    assert isinstance(result, ParseResult)
    assert result.kind == kind
    bad = bad_numbers(result.data)
    assert not bad, f"{kind} {label}: {bad[:5]}"
    json.dumps(result.to_json(), allow_nan=False)
    return result


def _fixture(name: str) -> str:
    return capture_output(next(FIXTURES.rglob(name)))


def test_every_parser_kind_has_a_real_fixture() -> None:
    assert set(KINDS) <= set(CORPUS), sorted(set(KINDS) - set(CORPUS))


@pytest.mark.parametrize("kind", KINDS)
def test_every_number_replaced_by_a_huge_integer(kind: str) -> None:
    for path, body, options in CORPUS[kind]:
        parsed(kind, _DIGITS.sub(HUGE, body), options, path.name)


@pytest.mark.parametrize("kind", KINDS)
def test_one_number_at_a_time_replaced_by_a_huge_integer(kind: str) -> None:
    for path, body, options in CORPUS[kind]:
        spots = list(_DIGITS.finditer(body))
        step = max(1, len(spots) // PER_FIXTURE)
        for spot in spots[::step]:
            text = body[: spot.start()] + HUGE + body[spot.end() :]
            parsed(kind, text, options, f"{path.name} at offset {spot.start()}")


# ------------------------------------------------------------------------------------------
# direct cases

_NCCL = "all-reduce-perf-a100-sxm4-80gb-8gpu-mpi-nccl2.16-hostname-placeholder.txt"
# columns of an nccl-tests row with redop and root: out-of-place busbw, in-place busbw
_OUT_BUSBW, _IN_BUSBW = 7, 11


def _nccl_with(values: list[tuple[str, str]], avg: str | None = None) -> str:
    """The real table with row i's out-of-place and in-place busbw replaced."""
    lines = _fixture(_NCCL).splitlines()
    rows = [i for i, line in enumerate(lines) if line.strip()[:1].isdigit()]
    for row, (out_of_place, in_place) in zip(rows, values, strict=False):
        tokens = lines[row].split()
        tokens[_OUT_BUSBW], tokens[_IN_BUSBW] = out_of_place, in_place
        lines[row] = "  ".join(tokens)
    if avg is not None:
        lines = [
            f"# Avg bus bandwidth    : {avg}" if line.startswith("# Avg bus") else line
            for line in lines
        ]
    return "\n".join(lines) + "\n"


def test_nccl_nan_and_inf_busbw_are_unknown_not_numbers() -> None:
    text = _nccl_with([("nan", "inf"), ("-inf", "NaN"), ("1e400", "1e308")], avg="inf")
    result = parsed("nccl", text, {})
    rows = result.data["rows"]
    assert len(rows) == 6  # the rows stay; only the unreadable values are unknown
    for row in rows[:3]:
        assert row["out_of_place"]["busbw"] is None, row
        assert row["in_place"]["busbw"] is None, row
    assert rows[3]["out_of_place"]["busbw"] == pytest.approx(223.05)  # untouched rows read
    assert result.data["avg_busbw"] is None
    assert any("Avg bus bandwidth" in p for p in result.problems)


def test_nccl_huge_avg_busbw_and_size_do_not_crash() -> None:
    text = _nccl_with([(HUGE, HUGE)], avg=HUGE)
    text = re.sub(r"^33554432\b", HUGE, text, count=1, flags=re.MULTILINE)
    result = parsed("nccl", text, {})
    assert result.data["avg_busbw"] is None
    assert all(row["size"] is not None for row in result.data["rows"])  # that row is refused
    assert len(result.data["rows"]) == 5


_PERFTEST = "ib-write-bw-postlist-roce-gbits-8B-trimmed.txt"
_PERFTEST_ROW = " 8          224958464        0.00               0.48   \t\t   7.498617"


@pytest.mark.parametrize(
    "row",
    [
        " 8          224958464        1e308              1e308             7.498617",
        " 8          224958464        0.00               1e400             7.498617",
        " 8          224958464        0.00               inf               7.498617",
        " 8          224958464        nan                0.48              7.498617",
        f" 8          {HUGE}        0.00               0.48              7.498617",
    ],
    ids=["1e308", "1e400", "inf", "nan", "huge-iterations"],
)
def test_ib_write_bw_line_with_implausible_bandwidth_is_refused(row: str) -> None:
    body = _fixture(_PERFTEST)
    assert _PERFTEST_ROW in body
    result = parsed("perftest", body.replace(_PERFTEST_ROW, row), {})
    assert result.recognised
    assert result.data["rows"] == []  # the result line is not taken as a measurement
    assert any("not understood" in p or "do not fit" in p for p in result.problems)


_CSV = "query-gpu-csv-h100-allfields-590.txt"


@pytest.mark.parametrize(
    "bad",
    ["inf", "-inf", "nan", "1e400", "1e308", HUGE],
    ids=["inf", "-inf", "nan", "1e400", "1e308", "5000-digits"],
)
def test_nvidia_smi_csv_non_finite_cell_is_unknown(bad: str) -> None:
    lines = _fixture(_CSV).splitlines()
    header = [c.strip() for c in lines[0].split(",")]
    cells = [c.strip() for c in lines[1].split(",")]
    column = header.index("power.draw [W]")
    unit = " W" if cells[column].endswith(" W") else ""
    cells[column] = bad + unit
    text = "\n".join([lines[0], ", ".join(cells), *lines[2:]]) + "\n"
    result = parsed("smi-csv", text, {})
    assert result.data["values"][0]["power.draw [W]"] is None
    assert any("power.draw" in p for p in result.problems), result.problems
    assert isinstance(result.data["values"][0]["temperature.gpu"], int)  # the rest is read


def test_dcgm_json_with_huge_integers_and_nan_is_read_without_them() -> None:
    doc = (
        '{"DCGM GPU Diagnostic": {"version": "3.3.5", "gpu_id": ' + HUGE + ", "
        '"test_categories": [{"category": "Deployment", "tests": [{"name": "Denylist", '
        '"results": [{"gpu_id": NaN, "status": "Pass"}, {"gpu_id": ' + HUGE + ', "status": '
        '"Pass"}, {"gpu_id": 0, "status": "Pass"}], "test_summary": {"status": "Pass"}}]}], '
        '"metadata": {"temperature": Infinity, "limit": 1e400, "count": -0}}}'
    )
    result = parsed("dcgm-diag", doc, {})
    assert result.recognised
    assert result.data["tests"][0]["gpus"] == {"0": "Pass"}
    assert "temperature" not in result.data["metadata"]
    assert "limit" not in result.data["metadata"]


def test_dcgm_json_nested_too_deep_is_a_problem_not_a_crash() -> None:
    doc = '{"DCGM GPU Diagnostic": ' + "[" * 100_000 + "]" * 100_000 + "}"
    result = parsed("dcgm-diag", doc, {})
    assert result.data["tests"] == []
    assert result.problems


# ------------------------------------------------------------------------------------------
# rollout tool parsers (gpuctl.rollout.tools): they fail closed, with ToolOutputError only

_ROLLOUT: list[tuple[str, Callable[[str], object]]] = [
    ("mlxfwmanager-query-cx3pro-fw-running-pending-windows.txt", tools.parse_mlxfwmanager_query),
    ("mlxup-query-cx6lx-update-required.txt", tools.parse_mlxfwmanager_query),
    (
        "flint-query-full-cx3-fw-version-running-pending.txt",
        lambda text: tools.parse_flint_query(text, "/dev/mst/mt4099_pci_cr0"),
    ),
    (
        "mlxup-update-cx7-2dev-burn-restart-needed.out",
        lambda text: tools.parse_mlxfwmanager_update(text, 0),
    ),
    ("flint-burn-cx3pro-fs2-windows.out", lambda text: tools.parse_flint_burn(text, 0)),
    ("nvfwupd-show-version-json-dgxh100-hgx-8gpu.out", tools.parse_nvfwupd_show_version),
]


@pytest.mark.parametrize(("name", "parse"), _ROLLOUT, ids=[n for n, _ in _ROLLOUT])
def test_rollout_parsers_fail_closed_on_huge_integers(
    name: str, parse: Callable[[str], object]
) -> None:
    body = _fixture(name)
    parse(body)  # the real output reads
    texts = [_DIGITS.sub(HUGE, body)]
    texts += [body[: m.start()] + HUGE + body[m.end() :] for m in _DIGITS.finditer(body)]
    for text in texts:
        # refused with a message (the executor fails the node); any other exception escapes
        with contextlib.suppress(tools.ToolOutputError):
            parse(text)


@pytest.mark.parametrize(
    "value",
    ["NaN", "Infinity", "1e400", HUGE, "[0]", "{}"],
    ids=["NaN", "Infinity", "1e400", "5000-digits", "list", "object"],
)
def test_nvfwupd_error_code_that_is_not_zero_fails_closed(value: str) -> None:
    body = _fixture("nvfwupd-show-version-json-dgxh100-hgx-8gpu.out")
    text = re.sub(r'"Error Code":\s*0', f'"Error Code": {value}', body)
    assert text != body
    with pytest.raises(tools.ToolOutputError, match="error code"):
        tools.parse_nvfwupd_show_version(text)


def test_nvfwupd_version_that_is_a_list_or_huge_is_no_version() -> None:
    body = _fixture("nvfwupd-show-version-json-dgxh100-hgx-8gpu.out")
    text = body.replace('"96.00.BC.00.01"', HUGE, 1).replace('"96.00.BC.00.01"', "[1]", 1)
    inventory = tools.parse_nvfwupd_show_version(text)
    assert [d.sys_version for d in inventory.devices if d.sys_version is None]
    with pytest.raises(tools.ToolOutputError):
        tools.gpu_firmware_versions(inventory)
