"""JUnit XML: one testsuite per node, one testcase per check (CI systems read this).

XML 1.0 cannot carry most control characters at all, not even as character references: every
text and attribute goes through :func:`printable` first (names on one line, messages keep
their newlines), or one ESC in a kernel log line makes the whole file unreadable.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from gpuctl.validation.results import CheckResult, ValidationReport, Verdict, printable


def _text(text: str) -> str:
    return printable(text, multiline=True)


def _case_name(check: CheckResult) -> str:
    name = f"{check.check}[{check.subject}]" if check.subject else check.check
    return printable(name)


def _detail(check: CheckResult) -> str:
    lines = [check.message]
    if check.measured is not None or check.expected is not None:
        unit = f" {check.unit}" if check.unit else ""
        lines.append(f"measured: {check.measured}{unit}; expected: {check.expected}{unit}")
    if check.source:
        lines.append(f"source: {check.source}")
    lines += [f"> {line}" for line in check.evidence]
    return _text("\n".join(lines))


def render_junit(report: ValidationReport) -> str:
    """FAIL is a <failure>, UNKNOWN an <error> (the check could not run or be read), WARN passes
    with its message in <system-out>."""
    root = ET.Element("testsuites", name=printable(f"gpuctl validate {report.cluster}"))
    totals = {"tests": 0, "failures": 0, "errors": 0}
    for node in report.nodes:
        name = printable(node.node)
        suite = ET.SubElement(root, "testsuite", name=name)
        counts = {"tests": 0, "failures": 0, "errors": 0}
        for check in node.checks:
            case = ET.SubElement(
                suite, "testcase", classname=f"gpuctl.{name}", name=_case_name(check)
            )
            case.set("time", "0")
            counts["tests"] += 1
            if check.verdict is Verdict.FAIL:
                counts["failures"] += 1
                el = ET.SubElement(case, "failure", message=_text(check.message), type="FAIL")
                el.text = _detail(check)
            elif check.verdict is Verdict.UNKNOWN:
                counts["errors"] += 1
                el = ET.SubElement(case, "error", message=_text(check.message), type="UNKNOWN")
                el.text = _detail(check)
            elif check.verdict is Verdict.WARN:
                ET.SubElement(case, "system-out").text = "WARN: " + _detail(check)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite.set("skipped", "0")
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
