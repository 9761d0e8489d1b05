"""pytest plugin of the acceptance suite: the ``node`` fixture, the ``applies_to`` marker, and
SSH settings for testinfra that keep host key checking on.

Loaded by the suite's conftest.py, or with ``-p gpuctl.acceptance.plugin`` so that test folders of
your own get the same fixtures (``gpuctl acceptance --tests DIR`` does that).

testinfra's Ansible backend runs commands over plain ``ssh`` with the inventory's
``ansible_ssh_common_args``, which `gpuctl render` writes as
``-o UserKnownHostsFile={{ inventory_dir }}/known_hosts -o StrictHostKeyChecking=yes ...``.
testinfra does not template it, so this plugin does (``inventory_dir`` only) and hands the
result to testinfra through ``ANSIBLE_SSH_COMMON_ARGS``, which testinfra prefers to the host
variable. A value that still holds Jinja, differs between hosts, or does not say
``StrictHostKeyChecking=yes`` stops the run.
"""

from __future__ import annotations

import configparser
import importlib
import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, Protocol, TypeVar

import pytest

from gpuctl.acceptance import expect
from gpuctl.errors import GpuctlError

# every command on a node runs under coreutils' timeout: a hung tool fails its test
COMMAND_TIMEOUT_S = 60
MARKER = "applies_to"
P = ParamSpec("P")
T = TypeVar("T")
_INVENTORY_DIR = re.compile(r"\{\{\s*inventory_dir\s*\}\}")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+@:,=-]+$")


class CommandResult(Protocol):
    @property
    def rc(self) -> int: ...
    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...


class TestinfraHost(Protocol):
    """The part of testinfra's ``host`` fixture this suite uses."""

    @property
    def backend(self) -> Any: ...
    @property
    def ansible(self) -> Any: ...
    def run(self, command: str, *args: str, **kwargs: Any) -> CommandResult: ...
    def get_host(self, hostspec: str, **kwargs: Any) -> TestinfraHost: ...


@dataclass(frozen=True, slots=True)
class Result:
    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.rc in (124, 137)

    def describe(self) -> str:
        cmd = shlex.join(self.argv)
        if self.timed_out:
            return f"`{cmd}` timed out after {COMMAND_TIMEOUT_S} s"
        detail = (self.stderr.strip() or self.stdout.strip())[-400:]
        return f"`{cmd}` exited {self.rc}" + (f": {detail}" if detail else "")


def fail(message: str) -> NoReturn:
    __tracebackhide__ = True
    pytest.fail(message, pytrace=False)


def not_applicable(reason: str) -> NoReturn:
    __tracebackhide__ = True
    pytest.skip(f"not applicable: {reason}")


