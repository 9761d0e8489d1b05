"""Run gpuctl's playbooks through ansible-runner's Python API, once, typed.

Per-host results come from ``runner.stats`` (the PLAY RECAP as data; ``dark`` = unreachable),
never from Ansible's text output. Progress comes from runner events, passed to a callback as
:class:`ProgressEvent`. One private data dir per run is kept for ``gpuctl logs``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from gpuctl.config.derived import split_top_level
from gpuctl.config.model import Cluster
from gpuctl.errors import EnvironmentProblem, UsageError
from gpuctl.fileio import write_atomic
from gpuctl.provision.runs import (
    HostOutcome,
    HostState,
    RunRecord,
    find_run,
    new_run_id,
    now_iso,
    read_record,
    run_dirs,
    write_record,
)
from gpuctl.render import render_cluster
from gpuctl.resources import playbooks_dir

PLAYBOOK = "site.yml"
EventKind = Literal["play", "task", "result"]


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    kind: EventKind
    play: str = ""
    task: str = ""
    host: str = ""
    status: str = ""  # result: ok, changed, failed, unreachable, skipped


@dataclass(frozen=True, slots=True)
class ProvisionResult:
    run_id: str
    run_dir: Path
    record: RunRecord
    seconds: float
    nothing_to_do: bool = False

    @property
    def success(self) -> bool:
        return self.record.status == "successful"


def state_dir_for(cluster_path: Path, state_dir: Path | None = None) -> Path:
    """The CLI's default for where runs are kept: --state-dir, else $GPUCTL_STATE_DIR, else
    .gpuctl beside cluster.yml. Always absolute (see :func:`provision`)."""
    if state_dir is not None:
        return state_dir.resolve()
    env = os.environ.get("GPUCTL_STATE_DIR")
    if env:
        return Path(env).resolve()
    return cluster_path.resolve().parent / ".gpuctl"


_NODESET = re.compile(r"^[A-Za-z0-9_.\-]*\[[0-9,\-]+\][A-Za-z0-9_.\-\[\],]*$")


def ansible_limit(limit: str) -> str:
    """Accept cluster.yml's node set syntax (``gpu[001-004]``) besides Ansible patterns."""
    parts: list[str] = []
    for piece in split_top_level(limit):
        if _NODESET.match(piece):
            try:
                parts.extend(NodeSet(piece))
                continue
            except NodeSetParseError:
                pass
        parts.append(piece)
    return ",".join(parts)


