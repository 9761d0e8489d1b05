"""Prometheus textfile-collector format (node_exporter --collector.textfile.directory)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from gpuctl.validation.results import ValidationReport


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in pairs) + "}"


def render_prometheus(report: ValidationReport) -> str:
    cluster = report.cluster
    out: list[str] = [
        "# HELP gpuctl_check_verdict Verdict of one gpuctl check: 0 ok, 1 warn, 2 fail, 3 unknown.",
        "# TYPE gpuctl_check_verdict gauge",
    ]
    measured: list[str] = []
    seen: set[str] = set()
    for node in report.nodes:
        for check in node.checks:
            base = [
                ("cluster", cluster),
                ("node", node.node),
                ("check", check.check),
                ("subject", check.subject or ""),
            ]
            key = _labels(base)
            if key in seen:  # the same check twice on one subject: keep the first
                continue
            seen.add(key)
            out.append(f"gpuctl_check_verdict{key} {check.verdict.code}")
            value = check.measured
            if (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(float(value))
            ):
                measured.append(
                    f"gpuctl_check_measured{_labels([*base, ('unit', check.unit or '')])} "
                    f"{float(value):g}"
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
    out += [
        f"gpuctl_node_verdict{_labels([('cluster', cluster), ('node', n.node)])} {n.verdict.code}"
        for n in report.nodes
    ]
    out += [
        "# HELP gpuctl_node_failed 1 when gpuctl failed the node (FAIL, or UNKNOWN: fail closed).",
        "# TYPE gpuctl_node_failed gauge",
    ]
    out += [
        f"gpuctl_node_failed{_labels([('cluster', cluster), ('node', n.node)])} {int(n.failed)}"
        for n in report.nodes
    ]
    return "\n".join(out) + "\n"
