"""The machinery of test_no_dead_settings: every leaf field of cluster.yml, the places it sits in
a document, other valid values for it, and what a rendered difference is worth.

A difference counts when something consumes it: a Slurm or Ansible file (read whole by Slurm or
Ansible), an inventory host or a group a playbook targets, an ``ansible_*`` connection variable,
or a group/host variable whose name a role reads (outside its defaults and argument specs) or
gpuctl's acceptance suite reads from the rendered inventory. A variable nobody reads is no
evidence: a field that changes only such a variable changes nothing.
"""

from __future__ import annotations

import copy
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

import annotated_types
import yaml
from helpers import ROOT

try:
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gpuctl.config.model import Cluster

PLAYBOOKS = ROOT / "playbooks"
ROLES = PLAYBOOKS / "roles"
# gpuctl's own readers of the rendered inventory (the acceptance suite on the nodes' facts)
INVENTORY_READERS = (ROOT / "gpuctl" / "acceptance",)
# the nodes' copy of cluster.yml for `gpuctl node-check`: a copy, not a consumer (what
# node-check makes of it is proven through the judges, like `gpuctl validate`)
NODE_COPY = "gpuctl/cluster.yml"

Loc = tuple[str | int, ...]
LIST = "[]"


# ---------------------------------------------------------------------------------------------
# The model's leaves


@dataclass(frozen=True, slots=True)
class Leaf:
    path: tuple[str, ...]  # field names, LIST for "every element of this list"
    annotation: Any
    info: FieldInfo

    @property
    def name(self) -> str:
        return dotted(self.path)


def dotted(path: tuple[str, ...]) -> str:
    out = ""
    for part in path:
        out += part if part == LIST else (f".{part}" if out else part)
    return out


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _alternatives(annotation: Any) -> list[Any]:
    """The members of a union (Optional included), each unwrapped."""
    ann = _unwrap(annotation)
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        return [_unwrap(a) for a in typing.get_args(ann)]
    return [ann]


def _model(annotation: Any) -> type[BaseModel] | None:
    for alt in _alternatives(annotation):
        if isinstance(alt, type) and issubclass(alt, BaseModel):
            return alt
    return None


def leaves(model: type[BaseModel] = Cluster, prefix: tuple[str, ...] = ()) -> list[Leaf]:
    """Every leaf field: nested models, optional models and lists of models are walked into."""
    out: list[Leaf] = []
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        ann = _unwrap(info.annotation)
        sub = _model(ann)
        if sub is not None:
            out.extend(leaves(sub, path))
            continue
        if typing.get_origin(ann) is list:
            inner = _model(typing.get_args(ann)[0])
            if inner is not None:
                out.extend(leaves(inner, (*path, LIST)))
                continue
        out.append(Leaf(path, info.annotation, info))
    return out


def locations(cluster: Cluster, path: tuple[str, ...]) -> list[tuple[Loc, Any]]:
    """Each concrete place of ``path`` in a loaded cluster, with its effective value; none
    where an optional parent model is null there."""
    found: list[tuple[Loc, Any]] = []

    def walk(obj: Any, rest: tuple[str, ...], loc: Loc) -> None:
        if not rest:
            found.append((loc, obj))
            return
        head, tail = rest[0], rest[1:]
        if obj is None:
            return
        if head == LIST:
            for i, item in enumerate(obj):
                walk(item, tail, (*loc, i))
            return
        walk(getattr(obj, head), tail, (*loc, head))

    walk(cluster, path, ())
    return found


