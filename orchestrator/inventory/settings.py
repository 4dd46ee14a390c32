"""Cluster-wide settings of the setup steps: ``cluster.firewall`` (what `bootstrap firewall` opens),
``cluster.time`` (how `bootstrap ntp` keeps the clocks together), ``cluster.env`` (the Python
environment `bootstrap sync` builds on every node) and ``cluster.code`` (the project directory it
pushes). Pydantic models: every value is checked when the inventory is loaded.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.inventory.model import Text, _no_bool

__all__ = ["CodeSettings", "EnvOverride", "EnvSettings", "FirewallSettings", "Installer", "TimeSettings"]


_PORT_RANGE_RE = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*")


def _port_range(value: Any) -> str:
    """``6006`` or ``"6000-6010"`` -> the canonical text (``"6006"``, ``"6000-6010"``); ValueError else."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a port")
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        port = int(value)
        if not 1 <= port <= 65535:
            raise ValueError(f"port {port} is not between 1 and 65535")
        return str(port)
    if isinstance(value, str):
        match = _PORT_RANGE_RE.fullmatch(value)
        if match:
            low, high = int(match.group(1)), int(match.group(2))
            if not 1 <= low <= high <= 65535:
                raise ValueError(f"range {value!r} must be LOW-HIGH with 1 <= LOW <= HIGH <= 65535")
            return str(low) if low == high else f"{low}-{high}"
    raise ValueError(f"{value!r} is not a port or a LOW-HIGH range")


class FirewallSettings(BaseModel):
    """What `bootstrap firewall` opens on the nodes (docs/firewall.md).

    Training needs the rendezvous port on the master and the ephemeral ports gloo/NCCL listen on (they
    cannot be pinned), from the cluster's own addresses only; these settings add to or switch off that.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    manage: bool = True  # false: the step leaves every firewall alone (says so)
    extra_ports: tuple[str, ...] = ()  # "6006", "6000-6010": same scoping (peers only)
    ephemeral_ports: str = "auto"  # "auto": each node's ip_local_port_range; or "LOW-HIGH"
    extra_sources: tuple[str, ...] = ()  # more IPv4 addresses/networks allowed (e.g. a workstation)
    persist: bool = False  # keep the rules across reboots (nftables/iptables files; firewalld --permanent)

    @field_validator("extra_ports", mode="before")
    @classmethod
    def _ports(cls, value: Any) -> Any:
        if isinstance(value, (int, str)) and not isinstance(value, bool):
            value = [value]
        if isinstance(value, (list, tuple)):
            return tuple(_port_range(v) for v in value)
        return value

    @field_validator("ephemeral_ports", mode="before")
    @classmethod
    def _ephemeral(cls, value: Any) -> Any:
        if value == "auto":
            return value
        if isinstance(value, str) and _PORT_RANGE_RE.fullmatch(value):
            return _port_range(value)
        raise ValueError(f"{value!r} is neither 'auto' nor a LOW-HIGH range")

    @field_validator("extra_sources", mode="before")
    @classmethod
    def _sources(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            return value
        out = []
        for item in value:
            try:
                network = ipaddress.ip_network(str(item), strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IPv4 address or network") from None
            if network.version != 4:
                raise ValueError(f"{item!r}: only IPv4 sources are supported (the cluster speaks IPv4)")
            if network.prefixlen < 8:
                raise ValueError(
                    f"{item!r} is far wider than a LAN: training ports are never opened to the world"
                )
            out.append(str(network.network_address) if network.prefixlen == 32 else str(network))
        return tuple(out)


class TimeSettings(BaseModel):
    """How `bootstrap ntp` keeps the nodes' clocks together (docs/time.md).

    Default: the master serves time to the workers (chrony ``local stratum`` + ``allow``), which works
    in labs without internet; with ``servers`` every node follows those instead (or only the master,
    which then serves the workers, with ``serve_from_master: true``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    manage: bool = True  # false: the step only measures and reports the offsets
    servers: tuple[Text, ...] = ()  # upstream NTP servers or pools (names or addresses)
    serve_from_master: bool | None = None  # None: true when no servers are given
    # 100 ms: far inside the preflight's 1 s warning and the ~15 s elastic-rendezvous limit
    # (FIELD_NOTES: c10d heartbeats), yet reachable by w32time on Windows and by Wi-Fi nodes
    max_offset_ms: Annotated[float, Field(gt=0)] = 100.0
    install: bool = False  # install chrony where missing (apt-get/dnf, as root)

    @field_validator("servers", mode="before")
    @classmethod
    def _server_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)):
            for item in value:
                if not isinstance(item, str) or not re.fullmatch(r"[A-Za-z0-9.:_][A-Za-z0-9.:_-]*", item):
                    raise ValueError(f"{item!r} is not a host name or address")
            return tuple(value)
        return value

    @field_validator("max_offset_ms", mode="before")
    @classmethod
    def _offset_not_bool(cls, value: Any) -> Any:
        return _no_bool(value)

    @model_validator(mode="after")
    def _something_to_follow(self) -> TimeSettings:
        if self.manage and self.serve_from_master is False and not self.servers:
            raise ValueError("serve_from_master: false needs servers (or manage: false)")
        return self

    @property
    def serving(self) -> bool:
        """Does the master serve time to the workers?"""
        return self.serve_from_master if self.serve_from_master is not None else not self.servers


