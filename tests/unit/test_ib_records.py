"""The typed records the InfiniBand judges read (ibstat_of, perftest_of): built from the
parsers' data, which stays as docs/parse.md describes it; a value not shown is None, never 0."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import ROOT

from gpuctl.validation.capture import capture_output
from gpuctl.validation.parsers.infiniband import IbstatPort, ibstat_of
from gpuctl.validation.parsers.perftest import BwRow, perftest_of
from gpuctl.validation.parsing import parse

FIX = ROOT / "tests" / "fixtures"
PANIC = "ib/ibstat-a100-hdr200-ibpanic-missing-mlx5_8-exit255.txt"
LOOPBACK = "perftest/ib-write-bw-loopback-ib-8M-server-and-client-mbsec.txt"
LATENCY = "perftest/ib-write-lat-dgx-spark-rocep1s0f1-rdma-cm-client-2B.txt"


def body(rel: str) -> str:
    return capture_output(FIX / rel)


def test_ibstat_record_of_a_listing_cut_short_by_ibpanic() -> None:
    result = parse("ibstat", body(PANIC))
    record = ibstat_of(result.data)
    assert list(record.cas) == [f"mlx5_{i}" for i in range(8)]
    assert record.errors == tuple(result.data["errors"])
    assert record.errors
    assert "mlx5_8" in record.errors[0]
    ca = record.cas["mlx5_0"]
    assert ca.node_guid == "0x00155dfffe3411eb"
    assert ca.port("1") == IbstatPort(
        "Active", "LinkUp", 200, "InfiniBand", port_guid="0x00155dfffd3411eb"
    )
    assert ca.port("2") is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        ca.node_guid = "0x0"  # type: ignore[misc]


def test_ibstat_fields_not_shown_are_none_never_zero() -> None:
    text = body(PANIC)
    cut = "\n".join(
        line for line in text.split("\n") if "Rate:" not in line and "Port GUID" not in line
    )
    cut = cut.replace("Link layer: InfiniBand", "Link layer: N/A")
    port = ibstat_of(parse("ibstat", cut).data).cas["mlx5_3"].port("1")
    assert port is not None
    assert (port.rate, port.port_guid, port.link_layer) == (None, None, None)
    nan = text.replace("Rate: 200", "Rate: nan", 1)
    first = ibstat_of(parse("ibstat", nan).data).cas["mlx5_0"].port("1")
    assert first is not None
    assert first.rate is None  # numbers.number refuses nan


def test_perftest_record_of_server_and_client_blocks() -> None:
    result = parse("perftest", body(LOOPBACK))
    record = perftest_of(result.data)
    assert record.rows_read == sum(len(b["rows"]) for b in result.data["blocks"]) == 2
    assert record.bw_rows == (BwRow(8388608, 24056.72),)
    assert (record.test, record.bw_unit) == ("RDMA_Write BW Test", "MB/sec")
    assert record.dual_port == "OFF"
    assert not record.bidirectional
    assert not record.two_ports
    both = body(LOOPBACK).replace("RDMA_Write BW Test", "RDMA_Write Bidirectional BW Test")
    dual = body(LOOPBACK).replace("Dual-port       : OFF", "Dual-port       : ON")
    assert perftest_of(parse("perftest", both).data).bidirectional
    assert perftest_of(parse("perftest", dual).data).two_ports


def test_perftest_record_of_a_latency_run_has_no_bandwidth_row() -> None:
    record = perftest_of(parse("perftest", body(LATENCY)).data)
    assert record.bw_rows == ()
    assert record.rows_read == 1
    assert record.bw_unit is None


def test_perftest_row_that_is_not_a_finite_number_is_not_read() -> None:
    text = body(LOOPBACK).replace("24056.72", "nan", 1)
    record = perftest_of(parse("perftest", text).data)
    assert record.rows_read == 1  # the judge counts the unread line in the text and fails it
    assert all(row.bw_average is not None for row in record.bw_rows)
