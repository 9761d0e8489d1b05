"""DCGM diagnostics (``dcgmi diag -r 2`` / ``-r 3``), DCGM 2.x/3.x and 4.x layouts.

Per test and per GPU: a ``Fail`` is FAIL on that GPU (subject ``GPU5/memory``) with DCGM's own
message, a ``Warn`` WARN, a ``Pass`` OK. A ``Skip`` is never a pass: a test the run level
requires that was skipped is UNKNOWN with DCGM's reason; one that does not apply to the GPU
(DCGM says so, or gpuctl knows the node lacks the feature) or that gpuctl does not require gets
no finding of its own and is listed in the one node-level summary (``dcgm.diag``, no subject),
whose verdict is the worst of the tests that ran. A skip gpuctl cannot classify counts as
required: fail closed.

dcgmi's exit status is DCGM's return code (dcgmi/main_dcgmi.cpp returns it; the shell sees
256 + the negative ``DCGM_ST_*`` of dcgmlib/dcgm_structs.h): :data:`DCGMI_EXIT`. A complete
table is judged as printed whatever the status; with no table, DCGM's own failure sentence is
the message (FAIL when the status says the diagnostic found a fault, on the GPU it names).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, node_judge, usable_parse
from gpuctl.validation.parsers.dcgm import DcgmDiag, DcgmNote, DcgmTest, diag_of
from gpuctl.validation.probes import option
from gpuctl.validation.results import CheckResult, Verdict, worst

KIND = "dcgm-diag"
CHECK = "dcgm.diag"

# dcgmi exit status -> (DCGM_ST_* name, meaning, the diagnostic found a fault on the node).
# Values from NVIDIA/DCGM dcgmlib/dcgm_structs.h (dcgmReturn_enum) and their strings from
# dcgmlib/src/dcgm_errors.c (errorString), DCGM 4.4.1.
DCGMI_EXIT: dict[int, tuple[str, str, bool]] = {
    226: ("DCGM_ST_NVVS_ERROR", "the diagnostic ran and reported an error", True),
    205: ("DCGM_ST_NVVS_ISOLATE_ERROR", "the diagnostic reported an error: drain the GPU", True),
    238: ("DCGM_ST_GPU_IS_LOST", "a GPU is no longer reachable", True),
    237: ("DCGM_ST_RESET_REQUIRED", "a GPU requires a reset", True),
    213: ("DCGM_ST_DIAG_THRESHOLD_EXCEEDED", "a field value exceeded its error threshold", True),
    255: ("DCGM_ST_BADPARAM", "bad parameter", False),
    253: ("DCGM_ST_GENERIC_ERROR", "generic error", False),
    250: ("DCGM_ST_NOT_SUPPORTED", "not supported (not the datacenter driver?)", False),
    249: ("DCGM_ST_INIT_ERROR", "DCGM init error", False),
    248: ("DCGM_ST_NVML_ERROR", "NVML returned an error", False),
    245: ("DCGM_ST_TIMEOUT", "the diagnostic timed out", False),
    242: ("DCGM_ST_NO_DATA", "no data (no tests or results in the response)", False),
    239: ("DCGM_ST_NO_PERMISSION", "no permission", False),
    235: ("DCGM_ST_CONNECTION_NOT_VALID", "no connection to nv-hostengine", False),
    234: ("DCGM_ST_GPU_NOT_SUPPORTED", "this GPU is not supported by DCGM", False),
    233: ("DCGM_ST_GROUP_INCOMPATIBLE", "the GPUs are not all of one kind", False),
    227: ("DCGM_ST_REQUIRES_ROOT", "requires root", False),
    217: ("DCGM_ST_DIAG_ALREADY_RUNNING", "a diagnostic is already running", False),
    216: ("DCGM_ST_DIAG_BAD_JSON", "the diagnostic returned JSON that cannot be parsed", False),
    215: ("DCGM_ST_DIAG_BAD_LAUNCH", "the diagnostic could not be launched", False),
    206: ("DCGM_ST_PLUGIN_EXCEPTION", "a diagnostic plugin threw an exception", False),
    204: ("DCGM_ST_NVVS_BINARY_NOT_FOUND", "the nvvs binary was not found", False),
    203: ("DCGM_ST_NVVS_KILLED", "nvvs was killed by a signal", False),
    202: ("DCGM_ST_PAUSED", "DCGM is paused", False),
    198: ("DCGM_ST_NVVS_NO_AVAILABLE_TEST", "no test available", False),
    190: ("DCGM_ST_DIAG_STOPPED", "the diagnostic was stopped", False),
}

# What gpuctl requires at each run level: the tests DCGM runs there on every datacenter GPU
# ("Run Levels" table, https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html,
# and nvvs/src/NvidiaValidationSuite.cpp FillTestVectors at v4.4.1: -r 1 software; -r 2 adds
# memory and pcie; -r 3 adds diagnostic, memory_bandwidth, targeted_stress, targeted_power).
# eud/cpu_eud (root only), nvbandwidth (4.x), context_create, memtest and pulse_test (-r 4)
# are not required.
REQUIRED: dict[int, frozenset[str]] = {
    1: frozenset({"software"}),
    2: frozenset({"software", "memory", "pcie"}),
    3: frozenset(
        {"software", "memory", "pcie", "diagnostic"}
        | {"memory_bandwidth", "targeted_stress", "targeted_power"}
    ),
}
# -r 4 (the burn level) adds the memory test and the pulse test (same sources)
REQUIRED[4] = REQUIRED[3] | {"memtest", "pulse_test"}
OPTIONAL = frozenset(
    {"eud", "cpu_eud", "nvbandwidth", "context_create", "memtest", "pulse_test", "sm_stress"}
    | {"nvlink", "fabric_manager"}
)
# DCGM 2.x/3.x names -> DCGM 4 names; every Deployment row of 2.x/3.x is a check of "software"
_ALIASES = {"gpu_memory": "memory", "eud_test": "eud", "blacklist": "software"}
# DCGM's words for "this test does not apply to this GPU" (dcgm_errors.h: DCGM_FR_*_UNSUPPORTED
# "... is unsupported by this SKU", "This card does not support ...", "not supported")
_NOT_APPLICABLE = re.compile(
    r"\b(?:unsupported|not supported|does not support|not applicable|no nvswitch|no nvlink)",
    re.IGNORECASE,
)
_GPU_NAMED = re.compile(r"\bGPU ?(\d+)\b")


def canonical(name: str | None, category: str | None) -> str:
    """``GPU Memory`` -> ``memory``; a DCGM 2.x/3.x Deployment row -> ``software`` (but its
    ``Fabric Manager`` check, which applies to NVSwitch nodes only)."""
    key = re.sub(r"[^a-z0-9]+", "_", (name or "").lower()).strip("_")
    if category is not None and category.lower() == "deployment" and key != "fabric_manager":
        return "software"
    return _ALIASES.get(key, key)


def run_level(exp: NodeExpectation) -> int | None:
    """The ``-r`` level the probe table runs for this node's level (None: none runs there)."""
    value = option(KIND, "-r", exp.level)
    return int(value) if value is not None and value.isdigit() else None


