"""Fabric Manager (``systemctl status nvidia-fabricmanager``) on NVSwitch systems."""

from __future__ import annotations

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, node_judge, usable_parse
from gpuctl.validation.parsers.fabricmanager import fabric_manager_of
from gpuctl.validation.results import CheckResult, Verdict


@node_judge("fabricmanager")
def judge_fabric_manager(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    result, unknown = usable_parse(exp, outputs, ["fabricmanager"], "fabricmanager")
    if result is None:
        return unknown
    fm = fabric_manager_of(result.data)
    out = list(unknown)
    if fm.active is True:
        out.append(
            finding(exp, "fabricmanager.active", Verdict.OK, "nvidia-fabricmanager is active")
        )
    elif fm.active is False:
        out.append(
            finding(
                exp,
                "fabricmanager.active",
                Verdict.FAIL,
                f"nvidia-fabricmanager is {fm.state or 'not active'}",
                evidence=fm.errors[:5],
            )
        )
    else:
        out.append(
            finding(
                exp,
                "fabricmanager.active",
                Verdict.UNKNOWN,
                "the output does not say whether Fabric Manager runs",
            )
        )
    version = fm.version
    if version is not None and exp.driver_version is not None and version != exp.driver_version:
        out.append(
            finding(
                exp,
                "fabricmanager.version",
                Verdict.FAIL,
                f"Fabric Manager {version} differs from the driver {exp.driver_version}",
                measured=version,
                expected=exp.driver_version,
            )
        )
    return out
