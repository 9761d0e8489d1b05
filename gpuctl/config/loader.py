"""Load cluster.yml: YAML with positions, then the model; each problem located by line/column."""

from __future__ import annotations

import codecs
import difflib
import reprlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from gpuctl.config.findings import Loc, RuleViolations, loc_to_str
from gpuctl.config.model import Cluster
from gpuctl.errors import ConfigError, Problem
from gpuctl.fileio import TooLarge, UnsafePath, read_regular

try:  # the C loader is several times faster on big files; same behaviour
    from yaml import CSafeLoader as _BaseLoader
except ImportError:  # pragma: no cover
    from yaml import SafeLoader as _BaseLoader  # type: ignore[assignment]

MAX_BYTES = 16 * 1024 * 1024
# Problems reported for one file; the rest are counted on one more line
MAX_PROBLEMS = 100
# Values reached again through aliases (*name): bounds "billion laughs" documents, whose aliases
# expand to exponentially many values for the position walk and for validation.
MAX_ALIAS_VALUES = 100_000

_repr = reprlib.Repr()  # bounded repr of input values: never walks or prints a huge structure
_repr.maxstring = _repr.maxother = 60


@dataclass
class _Positions:
    """Where each value (and each mapping key) of the document starts."""

    values: dict[Loc, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Loc, tuple[int, int]] = field(default_factory=dict)
    nodes: dict[Loc, yaml.Node] = field(default_factory=dict)
    seen: set[int] = field(default_factory=set)
    repeated: int = 0


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _walk(
    node: yaml.Node,
    loc: Loc,
    pos: _Positions,
    problems: list[tuple[Loc, str, tuple[int, int]]],
    depth: int = 0,
) -> None:
    if pos.repeated >= MAX_ALIAS_VALUES:
        return
    if id(node) in pos.seen:
        pos.repeated += 1
        if pos.repeated == MAX_ALIAS_VALUES:
            problems.append(
                (
                    loc,
                    f"aliases expand to more than {MAX_ALIAS_VALUES} values; "
                    "a cluster.yml needs nothing like that",
                    _mark(node),
                )
            )
            return
    pos.seen.add(id(node))
    pos.values[loc] = _mark(node)
    pos.nodes[loc] = node
    if depth > 64:
        return
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, tuple[int, int]] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = key_node.value
            if key == "<<":
                continue
            if key in seen:
                line, _ = seen[key]
                problems.append(
                    ((*loc, key), f"duplicate key {key!r} (first at line {line})", _mark(key_node))
                )
            seen[key] = _mark(key_node)
            pos.keys[(*loc, key)] = _mark(key_node)
            _walk(value_node, (*loc, key), pos, problems, depth + 1)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*loc, i), pos, problems, depth + 1)


