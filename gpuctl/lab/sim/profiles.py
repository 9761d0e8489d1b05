"""The hardware profiles (gpuctl/lab/profiles/<name>.yml) and their JSON form for lab nodes.

People read and edit the YAML; a node has only python3, so the lab writes :func:`profile_json`
into it as /etc/gpuctl-lab/hardware.json. PyYAML is imported only here, never by the stand-in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"

_REQUIRED = {
    "name": str,
    "model": str,
    "driver_version": str,
    "cuda_version": str,
    "gpus": dict,
    "topology": dict,
    "firmware": dict,
    "expected": dict,
}
_GPU_LISTS = ("bus_ids", "module_ids", "numa", "pcie_switch")


class ProfileError(ValueError):
    """An unknown profile name or a profile file that does not hold what the simulator needs."""


def names() -> list[str]:
    return sorted(path.stem for path in PROFILE_DIR.glob("*.yml"))


def load(name: str) -> dict[str, Any]:
    """The profile ``name`` as a dict, checked (raises ProfileError)."""
    import yaml  # only here: the node side never reads YAML

    path = PROFILE_DIR / f"{name}.yml"
    if not path.is_file():
        raise ProfileError(f"unknown hardware profile {name!r}; known: {', '.join(names())}")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return check(data, str(path))


def check(data: Any, where: str = "profile") -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: not a mapping")
    for key, kind in _REQUIRED.items():
        if not isinstance(data.get(key), kind):
            raise ProfileError(f"{where}: {key} missing or not a {kind.__name__}")
    gpus = data["gpus"]
    count = gpus.get("count")
    if not isinstance(count, int) or count < 1:
        raise ProfileError(f"{where}: gpus.count must be a positive whole number")
    for key in _GPU_LISTS:
        if not isinstance(gpus.get(key), list) or len(gpus[key]) != count:
            raise ProfileError(f"{where}: gpus.{key} must list {count} value(s)")
    nics = data.get("nics")
    if nics is not None and (not isinstance(nics, dict) or not nics.get("ports")):
        raise ProfileError(f"{where}: nics must be null or a mapping with ports")
    return data


def profile_json(name: str) -> str:
    """The profile as the JSON text the lab writes into a node (/etc/gpuctl-lab/hardware.json)."""
    return json.dumps(load(name), indent=2, sort_keys=True) + "\n"
