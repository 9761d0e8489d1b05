"""Each adapter port's physical layer, as `mlxlink -d <hca> -m -c` shows it after every test of
the level (issue 18, point 1): read once, since a bit error rate is a rate over the time since
the counters were last cleared, not a count.

- ``ib.link.ber`` (one per HCA): the rate after every correction the port has, Symbol BER
  where mlxlink shows it (InfiniBand HDR/NDR: post FEC + PLR), else Effective Physical BER
  (EDR, Ethernet: post FEC), above the limit of data/counters.yml (``ber``: 1E-12) FAIL; under
  it OK, or WARN when mlxlink's own troubleshooting says something (a Status Opcode other than
  0, with its Recommendation). Raw (pre-FEC) BER is in the message, not judged. UNKNOWN when
  mlxlink did not run, printed an error (``-E-``), or showed no BER.
- ``ib.link.module`` (one per HCA with a transceiver that reports diagnostics): a reading
  outside the alarm thresholds the module itself reports (mlxlink's ``value [low..high]``:
  temperature, voltage, bias current, Rx and Tx power, per lane) FAIL; all inside OK. A passive
  copper cable has no diagnostics (N/A): OK, said so. UNKNOWN without a Module Info section.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuctl.config.catalog import ber_limit
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, node_judge, usable_parse
from gpuctl.validation.plausible import finite
from gpuctl.validation.probes import collects
from gpuctl.validation.results import CheckResult, Verdict

BER = "ib.link.ber"
MODULE = "ib.link.module"
KIND = "mlxlink"
COUNTERS = "physical_counters_and_ber_info"
TROUBLE = "troubleshooting_info"
# the module readings mlxlink prints with the module's own alarm thresholds
READINGS = {
    "temperature_c": "temperature (C)",
    "voltage_mv": "voltage (mV)",
    "bias_current_ma": "bias current (mA)",
    "rx_power_current_dbm": "Rx power (dBm)",
    "tx_power_current_dbm": "Tx power (dBm)",
}


def _reads_mlxlink(exp: NodeExpectation) -> bool:
    return any(collects(exp, f"{KIND}.{n.name}") for n in exp.nics)


@node_judge(KIND, applies=_reads_mlxlink)
def judge_link_phy(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    out: list[CheckResult] = []
    for nic in exp.nics:
        kind = f"{KIND}.{nic.name}"
        if not collects(exp, kind):
            continue
        result, unknown = usable_parse(exp, outputs, [kind], BER)
        if result is None or unknown:
            why = unknown[0].message
            out += [
                finding(exp, check, Verdict.UNKNOWN, why, subject=nic.name)
                for check in (BER, MODULE)
            ]
            continue
        data = result.data
        errors = [str(e) for e in data.get("errors") or []]
        sections = data.get("sections") if isinstance(data.get("sections"), Mapping) else {}
        out.append(replace(_ber(exp, sections or {}, errors), subject=nic.name))
        module = data.get("module")
        out.append(
            replace(
                _module(exp, module if isinstance(module, Mapping) else None, errors),
                subject=nic.name,
            )
        )
    return out


def _ber(exp: NodeExpectation, sections: Mapping[str, Any], errors: list[str]) -> CheckResult:
    limit, source = ber_limit()
    counters = sections.get(COUNTERS)
    if errors or not isinstance(counters, Mapping):
        why = f"mlxlink: {errors[0]}" if errors else "mlxlink: no Physical Counters and BER Info"
        return finding(exp, BER, Verdict.UNKNOWN, why)
    symbol = finite(counters.get("symbol_ber"))
    effective = finite(counters.get("effective_physical_ber"))
    name, value = ("Symbol BER", symbol) if symbol is not None else ("Effective BER", effective)
    if value is None:
        return finding(
            exp, BER, Verdict.UNKNOWN, "mlxlink: no Symbol BER or Effective Physical BER"
        )
    raw = finite(counters.get("raw_physical_ber"))
    since = finite(counters.get("time_since_last_clear_min"))
    detail = f"{name} {_sci(value)}"
    if raw is not None:
        detail += f" (raw {_sci(raw)}, before FEC)"
    if since is not None:
        detail += f" over {since:g} min since the counters were cleared"
    kw: dict[str, Any] = {"measured": value, "expected": limit, "source": source}
    if value > limit:
        return finding(exp, BER, Verdict.FAIL, f"{detail}: above {_sci(limit)}", **kw)
    trouble = sections.get(TROUBLE)
    opcode = trouble.get("status_opcode") if isinstance(trouble, Mapping) else None
    if isinstance(opcode, int) and opcode != 0:
        advice = trouble.get("recommendation") if isinstance(trouble, Mapping) else None
        says = f"mlxlink Status Opcode {opcode}: {advice or 'no recommendation'}"
        return finding(exp, BER, Verdict.WARN, f"{detail}; {says}", **kw)
    return finding(exp, BER, Verdict.OK, f"{detail}, within {_sci(limit)}", **kw)


def _module(
    exp: NodeExpectation, module: Mapping[str, Any] | None, errors: list[str]
) -> CheckResult:
    if module is None:
        why = f"mlxlink: {errors[0]}" if errors else "mlxlink: no Module Info (run without -m?)"
        return finding(exp, MODULE, Verdict.UNKNOWN, why)
    identifier = module.get("identifier") or "module"
    outside: list[str] = []
    read: list[str] = []
    for key, label in READINGS.items():
        values = module.get(key)
        limits = module.get(f"{key}_range")
        if values is None:
            continue
        lanes = values if isinstance(values, list) else [values]
        low = finite(limits.get("min")) if isinstance(limits, Mapping) else None
        high = finite(limits.get("max")) if isinstance(limits, Mapping) else None
        if low is None or high is None:
            continue  # no alarm thresholds shown: nothing to judge this reading against
        read.append(label)
        for lane, value in enumerate(lanes):
            number = finite(value)
            if number is None:
                continue
            if not low <= number <= high:
                where = f" lane {lane}" if len(lanes) > 1 else ""
                outside.append(f"{label}{where} {number:g} outside [{low:g}..{high:g}]")
    if outside:
        message = f"{identifier}: " + "; ".join(outside) + " (the module's own alarm thresholds)"
        return finding(exp, MODULE, Verdict.FAIL, message)
    if not read:
        return finding(
            exp,
            MODULE,
            Verdict.OK,
            f"{identifier}: no diagnostics with alarm thresholds (a passive cable has none)",
        )
    return finding(
        exp, MODULE, Verdict.OK, f"{identifier}: {', '.join(read)} within the module's thresholds"
    )


def _sci(value: float) -> str:
    return f"{value:.1E}".replace("E-0", "E-").replace("E+0", "E+")