Installer = Literal["auto", "uv", "pip"]
_PYTHON_WANTED_RE = re.compile(r"3(\.\d+){0,2}")


def _string_list(value: Any) -> Any:
    """One string or a list of strings -> tuple (YAML lets users write either)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(value)
    return value


class EnvOverride(BaseModel):
    """``cluster.env.linux`` / ``cluster.env.windows``: what differs on nodes of one OS (a CUDA wheel
    index for Linux, another for Windows). Each field given replaces the cluster-wide one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requirements: Text | None = None
    packages: tuple[Text, ...] | None = None
    index_url: Text | None = None
    extra_index_urls: tuple[Text, ...] | None = None
    find_links: tuple[Text, ...] | None = None
    no_index: bool | None = None

    @field_validator("packages", "extra_index_urls", "find_links", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _string_list(value)


class EnvSettings(BaseModel):
    """``cluster.env``: the Python environment every node gets (see docs/sync.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    python: Text | None = None  # "3.11": the node's interpreter must report this version (prefix)
    requirements: Text | None = None  # a requirements/lock file, relative to the inventory file
    packages: tuple[Text, ...] = ()
    index_url: Text | None = None
    extra_index_urls: tuple[Text, ...] = ()
    find_links: tuple[Text, ...] = ()
    no_index: bool = False  # only find_links (pip --no-index)
    linux: EnvOverride | None = None
    windows: EnvOverride | None = None
    path: Text | None = None  # where the venv lives on each node; default <workdir>/venv
    offline: bool = False  # the controller downloads wheels and pushes them: nodes need no internet
    installer: Installer = "auto"
    #: byte-compile every installed module while installing (pip's default, uv's --compile-bytecode).
    #: Off: Python compiles what is imported, on first import (uv's default; a whole torch environment
    #: installs about 4x faster with pip)
    compile_bytecode: bool = False

    @field_validator("python", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        if isinstance(value, float):
            # YAML reads 3.10 as the number 3.1: the only safe spelling is a string
            raise ValueError(f'write the version quoted (python: "{value}"): YAML reads 3.10 as 3.1')
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str) and not _PYTHON_WANTED_RE.fullmatch(value):
            raise ValueError(f'{value!r} is not a Python 3 version such as "3.11"')
        return value

    @field_validator("packages", "extra_index_urls", "find_links", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _string_list(value)

    @property
    def declared(self) -> bool:
        """True when the inventory asks for an environment at all."""
        overrides = [o for o in (self.linux, self.windows) if o is not None]
        return bool(
            self.requirements or self.packages or any(o.requirements or o.packages for o in overrides)
        )


#: dest values that would make code sync (which writes the project's files over what is there) use a home
_UNSAFE_CODE_DESTS = frozenset({"", "/", "~", ".", "$HOME", "%USERPROFILE%"})


class CodeSettings(BaseModel):
    """``cluster.code``: the project directory `bootstrap sync` pushes to every node (docs/sync.md).

    ``dest`` is the one code directory of the cluster: launch runs the training script from it
    (``train.code_dir`` names the same directory and is kept for older inventories).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Text | None = None  # on this machine; default: the current directory (like train.script)
    dest: Text | None = None  # on the nodes; default: train.code_dir, else <workdir>/code
    excludes: tuple[Text, ...] = ()  # gitignore syntax, relative to source; "!pattern" re-includes
    gitignore: bool = True  # honour .gitignore files (git ls-files in a git work tree)

    @field_validator("excludes", mode="before")
    @classmethod
    def _excludes_list(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else tuple(value) if isinstance(value, list) else value

    @field_validator("dest")
    @classmethod
    def _not_a_home(cls, value: str | None) -> str | None:
        bare = None if value is None else value.strip().rstrip("/\\")
        if bare is not None and (bare in _UNSAFE_CODE_DESTS or re.fullmatch(r"[A-Za-z]:", bare)):
            raise ValueError(
                f"{value!r} is a home or root directory: sync deletes files the project does not have, "
                "so dest must be a directory of its own, e.g. ~/cluster-bootstrap/code"
            )
        return value
