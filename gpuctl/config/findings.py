"""Where a problem sits in cluster.yml (a path of keys and indexes) and the error that carries
located findings from the rules to the loader, which turns each path into a line and column."""

from __future__ import annotations

from collections.abc import Sequence

from gpuctl.errors import ConfigError, Problem

Loc = tuple[str | int, ...]


def loc_to_str(loc: Sequence[str | int]) -> str:
    """``("node_groups", 1, "gpus")`` -> ``node_groups[1].gpus``."""
    out = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
            continue
        # a YAML key need not be a string (`~: x` has a null key, `true: x` a boolean one)
        name = part if isinstance(part, str) else _yaml_scalar(part)
        out += f".{name}" if out else name
    return out


def _yaml_scalar(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class RuleViolations(ConfigError):
    """Cross-field rules failed; ``locs`` keeps each problem's path as a tuple."""

    def __init__(self, findings: Sequence[tuple[Loc, str]]) -> None:
        self.findings: tuple[tuple[Loc, str], ...] = tuple(findings)
        super().__init__([Problem(message=m, path=loc_to_str(loc)) for loc, m in self.findings])
