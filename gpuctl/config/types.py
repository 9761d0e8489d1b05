"""The building blocks of the cluster.yml model: the strict base model and the named field types
(versions, names, node sets, URLs, paths, ports, shares) that several parts of the model use."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from gpuctl.config.nodesets import nodeset_value

NAME_RE = r"^[a-z][a-z0-9_-]{0,62}$"


class StrictModel(BaseModel):
    """Every model of cluster.yml: unknown keys refused, frozen, no inf/nan."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=False, allow_inf_nan=False
    )


def _no_numbers(value: Any) -> Any:
    """YAML reads ``12.10`` as the number 12.1: versions must be quoted strings."""
    if isinstance(value, bool | int | float):
        raise ValueError(
            f'write versions as quoted strings ("{value}"): YAML reads unquoted versions as '
            "numbers and drops digits (12.10 becomes 12.1)"
        )
    return value


Version = Annotated[
    str,
    BeforeValidator(_no_numbers),
    Field(pattern=r"^[0-9A-Za-z][0-9A-Za-z.+~_-]*$", max_length=64),
]
Name = Annotated[str, Field(pattern=NAME_RE)]
NodeSetStr = Annotated[
    str,
    BeforeValidator(nodeset_value),
    Field(
        description="Host names as a ClusterShell node set, e.g. `gpu[001-064]` or `a,b,c[1-3]`.",
        examples=["gpu[001-064]"],
    ),
]
# RFC 3986 has no unencoded quote, backslash, brace, angle bracket, pipe, caret or backtick: a
# URL without them cannot end the quoted string of apt.conf or a line of sources.list early
Url = Annotated[str, Field(pattern=r"^(https?|file)://[^\s\"\\<>{}|^`]+$")]
# an absolute directory: plain path components, none starting with a dot (no `.`, `..`)
AbsPath = Annotated[str, Field(pattern=r"^(/[A-Za-z0-9_+-][A-Za-z0-9._+-]*)+$", max_length=255)]
Port = Annotated[int, Field(ge=1, le=65535)]


def _above_zero_percent(value: str) -> str:
    if float(value.rstrip("%")) <= 0:
        raise ValueError(f"{value} judges nothing: give a share above 0%")
    return value


Percent = Annotated[
    str,
    Field(
        pattern=r"^(100|[1-9]?[0-9])(\.[0-9]+)?%$",
        description="A share of the physical limit, above 0%.",
    ),
    AfterValidator(_above_zero_percent),
]
