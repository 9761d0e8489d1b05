"""Report writers: each turns a ValidationReport into text (no I/O here; the CLI writes files)."""

from gpuctl.validation.reports.drain import drain_reasons
from gpuctl.validation.reports.html import render_html
from gpuctl.validation.reports.junit import render_junit
from gpuctl.validation.reports.prom import render_prometheus

__all__ = ["drain_reasons", "render_html", "render_junit", "render_prometheus"]
