"""Report writers: each turns a ValidationReport into text (no I/O here; the CLI writes files).

One module per format, imported by what needs it (`gpuctl-node-check` needs only
:mod:`~gpuctl.validation.reports.drain`): :mod:`~gpuctl.validation.reports.html`,
:mod:`~gpuctl.validation.reports.junit`, :mod:`~gpuctl.validation.reports.prom`,
:mod:`~gpuctl.validation.reports.drain`.
"""