def put(doc: dict[str, Any], loc: Loc, value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with ``value`` at ``loc`` (missing mappings on the way are created)."""
    out = copy.deepcopy(doc)
    target: Any = out
    for part in loc[:-1]:
        if isinstance(part, int):
            target = target[part]
        else:
            if target.get(part) is None:
                target[part] = {}
            target = target[part]
    target[loc[-1]] = value
    return out


# ---------------------------------------------------------------------------------------------
# Other valid values for a leaf


def _bounds(info: FieldInfo, annotation: Any) -> tuple[float | None, float | None]:
    lo: float | None = None
    hi: float | None = None
    metas = list(info.metadata)
    for alt in _alternatives(annotation):
        metas.extend(getattr(alt, "__metadata__", ()))
    ann = info.annotation
    if typing.get_origin(ann) is typing.Annotated:
        metas.extend(typing.get_args(ann)[1:])
    for meta in metas:
        if isinstance(meta, annotated_types.Ge):
            lo = float(meta.ge)  # type: ignore[arg-type]
        elif isinstance(meta, annotated_types.Gt):
            lo = float(meta.gt) + 1e-9  # type: ignore[arg-type]
        elif isinstance(meta, annotated_types.Le):
            hi = float(meta.le)  # type: ignore[arg-type]
        elif isinstance(meta, annotated_types.Lt):
            hi = float(meta.lt) - 1e-9  # type: ignore[arg-type]
        elif isinstance(meta, FieldInfo):
            sub_lo, sub_hi = _bounds(meta, None)
            lo = sub_lo if sub_lo is not None else lo
            hi = sub_hi if sub_hi is not None else hi
    return lo, hi


def choices(annotation: Any) -> list[Any] | None:
    """The values an enum or Literal field allows (None for other types)."""
    out: list[Any] = []
    for alt in _alternatives(annotation):
        if isinstance(alt, type) and issubclass(alt, Enum):
            out.extend(m.value for m in alt)
        elif typing.get_origin(alt) is typing.Literal:
            out.extend(typing.get_args(alt))
        elif alt is not type(None):
            return None
    return out or None


def generic_candidates(leaf: Leaf, current: Any) -> list[Any]:
    """Other values of the field's type, in bounds; strings need the test's own table."""
    alts = _alternatives(leaf.annotation)
    optional = type(None) in alts
    out: list[Any] = []
    allowed = choices(leaf.annotation)
    if allowed is not None:
        out.extend(v for v in allowed if v != current)
    elif bool in alts:
        out.append(not current if current is not None else True)
    else:
        lo, hi = _bounds(leaf.info, leaf.annotation)
        if int in alts or float in alts:
            base = current if isinstance(current, int | float) else None
            nums: list[float] = (
                [base + 1, base - 1, base * 2, base / 2] if base is not None else [1, 2, 100, 0.5]
            )
            nums += [lo or 0, hi or 0]
            for n in nums:
                if (lo is None or n >= lo) and (hi is None or n <= hi):
                    value: Any = int(n) if int in alts and float not in alts else n
                    if value != current and value not in out:
                        out.append(value)
        for alt in alts:
            if typing.get_origin(alt) is list:
                inner = choices(typing.get_args(alt)[0])
                if inner is not None:
                    out.extend([[v] for v in inner if [v] != current])
                    out.append(list(inner))
    if optional and current is not None:
        out.append(None)
    return out


# ---------------------------------------------------------------------------------------------
# Who reads a rendered variable


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _words(paths: list[Path]) -> frozenset[str]:
    words: set[str] = set()
    for path in paths:
        words.update(_WORD.findall(path.read_text(encoding="utf-8", errors="replace")))
    return frozenset(words)


def _is_input_declaration(path: Path) -> bool:
    """A role's defaults/ and meta/ declare its inputs; they read nothing."""
    rel = path.relative_to(ROLES).parts if path.is_relative_to(ROLES) else ()
    return len(rel) > 1 and rel[1] in ("defaults", "meta")


def role_files(role: Path | None = None) -> list[Path]:
    """Files of the playbooks (or of one role) that can read a variable."""
    top = role or PLAYBOOKS
    return sorted(
        p
        for p in top.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not _is_input_declaration(p)
    )


@cache
def readers() -> frozenset[str]:
    """Every name the playbooks and roles use outside their input declarations, and every name
    gpuctl's acceptance suite looks up in the rendered inventory."""
    files = role_files()
    for top in INVENTORY_READERS:
        files.extend(sorted(top.rglob("*.py")))
    return _words(files)


@cache
def role_words(role: str) -> frozenset[str]:
    return _words(role_files(ROLES / role))


@cache
def targeted_groups() -> frozenset[str]:
    """Inventory groups that a play names in `hosts:`."""
    out: set[str] = set()
    for play in PLAYBOOKS.glob("*.yml"):
        text = play.read_text(encoding="utf-8")
        for pattern in re.findall(r"^\s*(?:- )?hosts:\s*['\"]?([^'\"\s#]+)", text, re.MULTILINE):
            out.update(g for g in re.split(r"[:,&!]+", pattern) if g)
    return frozenset(out)


def argument_spec_options() -> dict[str, set[str]]:
    """Role name -> the options of its meta/argument_specs.yml (every entry point)."""
    out: dict[str, set[str]] = {}
    for role in sorted(p for p in ROLES.iterdir() if p.is_dir()):
        spec = _load_yaml((role / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))
        opts: set[str] = set()
        for entry in (spec.get("argument_specs") or {}).values():
            opts.update((entry or {}).get("options") or {})
        out[role.name] = opts
    return out


# ---------------------------------------------------------------------------------------------
# What a rendered difference is worth


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


_HEADER = re.compile(r"^# Managed by gpuctl from cluster\.yml \(.*\)\..*$", re.MULTILINE)


def _inventory_parts(text: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any]]:
    inv = _load_yaml(text)["all"]
    hosts: dict[str, dict[str, Any]] = {}
    groups: dict[str, Any] = {}
    for group, body in (inv.get("children") or {}).items():
        members = (body or {}).get("hosts") or {}
        groups[group] = sorted(members)
        for host, hvars in members.items():
            hosts.setdefault(host, {}).update(hvars or {})
    return inv.get("vars") or {}, hosts, groups