def _parse(text: str, source: str) -> tuple[Any, _Positions]:
    """YAML text -> (data, positions). Raises ConfigError for syntax errors and duplicate keys."""
    loader = _BaseLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ConfigError(
                [
                    Problem(
                        "the file is empty; expected a mapping (name:, node_groups:, ...)",
                        file=source,
                        line=1,
                        column=1,
                    )
                ]
            )
        pos = _Positions()
        dupes: list[tuple[Loc, str, tuple[int, int]]] = []
        _walk(node, (), pos, dupes)
        if dupes:
            raise ConfigError(
                [
                    Problem(msg, path=loc_to_str(loc), file=source, line=line, column=col)
                    for loc, msg, (line, col) in dupes
                ]
            )
        try:
            data = loader.construct_document(node)
        except (ValueError, TypeError, LookupError, AttributeError, ArithmeticError) as exc:
            # PyYAML's scalar constructors raise these for values that match a tag's pattern but
            # are no valid value (2001-13-45, a 5000-digit integer, `!!int abc`)
            raise ConfigError([_unreadable(loader, pos, source, exc)]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
        raise ConfigError(
            [
                Problem(
                    f"YAML syntax error: {what}",
                    file=source,
                    line=mark.line + 1 if mark else None,
                    column=mark.column + 1 if mark else None,
                )
            ]
        ) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow, anywhere
        if not isinstance(exc.character, int):
            raise ConfigError([Problem(f"YAML error: {exc.reason}", file=source)]) from None
        # the first occurrence is the culprit (libyaml's position counts bytes, not characters)
        at = text.find(chr(exc.character))
        raise ConfigError(
            [
                Problem(
                    f"YAML error: unacceptable character #x{exc.character:04x}: {exc.reason}",
                    file=source,
                    line=text.count("\n", 0, at) + 1 if at >= 0 else None,
                    column=at - text.rfind("\n", 0, at) if at >= 0 else None,
                )
            ]
        ) from None
    except yaml.YAMLError as exc:
        message = " ".join(str(exc).split())  # one line per problem
        raise ConfigError([Problem(f"YAML error: {message}", file=source)]) from None
    except RecursionError:
        raise ConfigError([Problem("the document is nested too deeply", file=source)]) from None
    finally:
        loader.dispose()
    return data, pos


def _unreadable(loader: Any, pos: _Positions, source: str, exc: Exception) -> Problem:
    """Locate the first scalar that YAML cannot construct."""
    detail = f": {exc}" if isinstance(exc, ValueError) else ""
    loader.constructed_objects, loader.recursive_objects = {}, {}
    for loc, node in pos.nodes.items():
        scalars: list[tuple[Loc, yaml.Node]] = [(loc, node)]
        if isinstance(node, yaml.MappingNode):  # keys are scalars too: `!!int x: 1`
            scalars = [((*loc, str(k.value)), k) for k, _ in node.value]
        for where, scalar in scalars:
            if not isinstance(scalar, yaml.ScalarNode):
                continue
            try:
                loader.construct_object(scalar)
            except Exception:  # any failure locates the value
                kind = str(scalar.tag).rsplit(":", 1)[-1]
                return Problem(
                    f"cannot read {_repr.repr(scalar.value)} as a YAML {kind}{detail}",
                    path=loc_to_str(where),
                    file=source,
                    line=_mark(scalar)[0],
                    column=_mark(scalar)[1],
                )
    return Problem(f"YAML error: cannot read a value{detail}", file=source)


def load_cluster(path: Path | str) -> Cluster:
    """Read and validate a cluster.yml; raise :class:`ConfigError` listing every problem."""
    path = Path(path)
    source = str(path)
    try:
        raw = read_bounded(path)
    except FileNotFoundError:
        raise ConfigError([Problem("no such file", file=source)]) from None
    except IsADirectoryError:
        raise ConfigError([Problem("is a directory, not a cluster.yml", file=source)]) from None
    except OSError as exc:
        raise ConfigError([Problem(f"cannot read: {exc.strerror}", file=source)]) from None
    return _resolve_paths(load_cluster_bytes(raw, source), path.resolve().parent)


def read_bounded(path: Path, limit: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; a device, a FIFO or a larger
    file is refused before it is read (``gpuctl check /dev/zero`` never reads forever)."""
    try:
        return read_regular(path, limit=limit)
    except UnsafePath:
        raise ConfigError(
            [Problem("not a regular file (a device, a pipe or a socket)", file=str(path))]
        ) from None
    except TooLarge:
        raise ConfigError([_too_large(str(path), limit)]) from None


def _too_large(source: str, limit: int) -> Problem:
    return Problem(f"file is larger than {limit // (1024 * 1024)} MiB", file=source)


def _resolve_paths(cluster: Cluster, base: Path) -> Cluster:
    """The one place that resolves file paths: a relative path-valued field (ssh.private_key,
    ssh.known_hosts, bmc.ca_bundle, bmc.credentials.vault_file and vault_password_file) is
    relative to the folder of cluster.yml, wherever gpuctl or Ansible runs from; every user of
    the loaded Cluster takes the value as it is. ``~`` is left for whoever opens the file (ssh,
    Ansible, ``os.path.expanduser``)."""
    ssh = _under(base, cluster.ssh, ("private_key", "known_hosts"))
    credentials = _under(base, cluster.bmc.credentials, ("vault_file", "vault_password_file"))
    bmc = _under(base, cluster.bmc, ("ca_bundle",))
    if credentials is not cluster.bmc.credentials:
        bmc = bmc.model_copy(update={"credentials": credentials})
    update: dict[str, Any] = {}
    if ssh is not cluster.ssh:
        update["ssh"] = ssh
    if bmc is not cluster.bmc:
        update["bmc"] = bmc
    return cluster.model_copy(update=update) if update else cluster


_M = TypeVar("_M", bound=BaseModel)


def _under(base: Path, model: _M, names: tuple[str, ...]) -> _M:
    """``model`` with its relative path fields ``names`` made relative to ``base``."""
    update: dict[str, str] = {}
    for name in names:
        value = getattr(model, name)
        if value and not value.startswith(("/", "~")):
            update[name] = str(base / value)
    return model.model_copy(update=update) if update else model


def load_cluster_bytes(raw: bytes, source: str = "<input>") -> Cluster:
    if len(raw) > MAX_BYTES:
        raise ConfigError([_too_large(source, MAX_BYTES)])
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad = exc.start + (len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0)
        start = raw.rfind(b"\n", 0, bad) + 1  # the bad byte's line and column (in characters)
        line, col = raw.count(b"\n", 0, bad) + 1, len(raw[start:bad].decode("utf-8-sig")) + 1
        raise ConfigError(
            [Problem(f"not UTF-8 text (byte {bad})", file=source, line=line, column=col)]
        ) from None
    return load_cluster_text(text, source)


def load_cluster_text(text: str, source: str = "<input>") -> Cluster:
    data, pos = _parse(text, source)
    return validate_data(data, pos, source)


def validate_data(data: Any, pos: _Positions | None, source: str) -> Cluster:
    pos = pos or _Positions()
    if not isinstance(data, dict):
        kind = _kind(data)
        line, col = pos.values.get((), (1, 1))
        raise ConfigError(
            [
                Problem(
                    f"expected a mapping at the top level (name:, node_groups:, ...), found {kind}",
                    file=source,
                    line=line,
                    column=col,
                )
            ]
        )
    try:
        return Cluster.model_validate(data)
    except RuleViolations as exc:
        problems = [_locate(loc, msg, pos, source) for loc, msg in exc.findings]
        problems.sort(key=lambda p: (p.line or 0, p.column or 0))
        raise ConfigError(_bounded(problems, source)) from None
    except ValidationError as exc:
        found = _from_pydantic(exc.errors(include_url=False), pos, source)
        raise ConfigError(_bounded(found, source)) from None


def _bounded(problems: list[Problem], source: str) -> list[Problem]:
    """At most MAX_PROBLEMS problems, then one line that counts the others."""
    if len(problems) <= MAX_PROBLEMS:
        return problems
    rest = len(problems) - MAX_PROBLEMS
    return [*problems[:MAX_PROBLEMS], Problem(f"... and {rest} more problems", file=source)]


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return f"the boolean {value}"
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    return f"{type(value).__name__} {_short(value)}"[:60]


def _short(value: Any) -> str:
    """A bounded repr: a huge input value is neither walked nor printed in full."""
    if isinstance(value, int) and value.bit_length() > 64:
        return "<a very large integer>"
    return _repr.repr(value)


def _resolve(loc: Sequence[Any], pos: _Positions, *, missing: bool) -> Loc:
    """Keep the loc parts that exist in the document.

    pydantic adds parts of its own (union members such as ``str``, ``function-after[...]``);
    those are dropped. A missing key is kept as the last part so the path names it.
    """
    kept: Loc = ()
    parts = list(loc)
    for i, part in enumerate(parts):
        candidate = (*kept, part)
        if (
            candidate in pos.values
            or candidate in pos.keys
            or (missing and i == len(parts) - 1 and isinstance(part, str))
        ):
            kept = candidate
    return kept


def _position(loc: Loc, pos: _Positions, *, key: bool = False) -> tuple[int, int] | None:
    probe = loc
    if key and probe in pos.keys:
        return pos.keys[probe]
    while probe:
        if probe in pos.values:
            return pos.values[probe]
        probe = probe[:-1]
    return pos.values.get(())


def _locate(loc: Loc, msg: str, pos: _Positions, source: str, *, key: bool = False) -> Problem:
    at = _position(loc, pos, key=key)
    return Problem(
        msg,
        path=loc_to_str(loc),
        file=source,
        line=at[0] if at else None,
        column=at[1] if at else None,
    )


def _from_pydantic(errors: list[ErrorDetails], pos: _Positions, source: str) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for err in errors:
        loc = _resolve(err["loc"], pos, missing=err["type"] == "missing")
        msg, on_key = _message(err, loc)
        key = (loc_to_str(loc), msg)
        if key in seen:
            continue
        seen.add(key)
        problems.append(_locate(loc, msg, pos, source, key=on_key))
    problems.sort(key=lambda p: (p.line or 0, p.column or 0))
    return problems


def _message(err: ErrorDetails, loc: Loc) -> tuple[str, bool]:
    kind = err["type"]
    given = err.get("input")
    if kind == "extra_forbidden":
        name = str(loc[-1]) if loc else "?"
        hint = _suggest(name, _allowed_keys(loc[:-1]))
        return f"unknown key {name!r}{hint}", True
    if kind == "missing":
        return "required key is missing", False
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"expected a mapping, found {_kind(given)}", False
    if kind == "list_type":
        return f"expected a list, found {_kind(given)}", False
    if kind in ("enum", "literal_error"):
        expected = err.get("ctx", {}).get("expected", "")
        return f"{_short(given)} is not allowed; expected {expected}", False
    if kind == "string_pattern_mismatch":
        return f"{_short(given)} does not match {err.get('ctx', {}).get('pattern', '')}", False
    if kind == "value_error":
        text = err["msg"].removeprefix("Value error, ")
        return text, False
    text = err["msg"]
    if given is not None and not isinstance(given, dict | list):
        text += f" (found {_kind(given)})"
    return text, False


def _allowed_keys(parent: Loc) -> list[str]:
    """Field names of the model at ``parent`` (for 'did you mean')."""
    model: type[BaseModel] | None = Cluster
    for part in parent:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        if info is None:
            return []
        model = _model_of(info.annotation)
    return list(model.model_fields) if model is not None else []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _suggest(name: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    if allowed:
        return f"; allowed here: {', '.join(allowed)}"
    return ""
