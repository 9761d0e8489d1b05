"""Running ansible-playbook on this machine for the role tests: the virtualenv's ansible-playbook,
Ansible's home and temporary files under the test's directory, no colours."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


def ansible_playbook(
    tmp: Path, args: Sequence[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``ansible-playbook ARGS`` in ``tmp``; ``env`` adds ANSIBLE_* settings. Never raises on
    the playbook's exit status: the caller asserts on it."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), *args],
        cwd=tmp,
        env={
            **os.environ,
            "ANSIBLE_HOME": str(tmp / ".ansible"),
            "ANSIBLE_LOCAL_TEMP": str(tmp / ".t"),
            "ANSIBLE_NOCOLOR": "1",
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def run_local_play(
    tmp: Path, play: object, env: Mapping[str, str] | None = None, *, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """Write ``play`` (a list of plays) to ``tmp/play.yml`` and run it on localhost with the
    local connection and this interpreter (``check``: in check mode); never raises on the
    playbook's exit status."""
    import yaml

    (tmp / "play.yml").write_text(yaml.safe_dump(play))
    return ansible_playbook(
        tmp,
        [
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            *(["--check"] if check else []),
            str(tmp / "play.yml"),
        ],
        env,
    )