class Node:
    """One inventory host: its variables, its OS family, and commands on it (with timeouts)."""

    def __init__(self, host: TestinfraHost, inventory: Path | None) -> None:
        if getattr(host.backend, "NAME", None) != "ansible":
            fail(
                "the gpuctl acceptance suite reads what to expect from the rendered inventory: "
                "run it with --hosts=ansible://all --ansible-inventory=<rendered>/inventory.yml"
            )
        self.host = host
        self.name: str = str(host.backend.get_hostname())
        self.inventory = inventory
        self._packages: dict[str, str | None] = {}
        self._holds: str | None = None

    # -- variables ----------------------------------------------------------------------
    @cached_property
    def vars(self) -> Mapping[str, Any]:
        hostvars = self.host.ansible.get_variables()
        if not isinstance(hostvars, dict) or "group_names" not in hostvars:
            fail(f"{self.name}: no host variables in the inventory")
        return dict(hostvars)

    @cached_property
    def groups(self) -> frozenset[str]:
        return self.expected(expect.groups, self.vars)

    @cached_property
    def family(self) -> expect.OsFamily:
        result = self.run("cat", "/etc/os-release")
        if result.rc != 0:
            fail(f"{self.name}: cannot read the OS: {result.describe()}")
        return self.expected(expect.os_family, result.stdout)

    @property
    def rendered(self) -> Path:
        """The render directory (inventory.yml's folder): slurm/, group_vars/, ansible.cfg."""
        if self.inventory is None:
            fail("no --ansible-inventory given: the rendered files cannot be found")
        return self.inventory.parent

    def expected(self, func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Call an expectation of :mod:`gpuctl.acceptance.expect`; its errors fail the test."""
        __tracebackhide__ = True
        try:
            return func(*args, **kwargs)
        except GpuctlError as exc:
            fail(f"{self.name}: cannot tell what to expect: {exc}")

    # -- commands -------------------------------------------------------------------------
    def run(self, *argv: str, timeout: int = COMMAND_TIMEOUT_S) -> Result:
        """``argv`` on the node under ``timeout``; an unreachable node raises (the test errors)."""
        full = ("timeout", "-k", "5", str(timeout), *argv)
        out = self.host.run(" ".join(["%s"] * len(full)), *full)
        return Result(tuple(argv), int(out.rc), str(out.stdout), str(out.stderr))

    def sh(self, script: str, timeout: int = COMMAND_TIMEOUT_S) -> Result:
        return self.run("sh", "-c", script, timeout=timeout)

    def check_output(self, *argv: str) -> str:
        """stdout of a command that must succeed; anything else fails the test."""
        __tracebackhide__ = True
        result = self.run(*argv)
        if result.rc != 0:
            fail(f"{self.name}: {result.describe()}")
        return result.stdout

    def other(self, name: str) -> Node:
        """Another host of the same inventory (cross-node checks)."""
        if self.inventory is None:
            fail("no --ansible-inventory given")
        return Node(
            self.host.get_host(f"ansible://{name}", ansible_inventory=str(self.inventory)),
            self.inventory,
        )

    # -- files and services ---------------------------------------------------------------
    def stat(self, path: str) -> tuple[str, str, str, str] | None:
        """(owner, group, octal mode, file type) of ``path``, None when it does not exist."""
        result = self.run("stat", "-c", "%U|%G|%a|%F", path)
        if result.rc != 0:
            test = self.run("test", "-e", path)
            if test.rc == 1:
                return None
            fail(f"{self.name}: cannot stat {path}: {result.describe()}")
        parts = result.stdout.strip().split("|")
        if len(parts) != 4:
            fail(f"{self.name}: unexpected stat output for {path}: {result.stdout!r}")
        return parts[0], parts[1], parts[2], parts[3]

    def exists(self, path: str) -> bool:
        result = self.run("test", "-e", path)
        if result.rc not in (0, 1):
            fail(f"{self.name}: cannot tell whether {path} exists: {result.describe()}")
        return result.rc == 0

    def service_problems(self, name: str, *, enabled: bool = True) -> list[str]:
        """Why systemd unit ``name`` is not active (and enabled); empty when it is."""
        problems: list[str] = []
        active = self.run("systemctl", "is-active", f"{name}.service")
        state = active.stdout.strip()
        if state != "active":
            problems.append(f"{name} is {state or 'not known to systemd'} ({active.describe()})")
        if enabled:
            en = self.run("systemctl", "is-enabled", f"{name}.service")
            how = en.stdout.strip()
            if how not in ("enabled", "enabled-runtime", "static", "alias", "indirect"):
                problems.append(f"{name} is not enabled at boot ({how or en.describe()})")
        return problems

    # -- packages -------------------------------------------------------------------------
    def package_version(self, name: str) -> str | None:
        """The installed version (``[epoch:]version-revision``), None when not installed."""
        if name in self._packages:
            return self._packages[name]
        version: str | None
        if self.family == "RedHat":
            result = self.run("rpm", "-q", "--qf", r"%{EPOCH}:%{VERSION}-%{RELEASE}\n", name)
            text = result.stdout.strip()
            if result.rc == 1 and "is not installed" in text:
                version = None
            elif result.rc == 0 and text:
                version = text.splitlines()[0].removeprefix("(none):")
            else:
                fail(f"{self.name}: cannot read package {name}: {result.describe()}")
        else:
            result = self.run("dpkg-query", "-W", "-f=${db:Status-Abbrev}|${Version}\n", name)
            if result.rc == 1 and "no packages found" in result.stderr:
                version = None
            elif result.rc == 0 and "|" in result.stdout:
                status, _, found = result.stdout.splitlines()[0].partition("|")
                if len(status) < 2 or status[2:].strip():
                    fail(f"{self.name}: package {name} is in a broken dpkg state {status!r}")
                version = found.strip() if status[1] == "i" and found.strip() else None
            else:
                fail(f"{self.name}: cannot read package {name}: {result.describe()}")
        self._packages[name] = version
        return version

    def holds(self) -> str:
        """``apt-mark showhold`` or ``dnf -q versionlock list`` (which must succeed)."""
        if self._holds is None:
            if self.family == "RedHat":
                self._holds = self.check_output("dnf", "-q", "versionlock", "list")
            else:
                self._holds = self.check_output("apt-mark", "showhold")
        return self._holds

    def package_problems(self, specs: Iterable[expect.PackageSpec]) -> list[str]:
        """Every way ``specs`` differ from what is installed and held; empty when none."""
        problems: list[str] = []
        for spec in specs:
            version = self.package_version(spec.name)
            if version is None:
                problems.append(f"{spec.describe()}: not installed")
                continue
            if not expect.version_matches(version, spec, self.family):
                problems.append(f"{spec.name}: installed {version}, expected {spec.version}")
            if spec.held and not expect.held(self.holds(), spec.name, self.family):
                how = "dnf versionlock" if self.family == "RedHat" else "apt-mark showhold"
                problems.append(f"{spec.name}: not held ({how} does not list it)")
        return problems


def _report(node: Node, what: str, problems: Sequence[str]) -> None:
    __tracebackhide__ = True
    if problems:
        fail(f"{node.name}: {what}:\n  " + "\n  ".join(problems))


def assert_packages(node: Node, what: str, specs: Iterable[expect.PackageSpec]) -> None:
    __tracebackhide__ = True
    _report(node, what, node.package_problems(specs))


def assert_services(node: Node, names: Iterable[str]) -> None:
    __tracebackhide__ = True
    problems = [p for name in names for p in node.service_problems(name)]
    _report(node, "services", problems)


# ------------------------------------------------------------------------------------------
# pytest hooks and fixtures


def _inventory_option(config: pytest.Config) -> Path | None:
    value = getattr(config.option, "ansible_inventory", None)
    return Path(value) if value else None


def ssh_common_args(hostvars: Mapping[str, Mapping[str, Any]], inventory_dir: Path) -> str:
    """The one ``ansible_ssh_common_args`` of every host, ``{{ inventory_dir }}`` filled in."""
    values = {str(v.get("ansible_ssh_common_args") or "") for v in hostvars.values()}
    if len(values) != 1:
        raise pytest.UsageError(
            "gpuctl acceptance: hosts of the inventory have different ansible_ssh_common_args; "
            "testinfra gets one value for all of them"
        )
    value = values.pop()
    directory = str(inventory_dir)
    if _INVENTORY_DIR.search(value) and not _SAFE_PATH.match(directory):
        raise pytest.UsageError(
            f"gpuctl acceptance: the inventory's folder {directory!r} has characters that SSH "
            "arguments cannot carry unquoted; use a plain path"
        )
    value = _INVENTORY_DIR.sub(directory, value)
    if "{{" in value or "{%" in value:
        raise pytest.UsageError(
            f"gpuctl acceptance: ansible_ssh_common_args holds Jinja testinfra cannot expand: "
            f"{value}"
        )
    return value


def _ssh_hosts(hostvars: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Hosts testinfra reaches with ``ssh``; paramiko is refused (testinfra's paramiko backend
    accepts unknown host keys)."""
    out: dict[str, Mapping[str, Any]] = {}
    for name, hv in hostvars.items():
        connection = str(hv.get("ansible_connection") or "ssh")
        if connection in ("paramiko", "paramiko_ssh"):
            raise pytest.UsageError(
                f"gpuctl acceptance: {name} uses ansible_connection {connection}; testinfra's "
                "paramiko backend does not check host keys: use ssh"
            )
        if connection in ("ssh", "smart"):
            out[name] = hv
    return out


def _host_key_checked(args: str) -> bool:
    words = shlex.split(args)
    options = [w for w in words if "=" in w and not w.startswith("-")]
    strict = [o.split("=", 1)[1] for o in options if o.lower().startswith("stricthostkeychecking=")]
    return bool(strict) and all(s.lower() == "yes" for s in strict)


def prepare_environment(config: pytest.Config) -> None:
    """ANSIBLE_CONFIG and ANSIBLE_SSH_COMMON_ARGS for testinfra, from the rendered inventory."""
    inventory = _inventory_option(config)
    if inventory is None:
        return
    inventory = inventory.resolve()
    cfg = inventory.parent / "ansible.cfg"
    if "ANSIBLE_CONFIG" not in os.environ and cfg.is_file():
        os.environ["ANSIBLE_CONFIG"] = str(cfg)
    if "ANSIBLE_SSH_COMMON_ARGS" not in os.environ:
        runner_mod = importlib.import_module("testinfra.utils.ansible_runner")
        runner = runner_mod.AnsibleRunner.get_runner(config.option.ansible_inventory)
        try:
            hostvars = runner.inventory["_meta"]["hostvars"]
        except Exception as exc:  # ansible-inventory failed or printed no inventory
            raise pytest.UsageError(
                f"gpuctl acceptance: cannot read the inventory {inventory}: {exc}"
            ) from exc
        if not hostvars:
            raise pytest.UsageError(f"gpuctl acceptance: the inventory {inventory} has no hosts")
        ssh_hosts = _ssh_hosts(hostvars)
        if not ssh_hosts:
            return  # local (or container) connections only: no SSH, no host keys
        os.environ["ANSIBLE_SSH_COMMON_ARGS"] = ssh_common_args(ssh_hosts, inventory.parent)
    # what testinfra puts on ssh's command line, in its order (ssh takes an option's first value)
    combined = " ".join(
        (
            _config_ssh_args(os.environ.get("ANSIBLE_CONFIG")),
            os.environ["ANSIBLE_SSH_COMMON_ARGS"],
            os.environ.get("ANSIBLE_SSH_EXTRA_ARGS", ""),
        )
    )
    if not _host_key_checked(combined):
        raise pytest.UsageError(
            "gpuctl acceptance: SSH arguments must check host keys "
            "(-o StrictHostKeyChecking=yes against a known_hosts file); got: " + combined.strip()
        )


def _config_ssh_args(path: str | None) -> str:
    """[ssh_connection] ssh_args of the ansible.cfg testinfra reads."""
    if not path:
        return ""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path)
    return parser.get("ssh_connection", "ssh_args", fallback="")


_PREPARED = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*groups): the test applies only to hosts in one of these inventory groups "
        "(others skip it as not applicable)",
    )
    if not config.stash.get(_PREPARED, False):
        config.stash[_PREPARED] = True
        prepare_environment(config)


@pytest.fixture(scope="module")
def _gpuctl_node(host: TestinfraHost, request: pytest.FixtureRequest) -> Node:
    return Node(host, _inventory_option(request.config))


@pytest.fixture
def node(_gpuctl_node: Node, request: pytest.FixtureRequest) -> Node:
    """The host under test; skips (not applicable) where the test's ``applies_to`` groups do
    not include it."""
    for marker in request.node.iter_markers(MARKER):
        wanted = {str(g) for g in marker.args}
        if wanted and not (wanted & _gpuctl_node.groups):
            shown = " or ".join(sorted(wanted))
            not_applicable(f"{_gpuctl_node.name} is not in group {shown}")
    return _gpuctl_node
