"""`gpuctl acceptance`: render the cluster into a run directory and run the acceptance suite on
it with pytest (a subprocess of this interpreter), JUnit XML out.

Run directory (under the state directory, like `gpuctl provision`'s runs)::

    acceptance/<run id>/inventory/   gpuctl render's output and the known_hosts it checks against
    acceptance/<run id>/pytest.ini   the run's own pytest settings (no project's ini applies)
    acceptance/<run id>/pytest.log   pytest's output
    acceptance/<run id>/junit.xml    the JUnit report (unless --junit puts it elsewhere)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpuctl.config.model import Cluster
from gpuctl.errors import EnvironmentProblem, UsageError
from gpuctl.provision.runner import ansible_limit, known_hosts_file
from gpuctl.provision.runs import new_run_id
from gpuctl.render import render_cluster

SUITE = "gpuctl.acceptance"
PLUGIN = "gpuctl.acceptance.plugin"
Outcome = Literal["passed", "failed", "error", "skipped"]
Status = Literal["passed", "failed", "error"]

# pytest's exit codes (pytest.ExitCode): 0 ok, 1 tests failed, 2 interrupted or collection
# errors, 3 internal error, 4 usage error, 5 no tests collected
PYTEST_OK, PYTEST_FAILED = 0, 1

_INI = """\
# Written by gpuctl acceptance for this run: no project's pytest settings apply.
[pytest]
junit_family = xunit2
junit_suite_name = gpuctl-acceptance
junit_logging = no
python_files = test_*.py
"""


@dataclass(frozen=True, slots=True)
class TestOutcome:
    """One test on one host, from the JUnit report."""

    __test__ = False  # not a pytest test class

    name: str
    host: str | None
    outcome: Outcome
    message: str = ""


@dataclass(frozen=True, slots=True)
class AcceptanceRun:
    """Everything a run needs, prepared: the command, its environment, where results go."""

    run_dir: Path
    inventory: Path
    hosts: tuple[str, ...]
    junit: Path
    test_dirs: tuple[Path, ...]
    argv: tuple[str, ...]
    env: dict[str, str] = field(repr=False)


@dataclass(frozen=True, slots=True)
class AcceptanceResult:
    run: AcceptanceRun
    returncode: int
    status: Status
    tests: tuple[TestOutcome, ...]
    seconds: float
    message: str = ""

    def counts(self, host: str | None = None) -> dict[Outcome, int]:
        out: dict[Outcome, int] = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        for t in self.tests:
            if host is None or t.host == host:
                out[t.outcome] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "returncode": self.returncode,
            "run_dir": str(self.run.run_dir),
            "junit": str(self.run.junit),
            "hosts": list(self.run.hosts),
            "counts": self.counts(),
            "per_host": {h: self.counts(h) for h in self.run.hosts},
            "tests": [
                {"name": t.name, "host": t.host, "outcome": t.outcome, "message": t.message}
                for t in self.tests
            ],
            "seconds": round(self.seconds, 1),
            "message": self.message,
        }


def _tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    return shutil.which(name)


def build_env(inventory: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the pytest run: no ANSIBLE_* of the caller's (an SSH argument there
    could turn host key checking off), the rendered ansible.cfg, this interpreter's tools."""
    source = dict(os.environ if base is None else base)
    env = {k: v for k, v in source.items() if not k.startswith("ANSIBLE_")}
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        {
            "PATH": f"{bin_dir}{os.pathsep}{source.get('PATH', os.defpath)}",
            "ANSIBLE_CONFIG": str(inventory.parent / "ansible.cfg"),
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCAL_TEMP": str(inventory.parent.parent / "tmp"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    return env


def build_command(
    *,
    run_dir: Path,
    inventory: Path,
    hosts: Sequence[str] | None,
    junit: Path,
    test_dirs: Sequence[Path] = (),
    include_suite: bool = True,
    python: str | None = None,
) -> list[str]:
    """pytest on the shipped suite and the user's test folders, against ``hosts`` (None: all).

    ``include_suite`` False runs only ``test_dirs`` (for gpuctl's own tests of the runner).
    """
    if hosts is None:
        spec = "ansible://all"
    else:
        if not hosts:
            raise UsageError("no host to test")
        spec = ",".join(f"ansible://{h}" for h in hosts)
    argv = [
        python or sys.executable,
        "-m",
        "pytest",
        "-c",
        str(run_dir / "pytest.ini"),
        "--rootdir",
        str(run_dir),
        "-p",
        "no:cacheprovider",
        "-p",
        PLUGIN,
        "--import-mode=importlib",
        f"--hosts={spec}",
        f"--ansible-inventory={inventory}",
        f"--junitxml={junit}",
        "-v",
        "-ra",
        "--tb=short",
        "--color=no",
    ]
    if include_suite:
        argv += ["--pyargs", SUITE]
    argv += [str(d) for d in test_dirs]
    return argv


def resolve_hosts(inventory: Path, limit: str | None, env: dict[str, str]) -> tuple[str, ...]:
    """The inventory's hosts, or those ``limit`` selects (node sets or Ansible patterns)."""
    binary = _tool("ansible-inventory")
    if binary is None:
        raise EnvironmentProblem("ansible-inventory is not installed (it comes with ansible-core)")
    argv = [binary, "-i", str(inventory), "--list"]
    if limit:
        argv += ["--limit", ansible_limit(limit)]
    proc = subprocess.run(  # noqa: S603 - argv list, never a shell
        argv, capture_output=True, text=True, env=env, timeout=120, check=False
    )
    if proc.returncode != 0:
        raise EnvironmentProblem(f"ansible-inventory failed: {proc.stderr.strip()[-500:]}")
    try:
        data = json.loads(proc.stdout)
        hosts = sorted(data["_meta"]["hostvars"])
    except (ValueError, KeyError, TypeError) as exc:
        raise EnvironmentProblem(f"ansible-inventory printed no inventory: {exc}") from exc
    if not hosts:
        raise UsageError(f"--limit {limit} matches no host of the cluster" if limit else "no hosts")
    return tuple(hosts)


def prepare(
    cluster: Cluster,
    *,
    state_dir: Path,
    limit: str | None = None,
    junit: Path | None = None,
    test_dirs: Sequence[Path] = (),
    include_suite: bool = True,
) -> AcceptanceRun:
    """Render the loaded cluster into a new run directory under ``state_dir``/acceptance and
    build the pytest command."""
    known_hosts = known_hosts_file(cluster.ssh.known_hosts)
    dirs: list[Path] = []
    for d in test_dirs:
        if not d.is_dir():
            raise UsageError(f"--tests {d}: not a folder")
        dirs.append(d.resolve())
    if junit is not None:
        junit = junit.resolve()
        if not junit.parent.is_dir():
            raise UsageError(f"--junit {junit}: folder {junit.parent} does not exist")
        if junit.is_dir():
            raise UsageError(f"--junit {junit}: is a folder")
    runs = state_dir.resolve() / "acceptance"
    runs.mkdir(parents=True, exist_ok=True)
    run_dir = runs / new_run_id(runs)
    run_dir.mkdir(mode=0o700)
    (run_dir / "tmp").mkdir(mode=0o700)
    rendered = run_dir / "inventory"
    render_cluster(cluster, rendered)
    shutil.copyfile(known_hosts, rendered / "known_hosts")
    inventory = rendered / "inventory.yml"
    (run_dir / "pytest.ini").write_text(_INI, encoding="utf-8")
    env = build_env(inventory)
    hosts = resolve_hosts(inventory, limit, env)
    junit = junit or run_dir / "junit.xml"
    argv = build_command(
        run_dir=run_dir,
        inventory=inventory,
        hosts=hosts if limit else None,
        junit=junit,
        test_dirs=dirs,
        include_suite=include_suite,
    )
    return AcceptanceRun(run_dir, inventory, hosts, junit, tuple(dirs), tuple(argv), env)


def execute(run: AcceptanceRun, on_output: Callable[[str], None] | None = None) -> AcceptanceResult:
    """Run pytest; its output goes line by line to ``on_output`` and to ``pytest.log``."""
    started = time.monotonic()
    if run.junit.exists():
        run.junit.unlink()  # never read an earlier run's report as this one's
    log_path = run.run_dir / "pytest.log"
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(  # noqa: S603 - argv list, never a shell
            run.argv,
            cwd=run.run_dir,
            env=run.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        try:
            assert proc.stdout is not None  # noqa: S101 - stdout=PIPE above
            for line in proc.stdout:
                log.write(line)
                if on_output is not None:
                    on_output(line.rstrip("\n"))
            returncode = proc.wait()
        except BaseException:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    tests, problem = read_junit(run.junit, run.hosts)
    status, message = judge(returncode, tests, problem)
    return AcceptanceResult(run, returncode, status, tests, time.monotonic() - started, message)


def judge(
    returncode: int, tests: Sequence[TestOutcome], junit_problem: str | None
) -> tuple[Status, str]:
    """passed only when pytest says so AND the report agrees; failed when tests failed; error
    for anything that kept the suite from running (collection errors, usage, no tests)."""
    failed = sum(t.outcome in ("failed", "error") for t in tests)
    if returncode == PYTEST_OK:
        if junit_problem:
            return "error", f"pytest passed but its report is unusable: {junit_problem}"
        if failed:
            return "failed", f"the report has {failed} failed test(s) although pytest passed"
        if not any(t.outcome == "passed" for t in tests):
            return "error", "no test passed (every test skipped)"
        return "passed", ""
    if returncode == PYTEST_FAILED:
        return "failed", ""
    reason = {
        2: "pytest was interrupted or could not collect the tests (see its output)",
        3: "pytest stopped with an internal error (see its output)",
        4: "pytest was called wrongly (see its output)",
        5: "no tests were collected",
    }.get(returncode, f"pytest exited {returncode}")
    return "error", reason


_OUTCOMES: dict[str, Outcome] = {"failure": "failed", "error": "error", "skipped": "skipped"}
_HOST_ID = re.compile(r"ansible://([^\],]+)")


def host_of(name: str, hosts: Sequence[str]) -> str | None:
    """The host in a test id such as ``test_x[ansible://gpu001]`` or
    ``test_y[ansible://gpu-a-01-slurm.conf]`` (the longest inventory host that fits)."""
    match = _HOST_ID.search(name)
    if match is None:
        return None
    rest = match.group(1)
    fits = [h for h in hosts if rest == h or rest.startswith(h + "-")]
    return max(fits, key=len) if fits else None


def read_junit(path: Path, hosts: Sequence[str]) -> tuple[tuple[TestOutcome, ...], str | None]:
    """Test outcomes from pytest's JUnit XML; (outcomes, why the file could not be read)."""
    try:
        root = ET.parse(path).getroot()  # noqa: S314 - this run's own file
    except FileNotFoundError:
        return (), f"{path} was not written"
    except (ET.ParseError, OSError) as exc:
        return (), f"{path}: {exc}"
    out: list[TestOutcome] = []
    for case in root.iter("testcase"):
        name = case.get("name", "")
        classname = case.get("classname", "")
        full = f"{classname}::{name}" if classname else name
        outcome: Outcome = "passed"
        message = ""
        for child in case:
            found = _OUTCOMES.get(child.tag)
            if found is not None:
                outcome, message = found, (child.get("message") or "").strip()
                break
        out.append(TestOutcome(full, host_of(name, hosts), outcome, message))
    return tuple(out), None
