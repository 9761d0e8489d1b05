"""SIMULATION: the BMC of one lab node: its Redfish resources, its firmware state, its update
tasks and its power actions."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpuctl.fileio import write_atomic
from gpuctl.lab.sim.bmc.packages import (
    GPU_COMPONENT,
    LabPackage,
    PackageError,
    read_package,
)
from gpuctl.lab.sim.bmc.power import PowerControl
from gpuctl.lab.sim.bmc.protocol import (
    APPLY_TIMES,
    BMC_INVENTORY_ID,
    GPU_INVENTORY_PREFIX,
    INVENTORY,
    MANAGER,
    MANAGER_ID,
    MANAGER_RESET,
    MANAGER_RESET_TYPES,
    MAX_UPLOAD,
    MULTIPART_PUSH,
    SERVICE_ROOT,
    SYSTEM,
    SYSTEM_ID,
    SYSTEM_RESET,
    SYSTEM_RESET_TYPES,
    TASK_MONITORS,
    TASK_SERVICE,
    TASKS,
    UPDATE_SERVICE,
    BadRequest,
    Part,
    collection,
    link,
    message_info,
)
from gpuctl.lab.sim.common import all_gpus, gpu_vbios

LOG = logging.getLogger("gpuctl.lab.sim.bmc")

_GPU_FIRMWARE_FILE = "var/lib/gpuctl-lab-sim/gpu-firmware.json"


def _seconds(name: str, default: float) -> float:
    try:
        return max(0.0, float(os.environ.get(name, "") or default))
    except ValueError:
        return default


@dataclass(frozen=True, slots=True)
class BmcSpec:
    node: str
    address: str
    root: Path  # the node's root (its disk: hardware.json, faults.json, gpu-firmware.json)


@dataclass(frozen=True, slots=True)
class Timing:
    """How long the simulation takes (seconds)."""

    task_s: float = 3.0  # a firmware update task (GPUCTL_LAB_BMC_TASK_S)
    reset_s: float = 5.0  # a BMC reset: its address refuses connections (GPUCTL_LAB_BMC_RESET_S)
    reset_delay_s: float = 2.0  # a finished BMC update until the BMC resets itself, so that a
    # client polling its task sees Completed first (GPUCTL_LAB_BMC_RESET_DELAY_S)
    power_off_timeout_s: float = 90.0  # longest wait for a node to power off

    @classmethod
    def from_env(cls) -> Timing:
        return cls(
            task_s=_seconds("GPUCTL_LAB_BMC_TASK_S", 3.0),
            reset_s=_seconds("GPUCTL_LAB_BMC_RESET_S", 5.0),
            reset_delay_s=_seconds("GPUCTL_LAB_BMC_RESET_DELAY_S", 2.0),
        )


@dataclass
class Task:
    id: str
    component: str
    filename: str
    version: str
    targets: tuple[str, ...]
    started: float  # time.monotonic()
    start_time: str
    duration: float
    failure: tuple[str, str] | None  # (MessageId, Message) known at upload
    state: str = "Running"
    status: str = "OK"
    end_time: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)


def _iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class Listener(Protocol):
    def stop(self) -> None: ...
    def start(self) -> None: ...


class LabBmc:
    """SIMULATION: the BMC of one lab node: its Redfish resources, its firmware state, its
    update tasks and its power actions."""

    def __init__(
        self,
        spec: BmcSpec,
        power: PowerControl,
        state_directory: Path,
        timing: Timing,
    ) -> None:
        self.spec = spec
        self.power = power
        self.state_file = state_directory / f"{spec.node}.json"
        self.timing = timing
        self.listener: Listener | None = None
        self._lock = threading.RLock()
        self._power_lock = threading.Lock()
        self._tasks: dict[str, Task] = {}
        self._next_task = 1
        self._uuid = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{spec.node}.bmc.gpuctl-lab"))

    # -- the node's disk and the BMC's state --------------------------------------------------

    def profile(self) -> dict[str, Any]:
        path = self.spec.root / "etc" / "gpuctl-lab" / "hardware.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise BadRequest(
                "Base.1.18.ServiceTemporarilyUnavailable",
                f"{self.spec.node}: the node's hardware description is not readable",
                503,
            ) from None
        if not isinstance(data, dict):
            raise BadRequest("Base.1.18.InternalError", "hardware description is not a mapping")
        return data

    def faults(self) -> dict[str, Any]:
        path = self.spec.root / "var" / "lib" / "gpuctl-lab-sim" / "faults.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def state(self) -> dict[str, Any]:
        with self._lock:
            try:
                data = json.loads(self.state_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = None
            if not isinstance(data, dict):
                firmware = self.profile().get("firmware") or {}
                data = {
                    "node": self.spec.node,
                    "bmc_firmware": {
                        "running": str(firmware.get("bmc") or "lab-bmc-1.0.0"),
                        "staged": None,
                    },
                    "gpu_firmware_staged": {},
                }
                self._save(data)
            return data

    def _save(self, data: dict[str, Any]) -> None:
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        write_atomic(self.state_file, text.encode(), mode=0o644, durable=True)

    def gpu_slots(self) -> list[tuple[int, int]]:
        """(SXM slot, GPU index in the profile), by slot: the slot is the GPU's module id when
        the module ids number the GPUs 1..n (HGX), else the index + 1."""
        gpus = self.profile()["gpus"]
        count = int(gpus["count"])
        modules = [int(m) for m in gpus.get("module_ids") or []]
        numbered = list(range(1, count + 1))
        slots = modules if sorted(modules) == numbered else numbered
        return sorted(zip(slots, range(count), strict=True))

    def running_gpu_firmware(self) -> dict[int, str]:
        """GPU index -> the VBIOS version it runs (what the node's nvidia-smi shows)."""
        profile, faults = self.profile(), self.faults()
        directory = str(self.spec.root / "var" / "lib" / "gpuctl-lab-sim")
        return {
            gpu.physical: gpu_vbios(profile, faults, gpu, state_dir=directory)
            for gpu in all_gpus(profile, self.spec.node)
        }

    def _inventory_ids(self) -> dict[str, int | None]:
        """FirmwareInventory Id -> GPU index (None: the BMC's own firmware)."""
        ids: dict[str, int | None] = {
            f"{GPU_INVENTORY_PREFIX}{slot}": index for slot, index in self.gpu_slots()
        }
        ids[BMC_INVENTORY_ID] = None
        return ids

    def activate_gpu_firmware(self) -> None:
        """The GPUs lost power: the staged GPU firmware runs from now on (gpu-firmware.json in
        the node's root, read by its nvidia-smi)."""
        with self._lock:
            state = self.state()
            staged: dict[str, str] = state.get("gpu_firmware_staged") or {}
            if not staged:
                return
            path = self.spec.root / _GPU_FIRMWARE_FILE
            try:
                running = json.loads(path.read_text(encoding="utf-8"))["gpus"]
                if not isinstance(running, dict):
                    running = {}
            except (OSError, ValueError, KeyError, TypeError):
                running = {}
            running.update(staged)
            text = json.dumps({"gpus": running}, indent=2, sort_keys=True) + "\n"
            write_atomic(path, text.encode(), mode=0o644, durable=True)
            state["gpu_firmware_staged"] = {}
            self._save(state)
            LOG.info("%s: GPU firmware activated: %s", self.spec.node, sorted(set(staged.values())))

    # -- resources ----------------------------------------------------------------------------

    def _power_state(self) -> str:
        return "On" if self.power.is_on() else "Off"

    def resource(self, path: str) -> dict[str, Any] | None:
        """The resource at ``path`` (normalised), None when there is none."""
        node = self.spec.node
        if path == SERVICE_ROOT:
            return {
                "@odata.type": "#ServiceRoot.v1_16_0.ServiceRoot",
                "@odata.id": SERVICE_ROOT,
                "Id": "RootService",
                "Name": "Root Service",
                "RedfishVersion": "1.17.0",
                "UUID": self._uuid,
                "Vendor": "gpuctl lab (SIMULATION)",
                "Product": "gpuctl lab simulated BMC",
                "Systems": link(f"{SERVICE_ROOT}/Systems"),
                "Managers": link(f"{SERVICE_ROOT}/Managers"),
                "UpdateService": link(UPDATE_SERVICE),
                "TaskService": link(TASK_SERVICE),
                "Links": {},
            }
        if path == f"{SERVICE_ROOT}/Systems":
            return collection(
                path, "ComputerSystemCollection", "Computer System Collection", [SYSTEM]
            )
        if path == SYSTEM:
            power = self._power_state()
            return {
                "@odata.type": "#ComputerSystem.v1_22_0.ComputerSystem",
                "@odata.id": SYSTEM,
                "Id": SYSTEM_ID,
                "Name": node,
                "HostName": node,
                "SystemType": "Physical",
                "Manufacturer": "gpuctl lab (SIMULATION)",
                "Model": str(self.profile().get("description", "")),
                "SerialNumber": f"LAB{hashlib.sha256(node.encode()).hexdigest()[:10].upper()}",
                "UUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpuctl-lab")),
                "PowerState": power,
                "Status": {
                    "State": "Enabled" if power == "On" else "StandbyOffline",
                    "Health": "OK",
                },
                "Actions": {
                    "#ComputerSystem.Reset": {
                        "target": SYSTEM_RESET,
                        "ResetType@Redfish.AllowableValues": list(SYSTEM_RESET_TYPES),
                    }
                },
                "Links": {"ManagedBy": [link(MANAGER)]},
            }
        if path == f"{SERVICE_ROOT}/Managers":
            return collection(path, "ManagerCollection", "Manager Collection", [MANAGER])
        if path == MANAGER:
            return {
                "@odata.type": "#Manager.v1_19_0.Manager",
                "@odata.id": MANAGER,
                "Id": MANAGER_ID,
                "Name": f"{node} BMC",
                "ManagerType": "BMC",
                "Model": "gpuctl lab BMC (SIMULATION)",
                "UUID": self._uuid,
                "FirmwareVersion": self.state()["bmc_firmware"]["running"],
                "PowerState": "On",
                "Status": {"State": "Enabled", "Health": "OK"},
                "Actions": {
                    "#Manager.Reset": {
                        "target": MANAGER_RESET,
                        "ResetType@Redfish.AllowableValues": list(MANAGER_RESET_TYPES),
                    }
                },
                "Links": {"ManagerForServers": [link(SYSTEM)]},
            }
        if path == UPDATE_SERVICE:
            return {
                "@odata.type": "#UpdateService.v1_14_0.UpdateService",
                "@odata.id": UPDATE_SERVICE,
                "Id": "UpdateService",
                "Name": "Update Service",
                "ServiceEnabled": True,
                "Status": {"State": "Enabled", "Health": "OK"},
                "FirmwareInventory": link(INVENTORY),
                "MultipartHttpPushUri": MULTIPART_PUSH,
                "MaxImageSizeBytes": MAX_UPLOAD,
                "MultipartHttpPushUri@Redfish.OperationApplyTimeSupport": {
                    "@odata.type": "#Settings.v1_4_0.OperationApplyTimeSupport",
                    "SupportedValues": list(APPLY_TIMES),
                },
            }
        if path == INVENTORY:
            members = [f"{INVENTORY}/{i}" for i in self._inventory_ids()]
            return collection(
                path, "SoftwareInventoryCollection", "Firmware Inventory Collection", members
            )
        if path.startswith(f"{INVENTORY}/"):
            return self._inventory_item(path.rsplit("/", 1)[-1])
        if path == TASK_SERVICE:
            return {
                "@odata.type": "#TaskService.v1_2_1.TaskService",
                "@odata.id": TASK_SERVICE,
                "Id": "TaskService",
                "Name": "Task Service",
                "ServiceEnabled": True,
                "Status": {"State": "Enabled", "Health": "OK"},
                "Tasks": link(TASKS),
            }
        if path == TASKS:
            with self._lock:
                members = [f"{TASKS}/{i}" for i in self._tasks]
            return collection(path, "TaskCollection", "Task Collection", members)
        return None

    def _inventory_item(self, ident: str) -> dict[str, Any] | None:
        ids = self._inventory_ids()
        if ident not in ids:
            return None
        index = ids[ident]
        if index is None:
            version = self.state()["bmc_firmware"]["running"]
            name = "BMC firmware"
        else:
            version = self.running_gpu_firmware()[index]
            name = f"GPU SXM {ident.removeprefix(GPU_INVENTORY_PREFIX)} firmware"
        return {
            "@odata.type": "#SoftwareInventory.v1_10_0.SoftwareInventory",
            "@odata.id": f"{INVENTORY}/{ident}",
            "Id": ident,
            "Name": name,
            "Version": version,
            "Updateable": True,
            "WriteProtected": False,
            "Manufacturer": "gpuctl lab (SIMULATION)",
            "Status": {"State": "Enabled", "Health": "OK"},
        }

    # -- tasks --------------------------------------------------------------------------------

    def task(self, ident: str) -> Task | None:
        with self._lock:
            return self._tasks.get(ident)

    def task_body(self, task: Task) -> dict[str, Any]:
        with self._lock:
            if task.state == "Running":
                elapsed = time.monotonic() - task.started
                full = task.duration / (0.5 if task.failure else 1.0)
                percent = min(99, int(100 * elapsed / full)) if full > 0 else 99
            else:
                percent = 100
            body: dict[str, Any] = {
                "@odata.type": "#Task.v1_7_3.Task",
                "@odata.id": f"{TASKS}/{task.id}",
                "Id": task.id,
                "Name": f"Update {task.component} from {task.filename}",
                "TaskState": task.state,
                "TaskStatus": task.status,
                "PercentComplete": percent,
                "StartTime": task.start_time,
                "TaskMonitor": f"{TASK_MONITORS}/{task.id}",
                "Messages": list(task.messages),
                "Payload": {"TargetUri": MULTIPART_PUSH, "HttpOperation": "POST"},
            }
            if task.end_time is not None:
                body["EndTime"] = task.end_time
            return body

    def start_update(self, parameters: dict[str, Any], part: Part) -> Task:
        """Check the package and the targets, and start the task (its end is decided now:
        a bad package or target fails it half way; the ``fw_update_fails`` fault at its end)."""
        targets = tuple(str(t) for t in parameters.get("Targets") or [])
        apply_time = str(parameters.get("@Redfish.OperationApplyTime") or "Immediate")
        filename = part.filename or "UpdateFile"
        failure: tuple[str, str] | None = None
        component, version = "unknown", ""
        try:
            package = read_package(part.data)
            component, version = package.component, package.version
            self._check_targets(package, targets)
        except PackageError as exc:
            failure = (
                "Update.1.0.VerificationFailed",
                f"Verification of image '{filename}' at '{self.spec.node} BMC' failed: {exc}",
            )
        with self._lock:
            ident = str(self._next_task)
            self._next_task += 1
            duration = self.timing.task_s * (0.5 if failure else 1.0)
            task = Task(
                id=ident,
                component=component,
                filename=filename,
                version=version,
                targets=targets,
                started=time.monotonic(),
                start_time=_iso(),
                duration=duration,
                failure=failure,
                messages=[
                    message_info(
                        "Update.1.0.UpdateInProgress",
                        "An update is in progress.",
                        "OK",
                    )
                ],
            )
            self._tasks[ident] = task
        LOG.info(
            "%s: task %s: update %s %s from %s (targets: %s, apply time %s)",
            self.spec.node,
            ident,
            component,
            version or "?",
            filename,
            ", ".join(t.rstrip("/").rsplit("/", 1)[-1] for t in targets) or "all",
            apply_time,
        )
        timer = threading.Timer(duration, self._finish, (task, apply_time))
        timer.daemon = True
        timer.start()
        return task

    def _check_targets(self, package: LabPackage, targets: tuple[str, ...]) -> None:
        ids = self._inventory_ids()
        for target in targets:
            ident = target.rstrip("/").removeprefix(f"{INVENTORY}/")
            if ident == target.rstrip("/") or ident not in ids:
                raise PackageError(f"Target {target} is not in this BMC's FirmwareInventory")
            is_gpu = ids[ident] is not None
            if is_gpu != (package.component == GPU_COMPONENT):
                raise PackageError(
                    f"Target {target} is not a {package.component} component (the package "
                    f"is {package.component} {package.version})"
                )
        if package.component == GPU_COMPONENT:
            model = str(self.profile().get("model", ""))
            if package.gpu_model != model:
                raise PackageError(
                    f"the package is for {package.gpu_model} GPUs, this node has {model}"
                )

    def _finish(self, task: Task, apply_time: str) -> None:
        try:
            self._finish_task(task, apply_time)
        except Exception as exc:  # a bug or an unreadable node: the task fails, not the server
            LOG.exception("%s: task %s failed inside the BMC", self.spec.node, task.id)
            with self._lock:
                task.state, task.status, task.end_time = "Exception", "Critical", _iso()
                task.messages.append(
                    message_info(
                        "Update.1.0.ApplyFailed",
                        f"Installation of image '{task.filename}' failed: {type(exc).__name__}",
                        "Critical",
                    )
                )

    def _finish_task(self, task: Task, apply_time: str) -> None:
        where = f"{self.spec.node} BMC"
        with self._lock:
            failure = task.failure
            if failure is None and self.faults().get("fw_update_fails"):
                failure = (
                    "Update.1.0.ApplyFailed",
                    f"Installation of image '{task.filename}' to '{where}' failed "
                    "(simulated fault fw_update_fails)",
                )
            if failure is not None:
                task.state, task.status = "Exception", "Critical"
                task.messages.append(message_info(*failure, "Critical"))
                task.end_time = _iso()
                LOG.info("%s: task %s: %s", self.spec.node, task.id, failure[0])
                return
            state = self.state()
            bounce = False
            if task.component == GPU_COMPONENT:
                ids = self._inventory_ids()
                chosen = [ids[t.rstrip("/").rsplit("/", 1)[-1]] for t in task.targets] or [
                    i for i in ids.values() if i is not None
                ]
                staged = state.setdefault("gpu_firmware_staged", {})
                for index in chosen:
                    staged[str(index)] = task.version
                task.messages.append(
                    message_info(
                        "Update.1.0.AwaitingActivation",
                        f"Awaiting for an action to proceed with activating image "
                        f"'{task.filename}' on '{where}': the GPUs run it after a power cycle "
                        "(PowerCycle, or ForceOff then On).",
                        "OK",
                    )
                )
            else:
                state["bmc_firmware"]["staged"] = task.version
                bounce = apply_time == "Immediate"
                if not bounce:
                    task.messages.append(
                        message_info(
                            "Update.1.0.AwaitingActivation",
                            f"Awaiting for an action to proceed with activating image "
                            f"'{task.filename}' on '{where}': Manager.Reset.",
                            "OK",
                        )
                    )
            self._save(state)
            task.messages.append(
                message_info(
                    "Update.1.0.UpdateSuccessful",
                    f"Device '{where}' successfully updated with image '{task.filename}'.",
                    "OK",
                )
            )
            task.state, task.status, task.end_time = "Completed", "OK", _iso()
        LOG.info("%s: task %s: completed", self.spec.node, task.id)
        if bounce:
            self.reset_self(delay=self.timing.reset_delay_s)

    # -- resets -------------------------------------------------------------------------------

    def reset_self(self, delay: float = 0.1) -> None:
        """The BMC resets: after ``delay`` its address refuses connections for
        ``timing.reset_s`` seconds; a staged BMC firmware runs when it answers again."""

        def bounce() -> None:
            time.sleep(delay)
            LOG.info("%s: BMC resets (%.1f s)", self.spec.node, self.timing.reset_s)
            listener = self.listener
            if listener is not None:
                listener.stop()
            try:
                with self._lock:
                    state = self.state()
                    staged = state["bmc_firmware"].get("staged")
                    if staged:
                        state["bmc_firmware"] = {"running": staged, "staged": None}
                        self._save(state)
                time.sleep(self.timing.reset_s)
            finally:
                if listener is not None:
                    listener.start()
            LOG.info("%s: BMC is back", self.spec.node)

        threading.Thread(target=bounce, name=f"bmc-reset-{self.spec.node}", daemon=True).start()

    def reset_system(self, reset_type: str) -> None:
        """Start ``reset_type`` (ComputerSystem.Reset) in the background; one power action at
        a time per node."""

        def act() -> None:
            with self._power_lock:
                try:
                    self._power_action(reset_type)
                except Exception:
                    LOG.exception("%s: %s failed", self.spec.node, reset_type)

        threading.Thread(target=act, name=f"bmc-power-{self.spec.node}", daemon=True).start()

    def _power_action(self, reset_type: str) -> None:
        power, node = self.power, self.spec.node
        LOG.info("%s: ComputerSystem.Reset %s (power %s)", node, reset_type, self._power_state())
        if reset_type == "On":
            power.power_on()
        elif reset_type in ("ForceOff", "GracefulShutdown", "PowerCycle"):
            if power.is_on():
                if reset_type == "GracefulShutdown":
                    power.graceful_off()
                else:
                    power.force_off()
                if not power.wait_off(self.timing.power_off_timeout_s):
                    LOG.warning("%s: did not power off; %s abandoned", node, reset_type)
                    return
            self.activate_gpu_firmware()  # the GPUs lost power
            if reset_type == "PowerCycle":
                power.power_on()
        elif reset_type in ("ForceRestart", "GracefulRestart"):
            if power.is_on():
                power.restart(graceful=reset_type == "GracefulRestart")
            else:
                power.power_on()
        LOG.info("%s: %s done (power %s)", node, reset_type, self._power_state())
