"""One self-contained HTML file: no scripts, no external assets, charts as inline SVG.

Sections: summary, per-node status grid (nodes x check groups), NVLink/PCIe topology heatmaps,
NCCL bus bandwidth against message size, per-HCA ib_write_bw bars, then every failed or unknown
check with its evidence. Chart data comes from ``report.extra`` (built by
:mod:`gpuctl.validation.reports.charts` while judging):

- ``topology``: node -> {"devices": [...], "links": {a: {b: token}}}
- ``nccl``: node -> [[size_bytes, busbw_gbs], ...] (+ ``nccl_threshold``: GB/s)
- ``ib_write_bw``: node -> {hca: gbps} (+ ``ib_write_bw_threshold``: Gb/s, ``ib_line_rate``)

Every text goes through :func:`escape` here: :func:`printable` (control characters, U+2028 and
bidi overrides shown as escapes: a node's text cannot reorder or hide the page around it),
then HTML escaping.
"""

from __future__ import annotations

import html
import math
from typing import Any

from gpuctl.validation.results import CheckResult, ValidationReport, Verdict, printable, worst


def escape(text: str) -> str:
    """``text`` for HTML element content or a quoted attribute."""
    return html.escape(printable(text, multiline=True))


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse}td,th{padding:3px 6px;border:1px solid #ddd;text-align:left}
.cell{width:22px;height:18px;padding:0}.ok{background:#2e7d32}.warn{background:#f9a825}
.fail{background:#c62828}.unknown{background:#6a1b9a}.none{background:#eee}
.badge{color:#fff;border-radius:3px;padding:1px 6px;font-weight:600}
pre{background:#f6f6f6;padding:6px;margin:4px 0;white-space:pre-wrap}
.legend span{display:inline-block;margin-right:12px}
svg text{font:11px system-ui,sans-serif}
"""


def _badge(verdict: Verdict) -> str:
    return f'<span class="badge {verdict.value}">{verdict.value.upper()}</span>'


def _group(check: str) -> str:
    return check.split(".", 1)[0]


def _grid(report: ValidationReport) -> str:
    groups = sorted({_group(c.check) for n in report.nodes for c in n.checks})
    head = "".join(f"<th>{escape(g)}</th>" for g in groups)
    rows = []
    for node in report.nodes:
        cells = []
        for g in groups:
            mine = [c.verdict for c in node.checks if _group(c.check) == g]
            if not mine:
                cells.append('<td class="cell none" title="not checked"></td>')
                continue
            v = worst(mine)
            cells.append(f'<td class="cell {v.value}" title="{escape(g)}: {v.value}"></td>')
        rows.append(
            f"<tr><td>{escape(node.node)}</td><td>{_badge(node.verdict)}</td>{''.join(cells)}</tr>"
        )
    return (
        f"<table><tr><th>node</th><th>verdict</th>{head}</tr>{''.join(rows)}</table>"
        '<p class="legend">'
        + "".join(f'<span><span class="badge {v.value}">{v.value}</span></span>' for v in Verdict)
        + "</p>"
    )


_TOKEN_COLOURS = [
    ("NV", "#1b5e20"),
    ("PIX", "#66bb6a"),
    ("PXB", "#9ccc65"),
    ("PHB", "#fdd835"),
    ("NODE", "#fb8c00"),
    ("SYS", "#e53935"),
    ("X", "#bdbdbd"),
]


def _token_colour(token: str) -> str:
    for prefix, colour in _TOKEN_COLOURS:
        if token.startswith(prefix):
            return colour
    return "#ffffff"


def _text_colour(token: str) -> str:
    return "#fff" if token.startswith(("NV", "SYS")) else "#000"


def _heatmap(node: str, topo: dict[str, Any]) -> str:
    devices: list[str] = list(topo.get("devices") or [])
    links: dict[str, dict[str, str]] = topo.get("links") or {}
    size, pad = 44, 60
    width = pad + size * len(devices) + 10
    parts = [
        f'<svg width="{width}" height="{width}" role="img" aria-label="topology of {escape(node)}">'
    ]
    for i, dev in enumerate(devices):
        x = pad + i * size
        parts.append(f'<text x="{x + 4}" y="{pad - 8}">{escape(dev)}</text>')
        parts.append(f'<text x="2" y="{pad + i * size + 21}">{escape(dev)}</text>')
        for j, other in enumerate(devices):
            token = "X" if i == j else str(links.get(dev, {}).get(other, "?"))
            y = pad + j * size
            parts.append(
                f'<rect x="{x}" y="{y}" width="{size - 2}" height="{size - 2}" '
                f'fill="{_token_colour(token)}"><title>{escape(dev)}-{escape(other)}: '
                f"{escape(token)}</title></rect>"
                f'<text x="{x + 4}" y="{y + 26}" fill="{_text_colour(token)}">'
                f"{escape(token)}</text>"
            )
    parts.append("</svg>")
    return "".join(parts)


def _line_chart(series: dict[str, list[list[float]]], threshold: float | None) -> str:
    points = [(s, b) for rows in series.values() for s, b in rows if s > 0 and b >= 0]
    if not points:
        return "<p>no NCCL results</p>"
    w, h, left, bottom = 640, 300, 50, 30
    xs = [math.log2(s) for s, _ in points]
    x0, x1 = min(xs), max(xs) or 1.0
    y1 = max([b for _, b in points] + [threshold or 0.0]) * 1.1 or 1.0

    def px(size: float) -> float:
        span = (x1 - x0) or 1.0
        return left + (math.log2(size) - x0) / span * (w - left - 10)

    def py(value: float) -> float:
        return h - bottom - value / y1 * (h - bottom - 10)

    parts = [
        f'<svg width="{w}" height="{h}" role="img" aria-label="busbw by message size">',
        f'<line x1="{left}" y1="{h - bottom}" x2="{w}" y2="{h - bottom}" stroke="#555"/>',
        f'<line x1="{left}" y1="0" x2="{left}" y2="{h - bottom}" stroke="#555"/>',
        f'<text x="{left}" y="{h - 8}">message size (log2 bytes) -&gt;</text>',
        f'<text x="4" y="12">GB/s (max {y1 / 1.1:.0f})</text>',
    ]
    if threshold:
        parts.append(
            f'<line x1="{left}" y1="{py(threshold):.1f}" x2="{w}" '
            f'y2="{py(threshold):.1f}" stroke="#c62828" stroke-dasharray="4"/>'
            f'<text x="{w - 120}" y="{py(threshold) - 4:.1f}">min {threshold:g}</text>'
        )
    palette = ["#1565c0", "#2e7d32", "#6a1b9a", "#ef6c00", "#00838f", "#ad1457"]
    for i, (name, rows) in enumerate(sorted(series.items())):
        pts = " ".join(f"{px(s):.1f},{py(b):.1f}" for s, b in rows if s > 0)
        colour = palette[i % len(palette)]
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{pts}">'
            f"<title>{escape(name)}</title></polyline>"
        )
        if i < 12:  # legend
            parts.append(
                f'<rect x="{left + 10}" y="{10 + i * 14}" width="10" height="10" '
                f'fill="{colour}"/><text x="{left + 24}" y="{19 + i * 14}">{escape(name)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


_PALETTE = ("#1565c0", "#2e7d32", "#6a1b9a", "#ef6c00", "#00838f", "#ad1457", "#5d4037", "#455a64")


def _series_chart(
    series: dict[str, list[list[float]]], label: str, x_label: str, mark: float | None = None
) -> str:
    """One line per series on linear axes (the burn loop's time series)."""
    points = [(x, y) for rows in series.values() for x, y in rows]
    if not points:
        return ""
    w, h, left, bottom = 640, 220, 50, 30
    x1 = max(x for x, _ in points) or 1.0
    y0 = min([y for _, y in points] + ([mark] if mark else []))
    y1 = max([y for _, y in points] + ([mark] if mark else []))
    pad = (y1 - y0) * 0.1 or 1.0
    y0, y1 = max(0.0, y0 - pad), y1 + pad

    def px(x: float) -> float:
        return left + x / x1 * (w - left - 10)

    def py(y: float) -> float:
        return h - bottom - (y - y0) / (y1 - y0) * (h - bottom - 10)

    parts = [
        f'<svg width="{w}" height="{h}" role="img" aria-label="{escape(label)}">',
        f'<line x1="{left}" y1="{h - bottom}" x2="{w}" y2="{h - bottom}" stroke="#555"/>',
        f'<line x1="{left}" y1="0" x2="{left}" y2="{h - bottom}" stroke="#555"/>',
        f'<text x="{left}" y="{h - 8}">{escape(x_label)} -&gt; (max {x1:g})</text>',
        f'<text x="4" y="12">{escape(label)} ({y0:.0f} to {y1:.0f})</text>',
    ]
    if mark:
        parts.append(
            f'<line x1="{left}" y1="{py(mark):.1f}" x2="{w}" y2="{py(mark):.1f}" '
            f'stroke="#c62828" stroke-dasharray="4"/>'
        )
    for i, (name, rows) in enumerate(sorted(series.items())):
        colour = _PALETTE[i % len(_PALETTE)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in rows)
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{pts}">'
            f"<title>{escape(name)}</title></polyline>"
        )
        if i < 16:
            parts.append(
                f'<rect x="{w - 70}" y="{10 + i * 12}" width="8" height="8" fill="{colour}"/>'
                f'<text x="{w - 58}" y="{18 + i * 12}">{escape(name)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


_BURN_CHARTS = (
    ("gtemp", "GPU temperature, C", "seconds"),
    ("pclk", "SM clock, MHz", "seconds"),
    ("pwr", "power, W", "seconds"),
    ("nccl", "all_reduce busbw, GB/s", "run of the loop"),
)


def _burn(node: str, data: dict[str, Any], threshold: float | None) -> str:
    charts = []
    for key, label, x_label in _BURN_CHARTS:
        value = data.get(key)
        series = {"busbw": value} if key == "nccl" and value else value
        if series:
            mark = threshold if key == "nccl" else None
            charts.append(_series_chart(series, label, x_label, mark))
    return f"<details open><summary>{escape(node)}</summary>{''.join(charts)}</details>"


def _bars(values: dict[str, float], threshold: float | None, line_rate: float | None) -> str:
    if not values:
        return ""
    top = max([*values.values(), threshold or 0.0, line_rate or 0.0]) or 1.0
    w, row = 520, 20
    h = row * len(values) + 20
    parts = [f'<svg width="{w + 160}" height="{h}" role="img" aria-label="ib_write_bw">']
    for i, (hca, gbps) in enumerate(sorted(values.items())):
        bw = gbps / top * w
        colour = "#c62828" if threshold and gbps < threshold else "#1565c0"
        parts.append(
            f'<text x="0" y="{i * row + 14}">{escape(hca)}</text>'
            f'<rect x="80" y="{i * row + 3}" width="{bw:.1f}" height="{row - 6}" '
            f'fill="{colour}"/><text x="{85 + bw:.1f}" y="{i * row + 14}">'
            f"{gbps:g}</text>"
        )
    if threshold:
        x = 80 + threshold / top * w
        parts.append(
            f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{h}" stroke="#c62828" '
            'stroke-dasharray="4"/>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _problem_rows(report: ValidationReport) -> str:
    rows = []
    for node in report.nodes:
        for c in node.checks:
            if c.verdict in (Verdict.FAIL, Verdict.UNKNOWN, Verdict.WARN):
                rows.append(_problem_row(c))
    if not rows:
        return "<p>none</p>"
    return (
        "<table><tr><th>node</th><th>check</th><th>subject</th><th>verdict</th>"
        "<th>measured</th><th>expected</th><th>message and evidence</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _value(value: Any, unit: str) -> str:
    return "-" if value is None else escape(f"{value}{unit}")


def _problem_row(c: CheckResult) -> str:
    unit = f" {c.unit}" if c.unit else ""
    pct = f" ({c.percent_of_limit}% of limit)" if c.percent_of_limit is not None else ""
    evidence = "".join(f"<pre>{escape(line)}</pre>" for line in c.evidence[:5])
    return (
        f"<tr><td>{escape(c.node)}</td><td>{escape(c.check)}</td>"
        f"<td>{escape(c.subject or '')}</td><td>{_badge(c.verdict)}</td>"
        f"<td>{_value(c.measured, unit)}{escape(pct)}</td>"
        f"<td>{_value(c.expected, unit)}</td>"
        f"<td>{escape(c.message)}{evidence}</td></tr>"
    )


MAX_CHARTS = 12  # per section: a 1,000-node report draws the nodes that need a look


def _pick(report: ValidationReport, available: dict[str, Any], prefix: str) -> list[str]:
    """Nodes to draw: those with a non-OK check in ``prefix``, then the first others."""
    bad = [
        n.node
        for n in report.nodes
        if n.node in available
        and any(c.check.startswith(prefix) and c.verdict is not Verdict.OK for c in n.checks)
    ]
    rest = [n for n in available if n not in bad]
    return (bad[:MAX_CHARTS] + rest)[: max(MAX_CHARTS, 1)] if bad else rest[:MAX_CHARTS]


def render_html(report: ValidationReport) -> str:
    s = report.summary()
    extra = report.extra
    topo_all: dict[str, Any] = extra.get("topology") or {}
    nccl_all: dict[str, list[list[float]]] = extra.get("nccl") or {}
    ib_all: dict[str, dict[str, float]] = extra.get("ib_write_bw") or {}
    burn_all: dict[str, dict[str, Any]] = extra.get("burn") or {}
    burning = {n: burn_all[n] for n in _pick(report, burn_all, "burn.")}
    topo = {n: topo_all[n] for n in _pick(report, topo_all, "topology")}
    nccl = {n: nccl_all[n] for n in _pick(report, nccl_all, "nccl")}
    ib = {n: ib_all[n] for n in _pick(report, ib_all, "ib.write_bw")}
    shown = (
        f"<p>Charts show up to {MAX_CHARTS} nodes per section, those with problems first.</p>"
        if max(len(topo_all), len(nccl_all), len(ib_all), len(burn_all)) > MAX_CHARTS
        else ""
    )
    body = [
        f"<h1>gpuctl validate: {escape(report.cluster)} ({escape(report.level)})</h1>",
        f"<p>{s['nodes']} nodes: {s['ok']} ok, {s['warn']} warn, {s['fail']} fail, "
        f"{s['unknown']} unknown; {s['failed']} failed"
        + (f"; generated {escape(report.generated_at)}" if report.generated_at else "")
        + "</p>",
        "<h2>Nodes</h2>",
        _grid(report),
        shown,
    ]
    if topo:
        body.append("<h2>NVLink / PCIe topology</h2>")
        for node, data in sorted(topo.items()):
            body.append(
                f"<details open><summary>{escape(node)}</summary>{_heatmap(node, data)}</details>"
            )
    if nccl:
        body += [
            "<h2>NCCL bus bandwidth by message size</h2>",
            _line_chart(nccl, extra.get("nccl_threshold")),
        ]
    if ib:
        body.append("<h2>ib_write_bw per HCA (Gb/s)</h2>")
        for node, values in sorted(ib.items()):
            body.append(
                f"<h3>{escape(node)}</h3>"
                + _bars(values, extra.get("ib_write_bw_threshold"), extra.get("ib_line_rate"))
            )
    if burning:
        body.append("<h2>Burn-in: the loop over time</h2>")
        for node, data in sorted(burning.items()):
            body.append(_burn(node, data, extra.get("nccl_threshold")))
    body += ["<h2>Problems</h2>", _problem_rows(report)]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>gpuctl validate {escape(report.cluster)}</title>"
        f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n"
    )
