"""What went wrong in an inventory, said with where: :class:`Source` (the line and key a value came
from), :class:`IssueLog` (every issue of one file, each once) and :func:`report_validation`, which turns
pydantic's errors into issues naming file, line, node and field, with what the field expects and the
closest valid key for an unknown one. Values of secret fields are never echoed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, get_args

from pydantic import ValidationError

from orchestrator.errors import InventoryError, InventoryIssue
from orchestrator.inventory._yaml_values import describe, did_you_mean
from orchestrator.inventory.cluster import Cluster
from orchestrator.inventory.model import (
    Backend,
    ConnectionName,
    Node,
    OsName,
    Scheme,
    TrainSettings,
    Transport,
    WindowsMode,
    WindowsSettings,
    WinRMSettings,
)
from orchestrator.inventory.settings import (
    CodeSettings,
    EnvOverride,
    EnvSettings,
    FirewallSettings,
    Installer,
    TimeSettings,
)

__all__ = [
    "CLUSTER_EXPECTED",
    "CLUSTER_FIELDS",
    "NODE_EXPECTED",
    "NODE_USER_FIELDS",
    "IssueLog",
    "Source",
    "report_validation",
]


# Fields a user may write for a node ("line" is filled in by the loader).
NODE_USER_FIELDS: tuple[str, ...] = tuple(f for f in Node.model_fields if f != "line")
WINRM_FIELDS: tuple[str, ...] = tuple(WinRMSettings.model_fields)
WINDOWS_FIELDS: tuple[str, ...] = tuple(WindowsSettings.model_fields)
CLUSTER_FIELDS: tuple[str, ...] = tuple(Cluster.model_fields)
FIREWALL_FIELDS: tuple[str, ...] = tuple(FirewallSettings.model_fields)
TIME_FIELDS: tuple[str, ...] = tuple(TimeSettings.model_fields)
ENV_FIELDS: tuple[str, ...] = tuple(EnvSettings.model_fields)
ENV_OVERRIDE_FIELDS: tuple[str, ...] = tuple(EnvOverride.model_fields)
CODE_FIELDS: tuple[str, ...] = tuple(CodeSettings.model_fields)
TRAIN_FIELDS: tuple[str, ...] = tuple(TrainSettings.model_fields)


def _one_of(literal: Any) -> str:
    return "one of: " + ", ".join(str(a) for a in get_args(literal))


# What each field expects, for "expected ..., got ..." messages.
NODE_EXPECTED: dict[str, str] = {
    "name": "a node name of letters, digits, '.', '_' and '-' (not starting with '.' or '-')",
    "host": "a host name or IP address",
    "port": "an integer between 1 and 65535",
    "os": _one_of(OsName),
    "connection": _one_of(ConnectionName),
    "user": "a user name",
    "key_file": "a path to a private key file",
    "password_env": "the NAME of an environment variable holding the password (letters, digits, _)",
    "password_prompt": "true or false",
    "gpus": "an integer from 0 to 1024",
    "nproc": "an integer from 1 to 1024",
    "interface": "a network interface name",
    "python": "a path or command name of a Python interpreter",
    "workdir": "a directory path",
    "tags": "a list of tag names",
    "winrm": "a mapping with " + ", ".join(WINRM_FIELDS),
    "allow_insecure": "true or false",
    "winrm.transport": _one_of(Transport),
    "winrm.scheme": _one_of(Scheme),
    "winrm.cert_validation": "true or false",
    "winrm.ca_bundle": "a path to a CA bundle file",
    "windows": "a mapping with " + ", ".join(WINDOWS_FIELDS),
    "windows.mode": _one_of(WindowsMode) + " (wsl: training inside WSL2, needed beside Linux nodes)",
    "windows.distro": "a WSL distribution name as `wsl --list` shows it (letters, digits, '.', '_', '-')",
    "windows.wsl_user": "a Linux user name in that distribution",
}
CLUSTER_EXPECTED: dict[str, str] = {
    "name": "printable text on one line (no control characters), at most 200 characters",
    "master": "a node name",
    "port": "an integer between 1 and 65535",
    "backend": _one_of(Backend),
    "train": "a mapping with " + ", ".join(TrainSettings.model_fields),
    "train.script": "the training script's path (relative to the code directory on the nodes)",
    "train.args": "a list of arguments",
    "train.env": "a mapping of NAME: value, or NAME: {from_env: VARIABLE} for a secret",
    "train.code_dir": "a directory on the nodes",
    "train.elastic": "true or false",
    "train.min_nodes": "an integer >= 1",
    "train.max_restarts": "an integer >= 0",
    "train.templates": "a directory of your launch templates (relative to the inventory file)",
    "train.shares": "equal, measured, or a list of integers >= 1 (one per rank or one per node)",
    "firewall": "a mapping with " + ", ".join(FirewallSettings.model_fields),
    "firewall.manage": "true or false",
    "firewall.extra_ports": "a list of ports (6006) or LOW-HIGH ranges ('6000-6010')",
    "firewall.ephemeral_ports": "'auto' (each node's ip_local_port_range) or a LOW-HIGH range",
    "firewall.extra_sources": "a list of IPv4 addresses or networks (at most /8 wide)",
    "firewall.persist": "true or false",
    "time": "a mapping with " + ", ".join(TimeSettings.model_fields),
    "time.manage": "true or false",
    "time.servers": "a list of NTP server or pool names/addresses",
    "time.serve_from_master": "true or false",
    "time.max_offset_ms": "a number of milliseconds > 0",
    "time.install": "true or false",
    "env": "a mapping with " + ", ".join(EnvSettings.model_fields),
    "env.python": 'a Python version as a quoted string, e.g. "3.11"',
    "env.requirements": "a requirements/lock file path (relative to the inventory file)",
    "env.packages": "a list of requirement strings, e.g. ['torch==2.13.0']",
    "env.index_url": "a package index URL",
    "env.extra_index_urls": "a list of package index URLs",
    "env.find_links": "a list of directories or URLs holding wheels",
    "env.no_index": "true or false",
    "env.linux": "a mapping with " + ", ".join(EnvOverride.model_fields),
    "env.windows": "a mapping with " + ", ".join(EnvOverride.model_fields),
    "env.path": "a directory path on the nodes (default <workdir>/venv)",
    "env.offline": "true or false",
    "env.installer": _one_of(Installer),
    "env.compile_bytecode": "true or false",
    "code": "a mapping with " + ", ".join(CodeSettings.model_fields),
    "code.source": "a directory on this machine (default: the current directory)",
    "code.dest": "a directory on the nodes (default <workdir>/code)",
    "code.excludes": "a list of gitignore-style patterns",
    "code.gitignore": "true or false",
}
# cluster.env.linux / cluster.env.windows take the cluster-wide env fields of the same names
CLUSTER_EXPECTED.update(
    {
        f"env.{os_name}.{field}": CLUSTER_EXPECTED[f"env.{field}"]
        for os_name in ("linux", "windows")
        for field in ENV_OVERRIDE_FIELDS
        if f"env.{field}" in CLUSTER_EXPECTED
    }
)
# Values never echoed in messages (a user may put a password where a variable name belongs).
_SECRET_FIELDS = frozenset({"password_env"})


@dataclass
class Source:
    """Where a value came from: the line and the key as written; ``scope`` for shared values."""

    line: int | None
    key: str
    scope: str | None = None  # e.g. "defaults" or "vars of group 'gpu'": the value applies to many nodes


class IssueLog:
    """Collects issues for one file; identical issues (a shared value, many nodes) are kept once."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.issues: list[InventoryIssue] = []
        self._seen: set[tuple[int | None, str | None, str | None, str]] = set()

    def add(
        self, message: str, *, line: int | None = None, node: str | None = None, field: str | None = None
    ) -> None:
        key = (line, node, field, message)
        if key in self._seen:
            return
        self._seen.add(key)
        self.issues.append(InventoryIssue(message, file=self.source, line=line, node=node, field=field))

    def __bool__(self) -> bool:
        return bool(self.issues)

    def raise_if_any(self) -> None:
        if self.issues:
            ordered = sorted(self.issues, key=lambda i: (i.line is not None, i.line or 0))
            raise InventoryError(ordered)


