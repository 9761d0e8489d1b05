"""Prometheus textfile-collector format (node_exporter --collector.textfile.directory).

Every line is a `# HELP`/`# TYPE` comment or one sample `name{label="value",...} number`. A label
value is :func:`printable` on one line (a newline or tab from a node shows as ``\\n``, never
splits a sample), then escaped as the exposition format says: backslash and double quote.
"""

from __future__ import annotations

import math

from gpuctl.validation.results import ValidationReport, printable


class _Labels:
    """Label values escaped once each: a fleet repeats the same check ids, units and subjects
    on every node."""

    def __init__(self) -> None:
        self._seen: dict[str, str] = {}

    def __call__(self, value: str) -> str:
        done = self._seen.get(value)
        if done is None:
            done = printable(value).replace("\\", "\\\\").replace('"', '\\"')
            self._seen[value] = done
        return done


def render_prometheus(report: ValidationReport) -> str:
    label = _Labels()
    cluster = f'cluster="{label(report.cluster)}"'
    out: list[str] = [
        "# HELP gpuctl_check_verdict Verdict of one gpuctl check: 0 ok, 1 warn, 2 fail, 3 unknown.",
        "# TYPE gpuctl_check_verdict gauge",
    ]
    measured: list[str] = []
    node_labels: list[tuple[str, int, int]] = []
    seen: set[str] = set()
    for node in report.nodes:
        where = f'{cluster},node="{label(node.node)}"'
        node_labels.append((where, node.verdict.code, int(node.failed)))
        for check in node.checks:
            base = f'{where},check="{label(check.check)}",subject="{label(check.subject or "")}"'
            if base in seen:  # the same check twice on one subject: keep the first
                continue
            seen.add(base)
            out.append(f"gpuctl_check_verdict{{{base}}} {check.verdict.code}")
            value = check.measured
            if (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(number := _float(value))
            ):
                measured.append(
                    f'gpuctl_check_measured{{{base},unit="{label(check.unit or "")}"}} {number:g}'
                )
    if measured:
        out += [
            "# HELP gpuctl_check_measured Value a gpuctl check measured, in the unit label.",
            "# TYPE gpuctl_check_measured gauge",
            *measured,
        ]
    out += [
        "# HELP gpuctl_node_verdict Worst verdict of a node: 0 ok, 1 warn, 2 fail, 3 unknown.",
        "# TYPE gpuctl_node_verdict gauge",
    ]
    out += [f"gpuctl_node_verdict{{{where}}} {code}" for where, code, _ in node_labels]
    out += [
        "# HELP gpuctl_node_failed 1 when gpuctl failed the node (FAIL, or UNKNOWN: fail closed).",
        "# TYPE gpuctl_node_failed gauge",
    ]
    out += [f"gpuctl_node_failed{{{where}}} {failed}" for where, _, failed in node_labels]
    return "\n".join(out) + "\n"


def _float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond any float
        return math.inf
