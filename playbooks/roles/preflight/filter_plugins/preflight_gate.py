"""The version gate of the preflight role: a version set checked against compatibility rules.

``preflight_versions | preflight_findings(rules, tables)`` returns one finding per broken rule:
``{"id", "severity", "message"}``. The rules are data (``vars/main.yml``); each names its two
sides (keys of the version set), a ``kind`` that says how they are compared, the constraint, a
message and the ``source`` that documents it. Versions are compared with Ansible's own
``version`` test (loose version ordering), so ``570.26 < 570.124.06 < 570.172.08``.

A rule whose sides are not set (null, missing, empty) does not apply; a ``requires`` rule with
``present: true`` is the exception: there the missing side is the finding.

The gate fails closed: a version a table has no row for (a CUDA minor, a DCGM major, a GPU
model), or one a rule cannot read (NCCL without its ``+cudaX.Y``), is an error that names the
table, unless its key of the version set is in ``unverified`` (cluster.yml
``software.unverified_versions``): then it is a warning and the run goes on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError  # type: ignore[import-untyped]
from ansible.plugins.test.core import version_compare  # type: ignore[import-untyped]

Finding = dict[str, str]
Rule = Mapping[str, Any]
Tables = Mapping[str, Mapping[str, str]]

SEVERITIES = ("error", "warning")


def _at_least(have: str, need: str) -> bool:
    return bool(version_compare(have, need, ">="))


def _set(value: Any) -> bool:
    return value is not None and value != "" and value != []


def _values(value: Any) -> list[str]:
    """A side's value as a list of strings (``gpu_models`` is a list, the others are scalars)."""
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return [str(value)]


def _key(value: str, how: str) -> str:
    """The row of a table a value selects: the whole value, ``major`` or ``major.minor``."""
    if how == "value":
        return value
    parts = value.split(".")
    if how == "major":
        return parts[0]
    if how == "major_minor":
        return ".".join(parts[:2])
    raise AnsibleFilterError(f"preflight rules: unknown key {how!r}")


def _message(rule: Rule, **fields: str) -> str:
    try:
        text = str(rule["message"]).format(**fields)
    except (KeyError, IndexError) as exc:
        raise AnsibleFilterError(f"preflight rule {rule['id']}: message needs {exc}") from exc
    return f"{text} (rule {rule['id']}, source: {rule['source']})"


def _equal(rule: Rule, versions: Mapping[str, Any], tables: Tables) -> list[str]:
    left, right = str(versions[rule["left"]]), str(versions[rule["right"]])
    if version_compare(left, right, "=="):
        return []
    return [_message(rule, left_version=left, right_version=right)]


def _branch(rule: Rule, versions: Mapping[str, Any], tables: Tables) -> list[str]:
    """The left version's first component is the right side (driver 570.172.08, branch 570)."""
    left, right = str(versions[rule["left"]]), str(versions[rule["right"]])
    if left.split(".", 1)[0] == right:
        return []
    return [_message(rule, left_version=left, right_version=right)]


class Unknown(str):
    """A finding about a version no rule covers: an error unless the user lists its key in
    ``software.unverified_versions`` (then a warning)."""

    key: str

    def __new__(cls, text: str, key: str) -> Unknown:
        self = super().__new__(cls, text)
        self.key = key
        return self


def _order(key: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in key.split(".")]


def _unknown(rule: Rule, key: str, value: str, table: str, known: Sequence[str]) -> Unknown:
    listed = ", ".join(sorted(known, key=_order))
    return Unknown(
        f"{key} {value} is not in the table {table} ({listed}): no rule says it works; add "
        f"its row from the source, pick a listed {key}, or list {key} in "
        f"software.unverified_versions to go on unchecked "
        f"(rule {rule['id']}, source: {rule['source']})",
        key,
    )


def _minimum_by_table(rule: Rule, versions: Mapping[str, Any], tables: Tables) -> list[str]:
    """The left version is at least the table's row for each value of the right side; a value
    without a row is an ``Unknown`` finding."""
    con = rule["constraint"]
    table = tables[con["table"]]
    left = str(versions[rule["left"]])
    out: list[str] = []
    for value in _values(versions[rule["right"]]):
        need = table.get(_key(value, con.get("key", "value")))
        if need is None:
            out.append(_unknown(rule, rule["right"], value, con["table"], list(table)))
            continue
        if not _at_least(left, str(need)):
            out.append(_message(rule, left_version=left, right_version=value, required=str(need)))
    return out


