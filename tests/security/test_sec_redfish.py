"""A BMC's answers are data: no number in them can stall a rollout or crash it (issue 14)."""

from __future__ import annotations

import pytest

from gpuctl.rollout.redfish import MAX_RETRY_AFTER_S, _seconds
from gpuctl.validation.numbers import json_loads


@pytest.mark.parametrize("value", ["inf", "Infinity", "1e400", "nan", "-inf", "9" * 5000])
def test_retry_after_that_is_no_finite_number_is_ignored(value: str) -> None:
    assert _seconds(value) is None


def test_retry_after_is_capped_and_never_negative() -> None:
    assert _seconds("99999999") == MAX_RETRY_AFTER_S
    assert _seconds("-5") == 0.0
    assert _seconds("7") == 7.0
    assert _seconds("Wed, 21 Oct 2026 07:28:00 GMT") is None


def test_bmc_json_numbers_that_no_bmc_sends_become_null() -> None:
    doc = json_loads('{"PercentComplete": NaN, "Big": ' + "9" * 5000 + ', "Inf": Infinity}')
    assert doc == {"PercentComplete": None, "Big": None, "Inf": None}
    with pytest.raises((ValueError, RecursionError)):
        json_loads("[" * 100_000 + "]" * 100_000)
