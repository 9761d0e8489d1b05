"""Parsers turn text into numbers only through gpuctl.validation.numbers.

``int()`` on a digit string of more than 4,300 digits raises ValueError, and ``float()``
turns ``1e400`` into inf: one hostile or corrupt line in one node's output would abort a
whole validation or leak a non-finite number into a verdict. The fuzz tests in
tests/security find such a call only for the fixtures they mutate (and in the integration
tier); this test finds every direct call in the unit tier, before any fixture exists. It
failed on the perftest parser's ``int(m.group(1))`` for CUDA device numbers (CI of stop 27).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpuctl.validation.parsers as parsers_pkg
from gpuctl.validation.parsers.nccl import nccl_size
from gpuctl.validation.parsers.perftest import parse_perftest

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parent.parent / "fixtures" / "perftest"
_PACKAGE = Path(parsers_pkg.__file__).parent.parent.parent
# the validation parsers, their shared helpers, and the rollout's parsers of tool and BMC output
PARSERS = [
    *sorted(Path(parsers_pkg.__file__).parent.glob("*.py")),
    _PACKAGE / "validation" / "parsing.py",
    _PACKAGE / "rollout" / "tools.py",
    _PACKAGE / "rollout" / "redfish.py",
]
_FORBIDDEN = {"int", "float"}


def _direct_conversions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FORBIDDEN
            and node.args  # int() with no argument converts nothing
        ):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_the_parser_modules_are_found() -> None:
    names = {p.name for p in PARSERS}
    assert {"perftest.py", "nccl.py", "node.py", "dcgm.py", "tools.py", "redfish.py"} <= names
    assert all(p.is_file() for p in PARSERS)


@pytest.mark.parametrize("path", PARSERS, ids=lambda p: p.name)
def test_no_parser_calls_int_or_float_itself(path: Path) -> None:
    assert _direct_conversions(path) == []


def test_the_check_sees_a_direct_call(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import re\nm = re.match('(\\\\d+)', 'x')\nvalue = int(m.group(1))\n")
    assert _direct_conversions(bad) == ["bad.py:3: int(m.group(1))"]


def test_a_cuda_device_number_of_5000_digits_is_unknown_not_a_crash() -> None:
    name = "ib-write-bw-use-cuda-a30-vgpu-couldnt-allocate-mr-rdma-cm-segfault-client.txt"
    body = (FIXTURES / name).read_text()
    assert "CUDA device 0: PCIe address is 02:00" in body
    assert "Picking device No. 0" in body
    huge = "9" * 5000
    text = body.replace("CUDA device 0:", f"CUDA device {huge}:").replace(
        "Picking device No. 0", f"Picking device No. {huge}"
    )
    cuda = parse_perftest(text).data["cuda"]
    assert cuda["listed"] == [{"index": None, "pci": "02:00"}]
    assert cuda["name"] == "NVIDIA A30-8C"
    assert parse_perftest(body).data["cuda"]["listed"] == [{"index": 0, "pci": "02:00"}]


def test_an_nccl_size_of_5000_digits_is_none() -> None:
    assert nccl_size("9" * 5000) is None
    assert nccl_size("8G") == 8 << 30
