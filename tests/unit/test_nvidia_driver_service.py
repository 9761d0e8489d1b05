"""The nvidia_driver role's service tasks run for real (ansible-playbook, local connection) with
stand-ins for nvidia-smi and modprobe: which version it takes as loaded, and when it loads the
module. nvidia-smi's exit status decides: the message it prints when it cannot reach the driver
is no version and must not stop the module from being loaded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT
from playbook_run import ansible_playbook

SERVICE = ROOT / "playbooks" / "roles" / "nvidia_driver" / "tasks" / "service.yml"
INSTALLED = "570.195.03"
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    path.chmod(0o755)
    return str(path)


def _run(tmp: Path, smi_body: str, modprobe_rc: int) -> tuple[dict[str, object], bool]:
    """Run service.yml; (the facts it set, whether modprobe was called)."""
    marker = tmp / "modprobed"
    smi = _script(tmp / "nvidia-smi", smi_body.replace("MARKER", str(marker)))
    modprobe = _script(tmp / "modprobe", f'touch "{marker}"\nexit {modprobe_rc}\n')
    out = tmp / "facts.json"
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {
                "ansible_python_interpreter": sys.executable,
                "nvidia_driver_version": INSTALLED,
                "nvidia_driver_reboot": False,
                "nvidia_driver_reboot_timeout": 600,
                "nvidia_driver_persistenced": False,
                "__nvidia_driver_in_container": True,
                "__nvidia_driver_sys_version": str(tmp / "no-such-module-version"),
                "__nvidia_driver_smi_argv": [smi, "--query-gpu=driver_version"],
                "__nvidia_driver_modprobe_argv": [modprobe, "nvidia"],
            },
            "tasks": [
                {"ansible.builtin.include_tasks": str(SERVICE)},
                {
                    "ansible.builtin.copy": {
                        "dest": str(out),
                        "content": "{{ {'loaded': __nvidia_driver_loaded} | to_json }}",
                        "mode": "0600",
                    }
                },
            ],
        }
    ]
    (tmp / "play.yml").write_text(yaml.safe_dump(play), encoding="utf-8")
    quiet = {"ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"}
    res = ansible_playbook(tmp, [str(tmp / "play.yml")], quiet)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    facts = json.loads(out.read_text(encoding="utf-8"))
    assert isinstance(facts, dict)
    return facts, marker.exists()


def test_no_driver_reachable_loads_the_module_and_reads_the_version_again(tmp_path: Path) -> None:
    # before modprobe nvidia-smi prints why it failed (exit 9); after it, the version
    smi = f'if [ -e "MARKER" ]; then echo {INSTALLED}; exit 0; fi\necho "{NO_DRIVER}"\nexit 9\n'
    facts, modprobed = _run(tmp_path, smi, 0)
    assert modprobed
    assert facts["loaded"] == INSTALLED


@pytest.mark.parametrize(
    ("message", "rc"), [(NO_DRIVER, 9), (MISMATCH, 18)], ids=["no-driver", "mismatch"]
)
def test_an_error_message_is_never_taken_for_the_loaded_version(
    tmp_path: Path, message: str, rc: int
) -> None:
    facts, modprobed = _run(tmp_path, f'echo "{message}"\nexit {rc}\n', 1)
    assert modprobed  # it tried
    assert facts["loaded"] == ""


def test_a_driver_that_answers_is_taken_as_loaded_and_not_reloaded(tmp_path: Path) -> None:
    facts, modprobed = _run(tmp_path, "echo 570.172.08\nexit 0\n", 0)
    assert not modprobed
    assert facts["loaded"] == "570.172.08"