def _at(level: int | None) -> str:
    return f"-r {level if level is not None else '?'}"


def _exit(rc: int | None) -> str:
    if rc is None:
        return "exit status unknown"
    known = DCGMI_EXIT.get(rc)
    if rc == 0 or known is None:
        return f"exit {rc}" + ("" if rc == 0 else ", not a DCGM return code")
    return f"exit {rc}, {known[0]}: {known[1]}"


def _gpu_of(text: str) -> str | None:
    match = _GPU_NAMED.search(text)
    return match.group(1) if match else None


def _subject(gpu: str | None, test: str) -> str:
    if gpu is None:
        return test
    return f"GPU{gpu}/{test}" if gpu.isdigit() else f"{gpu}/{test}"


@node_judge(KIND)
def judge_dcgm(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    out = outputs.get(KIND)
    if out is None or out.failure() is not None:
        _, unknown = usable_parse(exp, outputs, [KIND], "dcgm")
        return unknown
    result = out.parse_as(KIND)
    level = run_level(exp)
    if not result.recognised:
        return _no_table(exp, out.rc, result.data.get("errors") or [], result.problems)
    diag = diag_of(result.data)
    found = _judge_table(exp, diag, level)
    if out.rc not in (0, None):
        known = DCGMI_EXIT.get(out.rc)
        if known is not None and known[2]:
            if not any(r.verdict is Verdict.FAIL for r in found):
                # DCGM says it found an error that no row shows: its verdict stands
                texts = [n.text for t in diag.tests for n in t.notes] + list(diag.errors)
                found.append(
                    finding(
                        exp,
                        CHECK,
                        Verdict.FAIL,
                        f"dcgmi diag {_exit(out.rc)}, though no test failed in its table"
                        + (f": {texts[0]}" if texts else ""),
                        evidence=tuple(texts[:3]),
                    )
                )
        else:
            found.append(finding(exp, "dcgm", Verdict.UNKNOWN, f"dcgmi diag {_exit(out.rc)}"))
    if not diag.complete:
        found.append(
            finding(
                exp,
                CHECK,
                Verdict.UNKNOWN,
                "dcgmi diag output is incomplete: " + "; ".join(result.problems)[:300],
            )
        )
    return found


def _no_table(
    exp: NodeExpectation, rc: int | None, errors: list[str], problems: Iterable[str]
) -> list[CheckResult]:
    """No table: dcgmi printed only its ``Error: ...`` (or nothing recognisable)."""
    known = DCGMI_EXIT.get(rc) if rc is not None else None
    if not errors:
        why = "; ".join(problems)[:200]
        tail = f"; dcgmi diag {_exit(rc)}" if rc not in (0, None) else ""
        return [
            finding(exp, "dcgm", Verdict.UNKNOWN, f"{KIND}: output not recognised ({why}){tail}")
        ]
    out = []
    for error in errors:
        lines = [ln.strip() for ln in error.split("\n") if ln.strip()]
        # DCGM's sentence: the system errors under "Error: Unable to complete diagnostic ...",
        # else the error line itself without its "Error: "
        sentences = lines[1:] or [re.sub(r"^Error:\s*", "", lines[0])]
        for sentence in sentences:
            gpu = _gpu_of(sentence)
            verdict = Verdict.FAIL if known is not None and known[2] else Verdict.UNKNOWN
            out.append(
                finding(
                    exp,
                    CHECK if verdict is Verdict.FAIL else "dcgm",
                    verdict,
                    f"{sentence} (dcgmi diag {_exit(rc)})",
                    subject=f"GPU{gpu}" if gpu is not None else None,
                    evidence=tuple(lines[:3]),
                )
            )
    return out


def _judge_table(exp: NodeExpectation, diag: DcgmDiag, level: int | None) -> list[CheckResult]:
    out: list[CheckResult] = []
    required = REQUIRED.get(level or 0, REQUIRED[2])
    ran: list[Verdict] = []
    counts = {"passed": 0, "failed": 0, "warned": 0}
    not_applicable: list[str] = []
    not_required: list[str] = []
    failed_before = False
    seen: set[str] = set()
    for test in diag.tests:
        name = canonical(test.name, test.category)
        seen.add(name)
        label = test.name or name
        verdict = {"Pass": Verdict.OK, "Fail": Verdict.FAIL, "Warn": Verdict.WARN}.get(
            test.result or ""
        )
        if verdict is not None:
            ran.append(verdict)
            counts[{"Pass": "passed", "Fail": "failed", "Warn": "warned"}[test.result or ""]] += 1
            out += _ran(exp, test, label, name in required)
            failed_before = failed_before or verdict is Verdict.FAIL
            continue
        if test.result in ("Skip", "Not Run"):
            reason = _reason(test, failed_before)
            if _not_applicable(exp, name, reason):
                not_applicable.append(f"{label} (DCGM: {reason})" if reason else label)
            elif name in OPTIONAL and name not in required:
                not_required.append(label)
            else:  # required, or a test gpuctl does not know: fail closed
                out.append(
                    finding(
                        exp,
                        CHECK,
                        Verdict.UNKNOWN,
                        f"{label}: skipped by DCGM"
                        + (f" ({reason})" if reason else " (DCGM printed no reason; -v shows it)")
                        + (f"; required at {_at(level)}" if name in required else ""),
                        subject=label,
                    )
                )
            continue
        out.append(
            finding(
                exp,
                CHECK,
                Verdict.UNKNOWN,
                f"{label}: no recognisable result",
                subject=label,
                evidence=test.messages[:3],
            )
        )
    out += _orphans(exp, diag)
    if diag.complete:
        for name in sorted(required - seen):
            out.append(
                finding(
                    exp,
                    CHECK,
                    Verdict.UNKNOWN,
                    f"{name}: required at {_at(level)} but not in dcgmi's table"
                    + (" (DCGM stops after a failure)" if failed_before else ""),
                    subject=name,
                )
            )
    out.append(_summary(exp, diag, level, ran, counts, not_applicable, not_required))
    return out


def _ran(exp: NodeExpectation, test: DcgmTest, label: str, required: bool) -> list[CheckResult]:
    """Findings of a test that ran: one per failing/warning GPU with DCGM's message for it,
    else one for the test; a required test skipped on some GPUs is UNKNOWN on those."""
    out: list[CheckResult] = []
    bad = {"Fail": Verdict.FAIL, "Warn": Verdict.WARN}
    gpus = [(gpu, word) for gpu, word in test.gpus if word in bad]
    for gpu, word in gpus:
        notes = [n.text for n in test.notes if n.gpu == gpu] or [
            n.text for n in test.notes if n.gpu is None and _gpu_of(n.text) == gpu
        ]
        wide = [n.text for n in test.notes if n.gpu is None and _gpu_of(n.text) is None]
        text = (notes or wide or ["DCGM printed no message"])[0]
        out.append(
            finding(
                exp,
                CHECK,
                bad[word],
                f"{label} {word} on GPU{gpu}: {text}",
                subject=_subject(gpu, label),
                evidence=tuple((notes + wide)[:3]),
            )
        )
    texts = [n.text for n in test.notes if n.level != "Info"]
    verdict = {"Fail": Verdict.FAIL, "Warn": Verdict.WARN}.get(test.result or "", Verdict.OK)
    named = [_gpu_of(text) for text in texts]
    if not gpus and verdict is not Verdict.OK and texts and None not in named:
        # DCGM 3 "Fail - All" with one "GPU n ..." Warning per GPU: a finding per GPU
        for gpu in dict.fromkeys(g for g in named if g is not None):
            mine = [t for t, g in zip(texts, named, strict=True) if g == gpu]
            out.append(
                finding(
                    exp,
                    CHECK,
                    verdict,
                    f"{label} {test.result} on GPU{gpu}: {mine[0]}",
                    subject=_subject(gpu, label),
                    evidence=tuple(mine[:3]),
                )
            )
    elif not gpus:
        message = f"{label}: {test.result}" + (f": {texts[0]}" if texts else "")
        out.append(finding(exp, CHECK, verdict, message, subject=label, evidence=test.messages[:3]))
    if required:
        for gpu, word in test.gpus:
            if word in ("Skip", "Not Run"):
                out.append(
                    finding(
                        exp,
                        CHECK,
                        Verdict.UNKNOWN,
                        f"{label}: {word} on GPU{gpu} (required)",
                        subject=_subject(gpu, label),
                    )
                )
    return out


def _reason(test: DcgmTest, failed_before: bool) -> str | None:
    texts = [n.text for n in test.notes]
    if texts:
        return "; ".join(texts)[:200]
    if failed_before:
        return "not run: DCGM skips the remaining tests after a failure"
    return None


def _not_applicable(exp: NodeExpectation, name: str, reason: str | None) -> bool:
    """Whether a skipped test does not apply to this node's GPUs: DCGM says so, or the test
    needs what gpuctl knows the node lacks (Fabric Manager on a node without NVSwitch)."""
    if reason is not None and _NOT_APPLICABLE.search(reason):
        return True
    return name == "fabric_manager" and not exp.fabric_manager


def _orphans(exp: NodeExpectation, diag: DcgmDiag) -> list[CheckResult]:
    """Error/Warning rows under no test (DCGM 3's Deployment ``Error``): FAIL/WARN with
    DCGM's sentence, on the GPU it names."""
    out = []
    for category, note in diag.orphans:
        if note.level == "Info":
            continue
        verdict = Verdict.FAIL if note.level == "Error" else Verdict.WARN
        gpu = note.gpu or _gpu_of(note.text)
        family = canonical(None, category) if category else None
        subject = f"GPU{gpu}" if gpu is not None else family
        if gpu is not None and family == "software":
            subject = f"GPU{gpu}/software"
        out.append(finding(exp, CHECK, verdict, note.text, subject=subject))
    return out


def _summary(
    exp: NodeExpectation,
    diag: DcgmDiag,
    level: int | None,
    ran: list[Verdict],
    counts: dict[str, int],
    not_applicable: list[str],
    not_required: list[str],
) -> CheckResult:
    parts = [f"{n} {word}" for word, n in counts.items() if n or word == "passed"]
    message = f"dcgmi diag {_at(level)}: " + ", ".join(parts)
    if diag.version:
        message = f"DCGM {diag.version} " + message
    if not_applicable:
        message += "; skipped, not applicable to this GPU: " + ", ".join(not_applicable)
    if not_required:
        message += f"; skipped, not required at {_at(level)}: " + ", ".join(not_required)
    verdict = worst(ran)  # UNKNOWN when no test ran
    if not ran:
        message += "; no test ran"
    return finding(exp, CHECK, verdict, message)


__all__ = ["CHECK", "DCGMI_EXIT", "OPTIONAL", "REQUIRED", "DcgmNote", "canonical", "judge_dcgm"]
