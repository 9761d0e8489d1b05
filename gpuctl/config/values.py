"""Values are data, never code (docs/security.md).

Every string of cluster.yml ends up in a file another program reads: the Ansible inventory and
group_vars (which Ansible templates), slurm.conf and its siblings (one setting a line), systemd
units, shell command lines. So no string may hold a control character or a line separator (it
would start a line of its own), a bidirectional override (what a reviewer reads is not what the
program gets), or the start of a Jinja expression (Ansible would run it). Host names and login
names, which reach ssh and its ProxyCommand, have types of their own here.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

_UNSAFE_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_TEMPLATE_MARK = re.compile(r"\{\{|\{%|\{#")
MAX_VALUE_FINDINGS = 20


def value_problem(text: str) -> str | None:
    """Why ``text`` may not be a value of cluster.yml, or None when it may."""
    bad = _UNSAFE_CHAR.search(text)
    if bad is not None:
        return (
            f"control character U+{ord(bad[0]):04X} at position {bad.start()} is not allowed: "
            "values end up in rendered files (inventory, group_vars, slurm.conf, systemd units), "
            "where it could start a line of its own"
        )
    mark = _TEMPLATE_MARK.search(text)
    if mark is not None:
        return (
            f"{mark[0]!r} is not allowed: gpuctl hands every value to Ansible as data, never as "
            "a Jinja template (in a URL or a password, percent-encode it: %7B)"
        )
    return None


def unsafe_values(data: Any, loc: tuple[str | int, ...] = ()) -> list[tuple[Any, str]]:
    """Every string in raw cluster.yml data (keys included) that ``value_problem`` refuses, as
    (path, message); at most MAX_VALUE_FINDINGS, then one line counting the rest."""
    found: list[tuple[Any, str]] = []
    extra = 0
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, loc)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            why = value_problem(value)
            if why is not None:
                if len(found) < MAX_VALUE_FINDINGS:
                    found.append((where, why))
                else:
                    extra += 1
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                if isinstance(key, str) and (why := value_problem(key)) is not None:
                    found.append(((*where, key), f"key: {why}"))
                stack.append((item, (*where, key)))
        elif isinstance(value, list):
            stack.extend((item, (*where, i)) for i, item in reversed(list(enumerate(value))))
    if extra:
        found.append((loc, f"... and {extra} more values with the same kind of problem"))
    return found


_LABEL_RE = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL_RE}(\.{_LABEL_RE})*$")


def is_host(text: str) -> bool:
    """An IP address, or a DNS host name (RFC 1123 labels, not all digits)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return bool(_HOSTNAME.match(text)) and not text.replace(".", "").isdigit()
    return True


def _host(value: Any) -> Any:
    if isinstance(value, str) and not is_host(value):
        raise ValueError(f"{value[:80]!r} is neither an IP address nor a host name")
    return value


LoginName = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$",
        description="A login name: letters, digits, `_`, `.`, `-`, not starting with `-`.",
    ),
]
HostName = Annotated[str, BeforeValidator(_host)]


def _proxy_exception(value: Any) -> Any:
    if isinstance(value, str) and not is_host(value.removeprefix(".")):
        raise ValueError(
            f"{value[:80]!r} is neither an IP address, a host name nor a domain (.example.org)"
        )
    return value


# An entry of no_proxy: what apt, git, pip and Python's urllib all read the same way
NoProxyEntry = Annotated[str, BeforeValidator(_proxy_exception)]