def _maximum_by_table(rule: Rule, versions: Mapping[str, Any], tables: Tables) -> list[str]:
    """A version taken from the left side is no newer than the newest table row whose minimum
    the right side meets (NCCL's +cudaX.Y against the CUDA versions the driver supports)."""
    con = rule["constraint"]
    table = tables[con["table"]]
    left = str(versions[rule["left"]])
    m = re.search(con["extract"], left)
    if m is None:
        return [
            Unknown(
                f"{rule['left']} {left} does not name the CUDA it is built for "
                f"(no match for {con['extract']!r}): no rule says it works with the driver; "
                f"pin a package version such as 2.26.2-1+cuda12.8, or list {rule['left']} in "
                f"software.unverified_versions to go on unchecked "
                f"(rule {rule['id']}, source: {rule['source']})",
                rule["left"],
            )
        ]
    built = m.group(1)
    right = str(versions[rule["right"]])
    supported = [k for k, need in table.items() if _at_least(right, str(need))]
    newest = max(supported, key=lambda k: [int(p) for p in k.split(".")], default=None)
    if newest is not None and version_compare(built, newest, "<="):
        return []
    return [
        _message(
            rule,
            left_version=left,
            left_extracted=built,
            right_version=right,
            required=newest or "none of the listed versions",
        )
    ]


def _requires(rule: Rule, versions: Mapping[str, Any], tables: Tables) -> list[str]:
    """When the left side takes one of ``when_any``, the right side is set (``present``) or one
    of ``allowed``."""
    con = rule["constraint"]
    hits = [v for v in _values(versions[rule["left"]]) if v in con["when_any"]]
    right = versions.get(rule["right"])
    out = []
    for value in hits:
        absent = bool(con.get("present")) and not _set(right)
        refused = "allowed" in con and _set(right) and str(right) not in con["allowed"]
        if absent or refused:
            out.append(_message(rule, left_version=value, right_version=str(right)))
    return out


def _one_of(rule: Rule, versions: Mapping[str, Any], tables: Tables) -> list[str]:
    """The row the left version selects (``key``: value, major, major_minor) is one of
    ``allowed``: what gpuctl's roles can install. Not a missing rule, so no override."""
    con = rule["constraint"]
    left = str(versions[rule["left"]])
    if _key(left, con.get("key", "value")) in [str(a) for a in con["allowed"]]:
        return []
    return [_message(rule, left_version=left)]


KINDS: dict[str, Callable[[Rule, Mapping[str, Any], Tables], list[str]]] = {
    "equal": _equal,
    "branch": _branch,
    "minimum_by_table": _minimum_by_table,
    "maximum_by_table": _maximum_by_table,
    "requires": _requires,
    "one_of": _one_of,
}
# the kinds that compare one side only: they need no ``right``
ONE_SIDED = ("requires", "one_of")


def _applies(rule: Rule, versions: Mapping[str, Any]) -> bool:
    needed = [rule["left"]] if rule["kind"] in ONE_SIDED else [rule["left"], rule["right"]]
    con = rule.get("constraint")
    if isinstance(con, Mapping):
        needed += con.get("if_set", [])
    return all(_set(versions.get(k)) for k in needed)


def preflight_findings(
    versions: Mapping[str, Any] | None,
    rules: Sequence[Rule],
    tables: Tables,
    unverified: Sequence[str] | None = None,
) -> list[Finding]:
    """Every rule the version set breaks, in rule order. A version no rule covers is an error
    unless its key is in ``unverified``: then a warning."""
    versions = versions or {}
    if not isinstance(versions, Mapping):
        raise AnsibleFilterError("preflight_versions must be a mapping")
    unverified = list(unverified or [])
    if not all(isinstance(k, str) for k in unverified):
        raise AnsibleFilterError("preflight_unverified_versions must be a list of keys")
    out: list[Finding] = []
    for rule in rules:
        required = {"id", "kind", "left", "message", "source"}
        if rule.get("kind") not in ONE_SIDED:
            required.add("right")
        missing = required - set(rule)
        if missing:
            raise AnsibleFilterError(f"preflight rule {rule!r} lacks {sorted(missing)}")
        kind = KINDS.get(rule["kind"])
        if kind is None:
            raise AnsibleFilterError(f"preflight rule {rule['id']}: unknown kind {rule['kind']!r}")
        severity = rule.get("severity", "error")
        if severity not in SEVERITIES:
            raise AnsibleFilterError(f"preflight rule {rule['id']}: severity {severity!r}")
        if not _applies(rule, versions):
            continue
        for message in kind(rule, versions, tables):
            level = severity
            if isinstance(message, Unknown) and message.key in unverified:
                level = "warning"
                message = Unknown(
                    f"unverified, as software.unverified_versions allows: {message}", message.key
                )
            out.append({"id": str(rule["id"]), "severity": level, "message": str(message)})
    return out


class FilterModule:
    """Ansible's entry point for the filters of this file."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"preflight_findings": preflight_findings}
