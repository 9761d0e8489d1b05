"""Fabric Manager (``systemctl status nvidia-fabricmanager``) on NVSwitch systems.

``fabricmanager.version``: Fabric Manager starts only with the driver of its own version (NVIDIA
Fabric Manager user guide); with another it exits at once, printing ``fabric manager NVIDIA GPU
driver interface version 530.30.02 don't match with driver version 530.41.03. Please update
with matching NVIDIA driver package.`` (NVIDIA/gpu-operator#544; newer releases say "doesn't
match ... with the matching"). That line names both versions; else Fabric Manager's version is
its start banner's and the driver's is the one nvidia-smi reports (cluster.yml's as the last
resort). A mismatch is the cause of the GPUs' fabric state and of the service being down, and
the check says what to install (:mod:`gpuctl.validation.judges.blame` adds it to those).
"""

from __future__ import annotations

import re

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, node_judge, record, usable_parse
from gpuctl.validation.parsers.fabricmanager import FabricManager, fabric_manager_of
from gpuctl.validation.parsers.nvsmi_gpu import smi_of
from gpuctl.validation.results import CheckResult, Verdict

_VERSION = r"\d+(?:\.\d+)+"
_MISMATCH = re.compile(
    rf"driver interface version (?P<fm>{_VERSION}) do(?:es)?n'?t match with driver version "
    rf"(?P<driver>{_VERSION})"
)


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
    out += _judge_version(exp, outputs, fm)
    return out


def _driver_running(exp: NodeExpectation, outputs: Outputs) -> str | None:
    """The driver version nvidia-smi reports on the node (None when it cannot be read)."""
    result, _ = usable_parse(exp, outputs, ["smi-xml", "smi-q"], "fabricmanager.version")
    return record(result, smi_of).driver_version if result is not None else None


def _judge_version(exp: NodeExpectation, outputs: Outputs, fm: FabricManager) -> list[CheckResult]:
    said = next((m for e in fm.errors if (m := _MISMATCH.search(e))), None)
    if said is not None:
        version, driver = said.group("fm"), said.group("driver")
        source = "Fabric Manager's own message"
    else:
        version = fm.version
        driver = _driver_running(exp, outputs)
        source = "nvidia-smi"
        if driver is None:
            driver, source = exp.driver_version, "cluster.yml (software.nvidia_driver)"
    if version is None or driver is None:
        return []
    if version == driver:
        return [
            finding(
                exp,
                "fabricmanager.version",
                Verdict.OK,
                f"Fabric Manager {version} matches driver {driver}",
                measured=version,
                expected=driver,
                source=source,
            )
        ]
    return [
        finding(
            exp,
            "fabricmanager.version",
            Verdict.FAIL,
            f"Fabric Manager {version} {'refuses to start' if said else 'runs'} with driver "
            f"{driver}: install the matching nvidia-fabricmanager ({driver})",
            measured=version,
            expected=driver,
            source=source,
            evidence=(said.group(0),) if said is not None else (),
        )
    ]