def _variables(before: dict[str, Any], after: dict[str, Any]) -> Iterator[str]:
    for key in sorted(set(before) | set(after)):
        if before.get(key, KeyError) != after.get(key, KeyError):
            yield key


def _consumed(var: str) -> bool:
    return var.startswith("ansible_") or var in readers()


def consumed_difference(before: dict[str, str], after: dict[str, str]) -> str | None:
    """The first difference between two renders that something consumes, described; None when
    the renders differ only where nothing reads (or not at all)."""
    for rel in sorted(set(before) | set(after)):
        if rel == NODE_COPY:
            continue
        old, new = before.get(rel), after.get(rel)
        if old == new:
            continue
        if old is None or new is None:
            return f"{rel} is {'written' if old is None else 'no longer written'}"
        if rel == "inventory.yml":
            (va, ha, ga), (vb, hb, gb) = _inventory_parts(old), _inventory_parts(new)
            for var in _variables(va, vb):
                if _consumed(var):
                    return f"inventory.yml: all.vars.{var}"
            if set(ha) != set(hb):
                return "inventory.yml: the hosts"
            for host in sorted(ha):
                for var in _variables(ha[host], hb[host]):
                    if _consumed(var):
                        return f"inventory.yml: {host}.{var}"
            for group in sorted(set(ga) | set(gb)):
                if ga.get(group) != gb.get(group) and group in targeted_groups():
                    return f"inventory.yml: members of group {group}"
            continue
        if rel.startswith("group_vars/"):
            for var in _variables(_load_yaml(old) or {}, _load_yaml(new) or {}):
                if _consumed(var):
                    return f"{rel}: {var}"
            continue
        if _HEADER.sub("", old) != _HEADER.sub("", new):
            return rel
    return None


def unread_variables(files: dict[str, str]) -> set[str]:
    """Variables a render writes (group_vars, inventory) that nothing reads."""
    return {n for n in rendered_variables(files) if not _consumed(n)}


def rendered_variables(files: dict[str, str]) -> set[str]:
    """Variables a render writes: group_vars and the inventory's (all and per host)."""
    names: set[str] = set()
    for rel, text in files.items():
        if rel.startswith("group_vars/"):
            names.update(_load_yaml(text) or {})
        elif rel == "inventory.yml":
            all_vars, hosts, _ = _inventory_parts(text)
            names.update(all_vars)
            for hvars in hosts.values():
                names.update(hvars)
    return names
