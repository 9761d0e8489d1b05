"""`gpuctl rollout plan|apply|status|resume|abort` as library calls: a loaded cluster.yml in,
result objects out (the CLI loads cluster.yml, once per invocation, and renders the results).

Every entry point takes the :class:`~gpuctl.config.model.Cluster` the CLI loaded and the path it
was read from (recorded in options.json, and what the backend's BMC credentials and provisioning
run resolve against): an edit of cluster.yml during a rollout changes nothing in it, thresholds
included. Scope: the cluster's Slurm compute nodes (cluster.yml order), narrowed by
``--limit``. State: ``<state dir>/rollouts/<id>/`` (state.json, audit.jsonl, options.json,
validate/ bundles), ``<state dir>`` being ``--state-dir``, ``$GPUCTL_STATE_DIR`` or ``.gpuctl``
beside cluster.yml, as for `gpuctl provision` (the CLI resolves it:
:func:`gpuctl.provision.runner.state_dir_for`). One rollout per cluster at a time
(``rollouts/.lock``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuctl.config.facts import roles_of
from gpuctl.config.model import Cluster
from gpuctl.errors import UsageError
from gpuctl.provision.runner import state_dir_for
from gpuctl.rollout.backend import (
    Backend,
    BackendError,
    Versions,
    settled_slurm_node,
)
from gpuctl.rollout.cluster import (
    ClusterBackend,
    check_supported,
    provision_with_gpuctl,
    sha256_of,
    validate_with_gpuctl,
)
from gpuctl.rollout.executor import Executor
from gpuctl.rollout.model import (
    AuditEvent,
    Component,
    Plan,
    Policy,
    PolicyError,
    RolloutError,
    RolloutLocked,
    RolloutState,
    Status,
)
from gpuctl.rollout.plan import plan_rollout
from gpuctl.rollout.store import (
    RolloutStore,
    StateFileError,
    cluster_lock,
    current_rollout,
    interrupted_note,
    new_rollout,
    read_json_file,
    write_state_file,
)
from gpuctl.slurm import SlurmNode
from gpuctl.validation.scope import select_nodes

OPTIONS = "options.json"
READ_PARALLEL = 32


@dataclass(frozen=True, slots=True)
class PolicyOverrides:
    """Flags that replace cluster.yml's ``rollout:`` values (None: keep cluster.yml's)."""

    canary: int | None = None
    batch_size: int | None = None
    max_unavailable: str | None = None
    failure_threshold: int | None = None
    drain_timeout_s: float | None = None
    reboot_timeout_s: float | None = None
    validate_level: str | None = None

    def batching_given(self) -> bool:
        return any(v is not None for v in (self.canary, self.batch_size, self.max_unavailable))


def policy_for(cluster: Cluster, flags: PolicyOverrides) -> Policy:
    """cluster.yml's ``rollout:`` with the flags on top; --batch-size and --max-unavailable
    replace each other (they are exclusive)."""
    ro = cluster.rollout
    batch_size: int | None = ro.batch_size
    max_unavailable: int | str | None = ro.max_unavailable
    if flags.batch_size is not None:
        batch_size, max_unavailable = flags.batch_size, None
    if flags.max_unavailable is not None:
        text = flags.max_unavailable.strip()
        max_unavailable = int(text) if text.isdigit() else text
        batch_size = None
    try:
        return Policy(
            canary=ro.canary if flags.canary is None else flags.canary,
            batch_size=batch_size,
            max_unavailable=max_unavailable,
            failure_threshold=(
                ro.failure_threshold if flags.failure_threshold is None else flags.failure_threshold
            ),
            drain_timeout_s=float(
                ro.drain_timeout_s if flags.drain_timeout_s is None else flags.drain_timeout_s
            ),
            reboot_timeout_s=float(
                ro.reboot_timeout_s if flags.reboot_timeout_s is None else flags.reboot_timeout_s
            ),
            validate_level=(
                ro.validate_level.value if flags.validate_level is None else flags.validate_level
            ),
            poll_interval_s=ro.poll_interval_s,
        )
    except PolicyError as exc:
        raise UsageError(f"rollout policy: {exc}") from None


def scope(cluster: Cluster, limit: str | None) -> list[str]:
    """The Slurm compute nodes of cluster.yml (in its order), narrowed by ``limit``."""
    compute = [n for n, roles in roles_of(cluster).items() if "compute" in roles]
    if limit is None:
        return compute
    chosen = set(select_nodes(cluster, limit))
    out = [n for n in compute if n in chosen]
    if not out:
        raise UsageError(f"--limit {limit}: no Slurm compute node in it")
    return out


def read_nodes(
    backend: Backend, nodes: Sequence[str], component: Component
) -> tuple[dict[str, SlurmNode], dict[str, Versions | BackendError]]:
    """Slurm state and versions of every node, read concurrently; a node whose Slurm state
    cannot be read is missing from the first map (planned ``unknown``)."""
    slurm: dict[str, SlurmNode] = {}
    versions: dict[str, Versions | BackendError] = {}

    def one(node: str) -> None:
        # unread: planned "unknown" (Slurm state not read), never assumed in service
        with contextlib.suppress(BackendError):
            slurm[node] = settled_slurm_node(backend, node)
        try:
            versions[node] = backend.versions(node, component)
        except BackendError as exc:
            versions[node] = exc

    with ThreadPoolExecutor(max_workers=max(1, min(READ_PARALLEL, len(nodes)))) as pool:
        list(pool.map(one, nodes))
    return slurm, versions


@dataclass(frozen=True, slots=True)
class RolloutOptions:
    """What a rollout needs besides its plan to continue: kept in options.json (no secrets)."""

    cluster: str
    image: str | None = None
    image_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "image": self.image, "image_sha256": self.image_sha256}


BackendFactory = Callable[[Path, Cluster, Path | None, Path], Backend]


def cluster_backend(
    cluster_path: Path, cluster: Cluster, image: Path | None, rollout_dir: Path
) -> Backend:
    """The real backend; validation bundles under ``rollout_dir/validate``."""
    return ClusterBackend(
        cluster_path,
        cluster,
        image=image,
        provision_fn=provision_with_gpuctl(cluster, cluster_path, state_dir_for(cluster_path)),
        validate_fn=validate_with_gpuctl(cluster, rollout_dir / "validate"),
    )


def _close(backend: Backend) -> None:
    close = getattr(backend, "close", None)
    if callable(close):
        close()


@dataclass(frozen=True, slots=True)
class PlanResult:
    plan: Plan

    @property
    def problems(self) -> bool:
        return bool(self.plan.problems)


def make_plan(
    cluster: Cluster,
    cluster_path: Path,
    component: Component,
    target: str,
    *,
    limit: str | None = None,
    flags: PolicyOverrides | None = None,
    image: Path | None = None,
    backend_factory: BackendFactory | None = None,
    work_dir: Path | None = None,
) -> PlanResult:
    """Read every node in scope and plan; changes nothing."""
    check_supported(cluster_path, cluster, component, target, image, scope(cluster, limit))
    factory = backend_factory or cluster_backend
    where = work_dir or Path(".")
    plan = _read_and_plan(
        cluster_path, cluster, component, target, limit, flags, image, factory, where
    )
    return PlanResult(plan)


def _read_and_plan(
    cluster_path: Path,
    cluster: Cluster,
    component: Component,
    target: str,
    limit: str | None,
    flags: PolicyOverrides | None,
    image: Path | None,
    factory: BackendFactory,
    work_dir: Path,
) -> Plan:
    """Read every node in scope through a backend of its own (closed after) and plan."""
    policy = policy_for(cluster, flags or PolicyOverrides())
    nodes = scope(cluster, limit)
    backend = factory(cluster_path, cluster, image, work_dir)
    try:
        slurm, versions = read_nodes(backend, nodes, component)
    finally:
        _close(backend)
    try:
        return plan_rollout(nodes, slurm, versions, component, target, policy)
    except RolloutError as exc:
        raise UsageError(str(exc)) from None


@dataclass(slots=True)
class RunResult:
    """How `apply` or `resume` left the rollout."""

    state: RolloutState
    directory: Path
    audit: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state.status is Status.DONE and not self.state.failed


def apply(
    cluster: Cluster,
    cluster_path: Path,
    component: Component,
    target: str,
    *,
    state: Path,
    limit: str | None = None,
    flags: PolicyOverrides | None = None,
    image: Path | None = None,
    backend_factory: BackendFactory | None = None,
    on_started: Callable[[RolloutStore], None] | None = None,
) -> RunResult:
    """Plan, record and run a new rollout under the state dir ``state``. Refuses while an
    earlier one is unfinished (resume or abort it first) and when the plan has nodes whose state
    could not be read."""
    check_supported(cluster_path, cluster, component, target, image, scope(cluster, limit))
    with cluster_lock(state):
        previous = current_rollout(state)
        if previous is not None:
            old = previous.load()
            if old.status in (Status.PLANNED, Status.RUNNING, Status.HALTED):
                # we hold the lock: a rollout that says running was interrupted
                shown = (
                    f"was {interrupted_note(_audit_or_empty(previous))}"
                    if old.status is Status.RUNNING
                    else f"is {old.status}"
                )
                raise UsageError(
                    f"rollout {old.rollout_id} {shown}: `gpuctl rollout resume` or "
                    "`gpuctl rollout abort` it first"
                )
        factory = backend_factory or cluster_backend
        plan = _read_and_plan(
            cluster_path, cluster, component, target, limit, flags, image, factory, state
        )
        if plan.problems:
            names = ", ".join(f"{p.node} ({p.reason})" for p in plan.problems)
            raise UsageError(f"cannot plan these nodes, nothing started: {names}")
        store = new_rollout(state, plan)
        options = RolloutOptions(
            str(cluster_path.resolve()),
            str(image.resolve()) if image is not None else None,
            sha256_of(image) if image is not None else None,
        )
        text = json.dumps(options.to_json(), indent=2) + "\n"
        write_state_file(store.directory / OPTIONS, text)
        if on_started is not None:
            on_started(store)
        return _run(store, cluster_path, cluster, image, None, factory)


def _run(
    store: RolloutStore,
    cluster_path: Path,
    cluster: Cluster,
    image: Path | None,
    policy: Policy | None,
    backend_factory: BackendFactory,
) -> RunResult:
    backend = backend_factory(cluster_path, cluster, image, store.directory)
    try:
        final = Executor(backend, store, policy=policy).run()
    except PolicyError as exc:
        raise UsageError(str(exc)) from None
    finally:
        _close(backend)
    return RunResult(final, store.directory, store.read_audit())


def _options(store: RolloutStore) -> RolloutOptions:
    """options.json; StateFileError naming it when it cannot be read or is not the shape
    `apply` writes (a cluster path, an image path and its sha256, or nulls)."""
    path = store.directory / OPTIONS
    data = read_json_file(path)
    if not isinstance(data, Mapping):
        raise StateFileError(f"{path}: not a JSON object")
    cluster, image, digest = data.get("cluster"), data.get("image"), data.get("image_sha256")
    if not isinstance(cluster, str) or not cluster:
        raise StateFileError(f"{path}: cluster is not a path")
    for key, value in (("image", image), ("image_sha256", digest)):
        if value is not None and not isinstance(value, str):
            raise StateFileError(f"{path}: {key} is not a string or null")
    if (image is None) != (digest is None):
        raise StateFileError(f"{path}: image and image_sha256 go together")
    return RolloutOptions(cluster, image, digest)


def resume(
    cluster: Cluster,
    cluster_path: Path,
    *,
    state: Path,
    flags: PolicyOverrides | None = None,
    backend_factory: BackendFactory | None = None,
    on_started: Callable[[RolloutStore], None] | None = None,
) -> RunResult:
    """Continue the current rollout under the state dir ``state`` where it stopped (killed,
    halted or aborted). Thresholds, timeouts and the validation level may change; the batching
    may not."""
    with cluster_lock(state):
        store = current_rollout(state)
        if store is None:
            raise UsageError(f"no rollout to resume in {state}")
        current = store.load()
        if current.status is Status.DONE:
            raise UsageError(f"rollout {current.rollout_id} is done; nothing to resume")
        opts = _options(store)
        image = Path(opts.image) if opts.image is not None else None
        if image is not None and (not image.is_file() or sha256_of(image) != opts.image_sha256):
            raise UsageError(f"{image}: missing or changed since the rollout started")
        flags = flags or PolicyOverrides()
        if flags.batching_given():
            raise UsageError("canary, batch size and max unavailable are fixed once planned")
        policy = policy_for(cluster, flags) if flags != PolicyOverrides() else None
        if policy is not None:
            # only the fields the flags name change; the rest stays as recorded
            recorded = current.policy
            policy = Policy(
                canary=recorded.canary,
                batch_size=recorded.batch_size,
                max_unavailable=recorded.max_unavailable,
                failure_threshold=flags.failure_threshold or recorded.failure_threshold,
                drain_timeout_s=flags.drain_timeout_s or recorded.drain_timeout_s,
                reboot_timeout_s=flags.reboot_timeout_s or recorded.reboot_timeout_s,
                validate_level=flags.validate_level or recorded.validate_level,
                poll_interval_s=recorded.poll_interval_s,
            )
        store.clear_abort()
        if on_started is not None:
            on_started(store)
        return _run(store, cluster_path, cluster, image, policy, backend_factory or cluster_backend)


def _audit_or_empty(store: RolloutStore) -> list[dict[str, Any]]:
    """The audit lines, or none when the log cannot be read (only a pid is looked up in it)."""
    try:
        return store.read_audit()
    except StateFileError:
        return []


@dataclass(frozen=True, slots=True)
class StatusResult:
    state: RolloutState
    directory: Path
    audit: list[dict[str, Any]]
    running_pid: int | None  # the process running it now, None when none holds the lock

    @property
    def interrupted(self) -> str | None:
        """``interrupted (pid N gone)`` when the state says running and no process holds the
        lock (the one that ran it was killed); None otherwise."""
        if self.state.status is Status.RUNNING and self.running_pid is None:
            return interrupted_note(self.audit)
        return None


def status(state: Path) -> StatusResult:
    """The current rollout under the state dir ``state``."""
    store = current_rollout(state)
    if store is None:
        raise UsageError(f"no rollout in {state}")
    return StatusResult(store.load(), store.directory, store.read_audit(), _holder(state))


def next_steps(state: RolloutState, cluster: str) -> list[str]:
    """What an operator runs to continue a stopped rollout, in order, so that the resume does
    not halt again at once: the failed nodes gpuctl holds drained are returned to service
    (once repaired) when they use up max_unavailable, and ``--failure-threshold`` is raised
    above the number of failed nodes when that number has reached it (a failed node counts for
    good, even once resumed in Slurm). Empty for a done rollout."""
    if state.status is Status.DONE:
        return []
    resume_cmd = f"gpuctl rollout resume {cluster}"
    if state.status is Status.RUNNING:  # interrupted: the resume reconciles and goes on
        return [resume_cmd]
    steps: list[str] = []
    failed = state.failed
    held = [n for n in failed if state.nodes[n].drained]
    budget = state.plan.max_unavailable
    if held and state.pending and len(held) >= budget:
        need = len(held) - budget + 1
        which = "it" if len(held) == 1 else ("one of them" if need == 1 else f"{need} of them")
        name = held[0] if len(held) == 1 else "NODE"
        steps.append(
            f"repair {', '.join(held)}, then return {which} to service in Slurm: scontrol "
            f"update nodename={name} state=resume (failed nodes left drained hold all "
            f"{budget} max_unavailable slot(s); gpuctl gives a slot back once its node is "
            "back in service)"
        )
    threshold = state.policy.failure_threshold
    if len(failed) >= threshold:  # halts again even with no node left to start
        resume_cmd += f" --failure-threshold {len(failed) + 1}"
        steps.append(
            f"{resume_cmd}  ({len(failed)} node(s) failed and failure_threshold is {threshold}; "
            "a failed node counts for good)"
        )
    else:
        steps.append(resume_cmd)
    return steps


def _holder(state: Path) -> int | None:
    try:
        with cluster_lock(state):
            return None
    except RolloutLocked as exc:
        return exc.pid


@dataclass(frozen=True, slots=True)
class AbortResult:
    rollout_id: str
    running_pid: int | None  # a running rollout stops after its nodes in flight
    state: RolloutState


def abort(state: Path, *, reason: str = "") -> AbortResult:
    """Ask the current rollout to stop: a running one starts no new node and ends ``aborted``
    once its nodes in flight are done; a stopped one is marked ``aborted`` now. Nodes gpuctl
    holds drained stay drained, with their record (resume continues them)."""
    store = current_rollout(state)
    if store is None:
        raise UsageError(f"no rollout in {state}")
    current = store.load()
    if current.status is Status.DONE:
        raise UsageError(f"rollout {current.rollout_id} is done; nothing to abort")
    store.request_abort(reason)
    try:
        with cluster_lock(state):
            current = store.load()
            if current.status is not Status.ABORTED:
                current.status = Status.ABORTED
                current.reason = reason or "aborted by the operator"
                store.record(current, AuditEvent("aborted", details={"reason": current.reason}))
            return AbortResult(current.rollout_id, None, current)
    except RolloutLocked as exc:
        return AbortResult(current.rollout_id, exc.pid, current)
