"""`gpuctl provision`: the playbooks, run through ansible-runner, with a run directory each."""

from gpuctl.provision.logs import RunLog, TaskResult, read_log
from gpuctl.provision.runner import ProgressEvent, ProvisionResult, provision, state_dir_for
from gpuctl.provision.runs import HostOutcome, RunRecord, find_run, read_record, run_dirs

__all__ = [
    "HostOutcome",
    "ProgressEvent",
    "ProvisionResult",
    "RunLog",
    "RunRecord",
    "TaskResult",
    "find_run",
    "provision",
    "read_log",
    "read_record",
    "run_dirs",
    "state_dir_for",
]