def _error_field(loc: tuple[int | str, ...]) -> tuple[str, str]:
    """(top-level field, dotted path for winrm sub-fields) from a pydantic ``loc``."""
    top = str(loc[0]) if loc else ""
    if (
        top in ("winrm", "windows", "firewall", "time", "code", "train", "slurm")
        and len(loc) > 1
        and isinstance(loc[1], str)
    ):
        return top, f"{top}.{loc[1]}"
    if top == "env" and len(loc) > 1 and isinstance(loc[1], str):
        if loc[1] in ("linux", "windows") and len(loc) > 2 and isinstance(loc[2], str):
            return top, f"env.{loc[1]}.{loc[2]}"
        return top, f"env.{loc[1]}"
    return top, top


def report_validation(
    exc: ValidationError,
    *,
    values: dict[str, Any],
    sources: dict[str, Source],
    expected: dict[str, str],
    known_fields: Sequence[str],
    fallback_line: int | None,
    node: str | None,
    log: IssueLog,
) -> set[str]:
    """Turn pydantic errors into issues; returns the dotted paths that were wrong."""
    bad: set[str] = set()
    for err in exc.errors():
        loc = tuple(err["loc"])
        top, path = _error_field(loc)
        kind = err["type"]
        if top == "name" and "name" not in sources and "host" in values:
            continue  # the name was derived from the host, whose own problem is reported
        bad.add(path)
        src = sources.get(path) or sources.get(top)
        line = src.line if src else fallback_line
        shown_field = src.key if src else path
        if src is not None and path != top and src.key == top:
            shown_field = path  # a sub-field of a mapping whose own line is all we know
        issue_node = node
        suffix = ""
        if src is not None and src.scope:
            issue_node = None
            suffix = f" (set in {src.scope})"
        if kind == "extra_forbidden":
            name = str(loc[-1])
            options = (
                WINRM_FIELDS
                if path.startswith("winrm.")
                else WINDOWS_FIELDS
                if path.startswith("windows.")
                else FIREWALL_FIELDS
                if path.startswith("firewall.")
                else TIME_FIELDS
                if path.startswith("time.")
                else CODE_FIELDS
                if path.startswith("code.")
                else TRAIN_FIELDS
                if path.startswith("train.")
                else ENV_OVERRIDE_FIELDS
                if path.startswith(("env.linux.", "env.windows."))
                else ENV_FIELDS
                if path.startswith("env.")
                else known_fields
            )
            message = f"unknown field '{name}'{did_you_mean(name, options)}"
            shown_field = path if src is not None and src.key == top and path != top else shown_field
        elif kind == "missing":
            what = expected.get(path, "a value")
            message = f"required field '{path}' is missing (expected {what})"
        else:
            what = expected.get(path, str(err.get("msg", "a valid value")))
            if top in _SECRET_FIELDS:
                message = f"expected {what}; the value is not shown"
            else:
                got = err.get("input")
                item = ""
                if len(loc) > 1 and isinstance(loc[-1], int):
                    item = f" item {loc[-1] + 1}:"
                message = f"expected {what}, got{item} {describe(got)}"
                reason = err.get("ctx", {}).get("error")
                if (
                    kind == "value_error"
                    and path.startswith(("firewall.", "time", "code", "train."))
                    and reason
                ):
                    message = f"expected {what}: {reason}"
        log.add(message + suffix, line=line, node=issue_node, field=shown_field)
    return bad
