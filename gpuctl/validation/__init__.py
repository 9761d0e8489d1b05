"""Validation: probes (command + pure parser), judges, baselines and reports.

Nothing in this package performs I/O except where a docstring says so: parsers take text and
return data, judges take data and return verdicts, reports take verdicts and return text.
"""