@contextlib.contextmanager
def _lock(state_dir: Path) -> Iterator[None]:
    """One provision at a time per state directory (= per cluster)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "provision.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise UsageError(
                f"another gpuctl provision (pid {other}) is running on this cluster "
                f"({state_dir}); wait for it or stop it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def known_hosts_file(configured: str) -> Path:
    """The cluster's known_hosts (``ssh.known_hosts`` as the loader resolved it, ``~``
    expanded); missing or empty: an error."""
    path = Path(os.path.expanduser(configured))
    if not path.is_file() or path.stat().st_size == 0:
        raise EnvironmentProblem(
            f"ssh.known_hosts: {path} is missing or empty; gpuctl checks every node's host key "
            "against it (collect the keys, e.g. with ssh-keyscan, and verify their fingerprints)"
        )
    return path


def _last_run(state_dir: Path) -> RunRecord:
    if not run_dirs(state_dir):
        raise UsageError(f"--resume: no earlier run under {state_dir / 'runs'}")
    return read_record(find_run(state_dir, None))


def _outcomes(stats: dict[str, Any] | None) -> dict[str, HostOutcome]:
    if not stats:
        return {}
    hosts: set[str] = set()
    for key in ("ok", "changed", "dark", "failures", "skipped", "processed", "rescued", "ignored"):
        hosts.update((stats.get(key) or {}).keys())
    out: dict[str, HostOutcome] = {}
    for host in sorted(hosts):

        def count(key: str, host: str = host) -> int:
            return int((stats.get(key) or {}).get(host, 0))

        state: HostState
        if count("dark"):
            state = "unreachable"
        elif count("failures"):
            state = "failed"
        elif count("changed"):
            state = "changed"
        else:
            state = "ok"
        out[host] = HostOutcome(
            ok=count("ok"),
            changed=count("changed"),
            failed=count("failures"),
            unreachable=count("dark"),
            skipped=count("skipped"),
            rescued=count("rescued"),
            ignored=count("ignored"),
            state=state,
        )
    return out


def _event_to_progress(event: dict[str, Any]) -> ProgressEvent | None:
    name = event.get("event", "")
    data = event.get("event_data") or {}
    if name == "playbook_on_play_start":
        return ProgressEvent("play", play=str(data.get("play", "")))
    if name == "playbook_on_task_start":
        return ProgressEvent("task", play=str(data.get("play", "")), task=str(data.get("task", "")))
    status = {
        "runner_on_ok": "ok",
        "runner_on_failed": "failed",
        "runner_on_unreachable": "unreachable",
        "runner_on_skipped": "skipped",
    }.get(name)
    if status is None:
        return None
    if status == "ok" and (data.get("res") or {}).get("changed"):
        status = "changed"
    if status == "failed" and data.get("ignore_errors"):
        status = "ok"
    return ProgressEvent(
        "result",
        play=str(data.get("play", "")),
        task=str(data.get("task", "")),
        host=str(data.get("host", "")),
        status=status,
    )


def _ansible_playbook() -> str | None:
    beside = Path(sys.executable).parent / "ansible-playbook"
    if beside.is_file():
        return str(beside)
    return shutil.which("ansible-playbook")


def provision(
    cluster: Cluster,
    *,
    cluster_file: Path,
    state_dir: Path,
    limit: str | None = None,
    tags: str | None = None,
    check: bool = False,
    diff: bool = False,
    resume: bool = False,
    on_event: Callable[[ProgressEvent], None] | None = None,
    cancel: threading.Event | None = None,
    playbook: str | None = None,
    extra_envvars: dict[str, str] | None = None,
) -> ProvisionResult:
    """Render the loaded ``cluster`` into a new run directory under ``state_dir`` and run
    ``playbook`` on it. ``cluster_file`` is the cluster.yml it was loaded from (kept in the run
    record). The state directory is made absolute: ansible-runner runs Ansible from the
    playbooks directory, where a relative inventory path would name nothing (Ansible then takes
    the path for a host name)."""
    known_hosts = known_hosts_file(cluster.ssh.known_hosts)
    binary = _ansible_playbook()
    if binary is None:
        raise EnvironmentProblem("ansible-playbook is not installed (it comes with ansible-core)")
    state = state_dir.resolve()
    with _lock(state):
        resumed_from: str | None = None
        if resume:
            if tags:
                raise UsageError("--resume re-runs the last run's tags; do not pass --tags")
            last = _last_run(state)
            resumed_from, tags, check, diff = last.run_id, last.tags, last.check, last.diff
            if last.hosts and last.status in ("successful", "failed"):
                hosts = last.resumable_hosts()
                if not hosts:
                    last.message = "the last run has no failed or unreachable host"
                    return ProvisionResult(
                        last.run_id, state / "runs" / last.run_id, last, 0.0, nothing_to_do=True
                    )
                target: str | None = ",".join(hosts)
            else:
                target = last.limit  # no per-host outcome: that run's whole target again
            if limit and target:
                limit = f"{target},&{ansible_limit(limit)}"
            elif limit:
                limit = ansible_limit(limit)
            else:
                limit = target
        elif limit:
            limit = ansible_limit(limit)

        runs = state / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        run_id = new_run_id(runs)
        run_dir = runs / run_id
        run_dir.mkdir(mode=0o700)
        record = RunRecord(
            run_id=run_id,
            cluster=str(cluster_file.resolve()),
            started=now_iso(),
            check=check,
            diff=diff,
            limit=limit,
            tags=tags,
            resumed_from=resumed_from,
        )
        write_record(run_dir, record)
        inventory = run_dir / "inventory"
        render_cluster(cluster, inventory)
        shutil.copyfile(known_hosts, inventory / "known_hosts")
        started = time.monotonic()
        try:
            status, rc, stats = _run(
                run_dir,
                run_id,
                inventory,
                state,
                playbook=playbook or PLAYBOOK,
                binary=binary,
                limit=limit,
                tags=tags,
                check=check,
                diff=diff,
                on_event=on_event,
                cancel=cancel,
                extra_envvars=extra_envvars or {},
            )
        except BaseException as exc:
            record.status = "canceled" if isinstance(exc, KeyboardInterrupt) else "error"
            record.message = f"{type(exc).__name__}: {exc}"
            record.finished = now_iso()
            write_record(run_dir, record)
            raise
        record.hosts = _outcomes(stats)
        record.rc = rc
        record.finished = now_iso()
        failed = any(o.state in ("failed", "unreachable") for o in record.hosts.values())
        if status == "canceled":
            record.status = "canceled"
        elif status == "successful" and not failed and rc == 0:
            record.status = "successful"
        elif not record.hosts:
            record.status = "error"
            record.message = f"ansible-playbook ended {status} (rc {rc}) before any host ran"
        else:
            record.status = "failed"
        write_record(run_dir, record)
        return ProvisionResult(run_id, run_dir, record, time.monotonic() - started)


def _run(
    run_dir: Path,
    run_id: str,
    inventory: Path,
    state: Path,
    *,
    playbook: str,
    binary: str,
    limit: str | None,
    tags: str | None,
    check: bool,
    diff: bool,
    on_event: Callable[[ProgressEvent], None] | None,
    cancel: threading.Event | None,
    extra_envvars: dict[str, str],
) -> tuple[str, int | None, dict[str, Any] | None]:
    import ansible_runner  # slow to import; only when a run happens

    project = playbooks_dir()
    (run_dir / "runner").mkdir(mode=0o700, exist_ok=True)
    (run_dir / "tmp").mkdir(mode=0o700, exist_ok=True)
    cmdline = [a for a, on in (("--check", check), ("--diff", diff)) if on]
    envvars = {
        # ansible-runner turns host key checking off unless told otherwise: keep it on
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        # the ansible-playbook beside gpuctl's interpreter (a virtualenv need not be activated)
        "PATH": f"{Path(binary).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
        "ANSIBLE_CONFIG": str(inventory / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(project / "roles"),
        "ANSIBLE_LOCAL_TEMP": str(run_dir / "tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        **extra_envvars,
    }

    def handle(event: dict[str, Any]) -> bool:
        if on_event is not None:
            progress = _event_to_progress(event)
            if progress is not None:
                on_event(progress)
        return True

    def on_status(data: dict[str, Any], runner_config: Any = None) -> None:
        if data.get("status") == "running":
            _scrub_command_file(run_dir / "runner" / "artifacts" / run_id / "command", envvars)

    def cancelled() -> bool:
        return cancel is not None and cancel.is_set()

    runner = ansible_runner.run(
        private_data_dir=str(run_dir / "runner"),
        project_dir=str(project),
        playbook=playbook,
        inventory=str(inventory / "inventory.yml"),
        ident=run_id,
        limit=limit,
        tags=tags,
        cmdline=" ".join(cmdline) if cmdline else None,
        envvars=envvars,
        quiet=True,
        event_handler=handle,
        status_handler=on_status,
        cancel_callback=cancelled,
    )
    _scrub_command_file(run_dir / "runner" / "artifacts" / run_id / "command", envvars)
    stats = runner.stats if runner.status != "canceled" else None
    return str(runner.status), runner.rc, stats


# Environment variables whose values ansible-runner's `command` artifact may keep: everything
# else in gpuctl's environment (tokens, BMC credentials, vault variables) is blanked there.
_KEPT_ENV = re.compile(
    r"^(ANSIBLE_\w+|RUNNER_\w+|AWX_ISOLATED_DATA_DIR|PATH|HOME|LANG|LC_\w+|TERM|USER|LOGNAME|"
    r"SHELL|PWD|PYTHON\w*|TMPDIR|SSH_AUTH_SOCK|NO_COLOR)$"
)


def _scrub_command_file(path: Path, envvars: dict[str, str]) -> None:
    """ansible-runner dumps the whole process environment into artifacts/<id>/command."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    env = data.get("env") or {}
    data["env"] = {
        k: (v if (k in envvars or _KEPT_ENV.match(k)) else "(not kept by gpuctl)")
        for k, v in env.items()
    }
    write_atomic(path, json.dumps(data), mode=0o600)
