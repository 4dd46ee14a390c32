"""The inventory data model and the format-independent part of loading it.

Readers (:mod:`.native`, :mod:`.ansible`) turn a file into :class:`NodeDraft` objects (raw values plus where
each came from); :func:`assemble` validates them with the pydantic models below, runs the cross-node
checks and either returns an :class:`Inventory` or raises one :class:`InventoryError` with every issue.

Secrets: a literal password found in an inventory (Ansible ``ansible_password``) is kept in a private
pydantic attribute of the :class:`Node` as a :class:`~pydantic.SecretStr`. It is not a field, so it never
appears in ``repr``/``str``/``model_dump``/:meth:`Inventory.public_dict`.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, NamedTuple, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from orchestrator.errors import InventoryError, InventoryIssue
from orchestrator.inventory._yaml import closest, describe, did_you_mean

__all__ = [
    "NODE_USER_FIELDS",
    "Backend",
    "Cluster",
    "CodeSettings",
    "ConnectionName",
    "EnvOverride",
    "EnvSettings",
    "FirewallSettings",
    "FromEnv",
    "InsecureSetting",
    "Inventory",
    "IssueLog",
    "Node",
    "NodeDraft",
    "OsName",
    "Source",
    "TimeSettings",
    "TrainSettings",
    "WinRMSettings",
    "WindowsSettings",
    "assemble",
    "inventory_password",
    "is_localhost",
    "is_secret_name",
    "masked_args",
]

Transport = Literal["ntlm", "kerberos", "credssp", "basic", "certificate"]
Scheme = Literal["https", "http"]
OsName = Literal["linux", "windows"]
ConnectionName = Literal["ssh", "winrm", "local"]
Backend = Literal["auto", "gloo", "nccl"]
InventoryFormat = Literal["native", "ansible"]

WINRM_DEFAULT_PORTS: dict[str, int] = {"https": 5986, "http": 5985}
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # always .fullmatch: "$" matches before a final "\n"
_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})

# A node name is a file name here and on the nodes (runs/<id>/<node>.log, render --out), a prefix on
# every line and a word in patterns (``--nodes a,b``, ``tag:x``): host-name characters only, so it
# can never be a path ("/", "..") or hide a line break. pydantic's patterns match the whole text.
NodeName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
]
HostName = Annotated[str, StringConstraints(min_length=1, pattern=r"^[^\s,/]+$")]
Text = Annotated[str, StringConstraints(min_length=1)]


def _printable(value: str) -> str:
    # a display name reaches comments in scripts, titles and tables: nothing that ends a line there
    bad = [c for c in value if unicodedata.category(c) in _UNPRINTABLE_CATEGORIES]
    if bad:
        raise ValueError(f"control character {bad[0]!a} in a name: use printable text on one line")
    return value


_UNPRINTABLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
# a name people read (cluster.name): any printable text on one line
DisplayName = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_printable)]
PortNumber = Annotated[int, Field(ge=1, le=65535)]


def _no_bool(value: Any) -> Any:
    # pydantic's lax mode turns true/false into 1/0 for int fields; an inventory saying ``gpus: true`` is a
    # mistake worth reporting.
    if isinstance(value, bool):
        raise ValueError("a boolean is not an integer")
    return value


class WinRMSettings(BaseModel):
    """How to reach a Windows node over WinRM."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    transport: Transport = "ntlm"
    scheme: Scheme = "https"
    cert_validation: bool = True
    ca_bundle: Text | None = None

    def insecure(self) -> list[InsecureSetting]:
        """The settings that expose the password or the session, each with its secure alternative.

        The one list that both the inventory (refused unless the node says ``allow_insecure: true``,
        exit 2, before anything connects) and the WinRM transport (refused likewise, else a warning on
        every run) check: a weakening added here is refused everywhere at once.
        """
        found = []
        if self.transport == "basic" and self.scheme == "http":
            found.append(
                InsecureSetting(
                    "winrm.transport",
                    "winrm.transport: basic over winrm.scheme: http sends the password and every "
                    "command in clear text",
                    "use winrm.scheme: https (port 5986), or winrm.transport: ntlm (encrypted even "
                    "over HTTP)",
                )
            )
        if self.scheme == "https" and not self.cert_validation:
            found.append(
                InsecureSetting(
                    "winrm.cert_validation",
                    "winrm.cert_validation: false: the TLS certificate is not checked, so anyone on the "
                    "network path can impersonate the node and receive the password",
                    "set winrm.ca_bundle to a PEM file with the listener's CA (or self-signed) certificate",
                )
            )
        return found


class InsecureSetting(NamedTuple):
    """A WinRM setting that weakens the connection (see :meth:`WinRMSettings.insecure`)."""

    field: str  # the inventory field to name: "winrm.transport", "winrm.cert_validation"
    risk: str  # what it exposes
    fix: str  # the secure alternative


WindowsMode = Literal["wsl", "native"]
# What cmd.exe and wsl.exe pass through untouched (the names reach a Windows command line).
WslDistro = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
LinuxUser = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9._-]*\$?$")]


class WindowsSettings(BaseModel):
    """Where training runs on a Windows node (docs/inventory.md, "Windows nodes").

    ``wsl``: inside a WSL2 distribution, with the Linux build of torch: the only way to share a gloo
    group with Linux ranks (Windows torch speaks gloo's UV transport, Linux torch its TCP transport).
    ``native``: Windows Python, for clusters made only of Windows nodes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: WindowsMode = "wsl"
    distro: WslDistro | None = None  # None: the Windows user's default distribution
    wsl_user: LinuxUser | None = None  # None: the distribution's default user


class Node(BaseModel):
    """One machine of the cluster, with every default resolved."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    name: NodeName
    host: HostName
    port: PortNumber | None = None
    os: OsName = "linux"
    connection: ConnectionName = "ssh"
    user: Text | None = None
    key_file: Text | None = None
    password_env: str | None = None
    password_prompt: bool = False
    gpus: int = Field(default=0, ge=0)
    nproc: int = Field(default=1, ge=1)
    interface: Text | None = None
    python: Text | None = None
    workdir: Text | None = None
    tags: tuple[Text, ...] = ()
    winrm: WinRMSettings = Field(default_factory=WinRMSettings)
    allow_insecure: bool = False
    windows: WindowsSettings = Field(default_factory=WindowsSettings)
    line: int | None = None

    _password: SecretStr | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _resolve_defaults(cls, data: Any) -> Any:
        """Fill the defaults that depend on other fields (name, host, connection, port, nproc)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        os_name = data.get("os", "linux")
        if "connection" not in data:
            data["connection"] = "winrm" if os_name == "windows" else "ssh"
        connection = data["connection"]
        if "host" not in data and connection == "local":
            data["host"] = "localhost"
        host = data.get("host")
        if "name" not in data and isinstance(host, (str, int)) and not isinstance(host, bool):
            data["name"] = str(host)
        if data.get("port") is None and connection == "winrm":
            winrm = data.get("winrm")
            scheme: Any = "https"
            if isinstance(winrm, dict):
                scheme = winrm.get("scheme", "https")
            elif isinstance(winrm, WinRMSettings):
                scheme = winrm.scheme
            if scheme in WINRM_DEFAULT_PORTS:
                data["port"] = WINRM_DEFAULT_PORTS[scheme]
        gpus = data.get("gpus")
        if "nproc" not in data and isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0:
            data["nproc"] = gpus
        return data

    @field_validator("port", "gpus", "nproc", mode="before")
    @classmethod
    def _integers_are_not_booleans(cls, value: Any) -> Any:
        return _no_bool(value)

    @field_validator("name")
    @classmethod
    def _not_a_tag_pattern(cls, value: str) -> str:
        if value.startswith("tag:"):
            raise ValueError("a node name cannot start with 'tag:'")
        return value

    @field_validator("password_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME_RE.fullmatch(value):
            raise ValueError("not an environment variable name")
        return value

    @property
    def address(self) -> str:
        """``host:port`` (``[v6]:port`` for IPv6 literals), or just ``host`` when the port is not fixed."""
        if self.port is None:
            return self.host
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"

    @property
    def password_source(self) -> str | None:
        """Where a password comes from (never the password): ``env:NAME``, ``inventory``, ``prompt``, None."""
        if self.password_env:
            return f"env:{self.password_env}"
        if self._password is not None:
            return "inventory"
        if self.password_prompt:
            return "prompt"
        return None


def inventory_password(node: Node) -> SecretStr | None:
    """The literal password an inventory gave for ``node`` (Ansible ``ansible_password``), if any."""
    return node._password


def _attach_password(node: Node, secret: str) -> None:
    node._password = SecretStr(secret)


#: what a secret looks like when shown
MASK = "********"
# Names of variables, and of command-line flags, whose values are treated as secrets when shown.
_SECRET_NAME_RE = re.compile(r"PASS|TOKEN|SECRET|KEY|CREDENTIAL", re.IGNORECASE)
_SECRET_FLAG_RE = re.compile(r"--?[A-Za-z0-9_.-]*(token|key|passw|secret|credential)[A-Za-z0-9_.-]*", re.I)


def is_secret_name(name: str) -> bool:
    """``WANDB_API_KEY``, ``HF_TOKEN``, ``DB_PASSWORD``...: a variable whose value is not shown."""
    return bool(_SECRET_NAME_RE.search(name))


def masked_args(args: Sequence[str]) -> tuple[str, ...]:
    """Arguments for display: the value after a secret-looking flag masked.

    ``--hf-token X`` -> ``--hf-token ********``; ``--api-key=X`` -> ``--api-key=********`` (flags
    containing token, key, passw, secret or credential). The argument after such a flag is masked
    unless it is itself a long option (``--use-token --epochs 3`` keeps ``--epochs``).
    """
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next and not arg.startswith("--"):
            out.append(MASK)
            hide_next = False
            continue
        hide_next = False
        flag, eq, value = arg.partition("=")
        if _SECRET_FLAG_RE.fullmatch(flag):
            if eq:
                out.append(f"{flag}={MASK}" if value else arg)
            else:
                out.append(arg)
                hide_next = True
        else:
            out.append(arg)
    return tuple(out)


class FromEnv(BaseModel):
    """A ``train.env`` value taken from this machine's environment at launch: ``{from_env: NAME}``.

    The inventory names the variable, never the value (like a node's ``password_env``). The value is
    a secret: masked when a script is shown, referenced (never written) in scripts saved to files.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    from_env: str


def _env_value(name: str, value: Any) -> str | FromEnv:
    if value is None:
        return ""
    if isinstance(value, FromEnv):
        return value
    if isinstance(value, Mapping):
        variable = value.get("from_env")
        if set(value) != {"from_env"} or not isinstance(variable, str) or not ENV_NAME_RE.fullmatch(variable):
            # the value is not echoed: a user may have put the secret where its variable's name belongs
            raise ValueError(
                f"{name}: write {{from_env: VARIABLE}}, VARIABLE being the NAME of an environment "
                "variable on this machine (letters, digits, _); the value is not shown"
            )
        return FromEnv(from_env=variable)
    return str(value)


class TrainSettings(BaseModel):
    """What every node runs: the training script, its arguments and environment, the launch mode."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    script: Text = "examples/train_ddp.py"  # relative to the code directory on the nodes
    args: tuple[str, ...] = ()
    # stored as sorted pairs: a frozen (hashable) model cannot hold a dict; ``env_dict`` gives it back.
    # A value is a literal, or FromEnv: taken from this machine's environment at launch (a secret)
    env: tuple[tuple[str, str | FromEnv], ...] = ()
    code_dir: str | None = None  # on the nodes; default: <workdir>/code
    elastic: bool = False  # c10d rendezvous, --nnodes MIN:MAX, restarts; else static rendezvous
    min_nodes: Annotated[int, Field(ge=1)] | None = None  # elastic: fewest nodes to start with
    max_restarts: Annotated[int, Field(ge=0)] = 0
    # the user's launch templates, searched before the shipped ones; relative to the inventory
    # file's directory, stored absolute. Resolved when the inventory is loaded but checked only by
    # the commands that render (render.templates_dir_for): a missing directory must not stop `stop`
    templates: Text | None = None
    # the inventory line of ``templates`` (set by _build_cluster), for the error naming it
    _templates_line: int | None = PrivateAttr(default=None)

    @field_validator("env", mode="before")
    @classmethod
    def _env_pairs(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            for name in value:
                if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name):
                    raise ValueError(f"invalid environment variable name {name!r}")
            return tuple(sorted(((str(k), _env_value(str(k), v)) for k, v in value.items()), key=_first))
        return value

    @field_validator("args", mode="before")
    @classmethod
    def _args_as_strings(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return tuple(str(v) for v in value)
        return value

    @field_validator("templates")
    @classmethod
    def _templates_directory(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Absolute, relative to the inventory file's directory; whether it exists is not checked here."""
        if value is None:
            return None
        path = Path(value).expanduser()
        base = (info.context or {}).get("base_dir")
        if not path.is_absolute() and base is not None:
            path = Path(base) / path
        return str(path.resolve())

    @property
    def templates_line(self) -> int | None:
        """The inventory line ``templates`` was read from (None when unknown)."""
        return self._templates_line

    @property
    def env_dict(self) -> dict[str, str | FromEnv]:
        return dict(self.env)

    @property
    def env_from(self) -> dict[str, str]:
        """Variables taken from this machine's environment: train.env name -> variable name."""
        return {name: value.from_env for name, value in self.env if isinstance(value, FromEnv)}

    def public_dict(self) -> dict[str, Any]:
        """For --json: literal values of secret-looking variables and secret arguments masked."""
        doc = self.model_dump(mode="json")
        env: dict[str, Any] = {}
        for name, value in self.env:
            if isinstance(value, FromEnv):
                env[name] = value.model_dump()  # the variable's name only
            else:
                env[name] = MASK if is_secret_name(name) else value
        doc["env"] = env
        doc["args"] = list(masked_args(self.args))
        return doc


def _first(pair: tuple[str, Any]) -> str:
    return pair[0]


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
                if not isinstance(item, str) or not re.fullmatch(r"[A-Za-z0-9.:_-]+", item):
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


#: dest values that would make code sync (which deletes what the project no longer has) wipe a home
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


class Cluster(BaseModel):
    """Cluster-wide settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    name: DisplayName
    master: Text
    port: PortNumber = 29500
    backend: Backend = "auto"
    train: TrainSettings = TrainSettings()
    firewall: FirewallSettings = FirewallSettings()
    time: TimeSettings = TimeSettings()
    env: EnvSettings = EnvSettings()
    code: CodeSettings = CodeSettings()

    @field_validator("port", mode="before")
    @classmethod
    def _integers_are_not_booleans(cls, value: Any) -> Any:
        return _no_bool(value)

    @model_validator(mode="before")
    @classmethod
    def _one_code_directory(cls, data: Any) -> Any:
        """``code.dest`` and ``train.code_dir`` name one directory: sync pushes where launch runs.

        A ``code.dest`` alone is copied into ``train.code_dir`` (launch reads that); both given and
        different would make launch run code that sync never pushed.
        """
        if not isinstance(data, dict):
            return data
        code, train = data.get("code"), data.get("train")
        dest = code.get("dest") if isinstance(code, dict) else None
        if not isinstance(dest, str) or (train is not None and not isinstance(train, dict)):
            return data
        if (train or {}).get("code_dir") is None:
            return {**data, "train": {**(train or {}), "code_dir": dest}}
        return data  # both given: _same_code_directory compares them once validated

    @field_validator("code")
    @classmethod
    def _same_code_directory(cls, code: CodeSettings, info: ValidationInfo) -> CodeSettings:
        train = info.data.get("train")
        code_dir = train.code_dir if isinstance(train, TrainSettings) else None
        if code.dest is not None and code_dir is not None and code_dir != code.dest:
            raise ValueError(
                f"code.dest {code.dest!r} and train.code_dir {code_dir!r} differ: launch runs the code "
                "from train.code_dir, sync pushes it to code.dest; keep only code.dest"
            )
        return code


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
_EXPECTED: dict[str, str] = {
    "name": "a node name of letters, digits, '.', '_' and '-' (not starting with '.' or '-')",
    "host": "a host name or IP address",
    "port": "an integer between 1 and 65535",
    "os": _one_of(OsName),
    "connection": _one_of(ConnectionName),
    "user": "a user name",
    "key_file": "a path to a private key file",
    "password_env": "the NAME of an environment variable holding the password (letters, digits, _)",
    "password_prompt": "true or false",
    "gpus": "an integer >= 0",
    "nproc": "an integer >= 1",
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
_CLUSTER_EXPECTED: dict[str, str] = {
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
    "code": "a mapping with " + ", ".join(CodeSettings.model_fields),
    "code.source": "a directory on this machine (default: the current directory)",
    "code.dest": "a directory on the nodes (default <workdir>/code)",
    "code.excludes": "a list of gitignore-style patterns",
    "code.gitignore": "true or false",
}
# Values never echoed in messages (a user may put a password where a variable name belongs).
_SECRET_FIELDS = frozenset({"password_env"})


@dataclass
class Source:
    """Where a value came from: the line and the key as written; ``scope`` for shared values."""

    line: int | None
    key: str
    scope: str | None = None  # e.g. "defaults" or "vars of group 'gpu'": the value applies to many nodes


@dataclass
class NodeDraft:
    """A node as read from a file, before validation."""

    label: str  # name for messages: the node name when known, else "nodes[3]"
    line: int | None
    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, Source] = field(default_factory=dict)  # "gpus", "winrm", "winrm.transport", ...
    password: str | None = field(default=None, repr=False)
    errored: set[str] = field(default_factory=set)  # fields a reader already reported and dropped


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


def is_localhost(host: str) -> bool:
    """True for names and addresses that always mean this machine."""
    lowered = host.lower().strip("[]")
    if lowered in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(lowered).is_loopback
    except ValueError:
        return False


def _error_field(loc: tuple[int | str, ...]) -> tuple[str, str]:
    """(top-level field, dotted path for winrm sub-fields) from a pydantic ``loc``."""
    top = str(loc[0]) if loc else ""
    if (
        top in ("winrm", "windows", "firewall", "time", "code", "train")
        and len(loc) > 1
        and isinstance(loc[1], str)
    ):
        return top, f"{top}.{loc[1]}"
    if top == "env" and len(loc) > 1 and isinstance(loc[1], str):
        if loc[1] in ("linux", "windows") and len(loc) > 2 and isinstance(loc[2], str):
            return top, f"env.{loc[1]}.{loc[2]}"
        return top, f"env.{loc[1]}"
    return top, top


def _report_validation(
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


def _without(values: dict[str, Any], paths: Iterable[str]) -> dict[str, Any]:
    """A copy of ``values`` without the given (dotted) fields."""
    out = dict(values)
    for path in paths:
        top = path.split(".", 1)[0]
        if top in ("winrm", "windows") and "." in path and isinstance(out.get(top), dict):
            sub = dict(out[top])
            sub.pop(path.split(".", 1)[1], None)
            out[top] = sub
        else:
            out.pop(path, None)
    return out


def _validate_node(draft: NodeDraft, log: IssueLog) -> tuple[Node | None, set[str]]:
    """Validate one draft; report problems; return the node (wrong fields dropped) and the wrong fields."""
    values = dict(draft.values)
    values["line"] = draft.line
    try:
        node = Node.model_validate(values)
    except ValidationError as exc:
        bad = _report_validation(
            exc,
            values=values,
            sources=draft.sources,
            expected=_EXPECTED,
            known_fields=NODE_USER_FIELDS,
            fallback_line=draft.line,
            node=draft.label,
            log=log,
        )
        try:
            # The cross-field checks still run on what is left (every issue is reported in one go).
            node = Node.model_validate(_without(values, bad))
        except ValidationError:
            return None, bad | draft.errored
        return node, bad | draft.errored
    return node, set(draft.errored)


def _line_of(draft: NodeDraft, *fields: str) -> tuple[int | None, str]:
    for name in fields:
        src = draft.sources.get(name)
        if src is not None:
            return src.line, src.key
    return draft.line, fields[0]


def _check_node(node: Node, draft: NodeDraft, bad: set[str], log: IssueLog) -> None:
    """Checks involving several fields of one node."""
    if node.gpus > 0 and node.nproc > node.gpus and not bad & {"gpus", "nproc"}:
        line, key = _line_of(draft, "nproc", "gpus")
        log.add(
            f"nproc {node.nproc} is more than gpus {node.gpus}: each rank needs its own GPU: "
            "set nproc <= gpus, or gpus: 0 for CPU ranks",
            line=line,
            node=node.name,
            field=key,
        )
    if node.connection == "local" and not is_localhost(node.host) and not bad & {"host", "connection"}:
        line, key = _line_of(draft, "host", "connection")
        log.add(
            f"connection 'local' runs on this machine, but host is '{node.host}': "
            "omit host (or use localhost) for the local node, or use connection: ssh",
            line=line,
            node=node.name,
            field=key,
        )
    if node.connection == "winrm" and node.os == "linux" and not bad & {"os", "connection"}:
        line, key = _line_of(draft, "connection", "os")
        log.add(
            "connection 'winrm' is for Windows nodes: set os: windows, or use connection: ssh for Linux",
            line=line,
            node=node.name,
            field=key,
        )
    if node.connection == "winrm" and not node.allow_insecure and not any(b.startswith("winrm") for b in bad):
        for item in node.winrm.insecure():
            line, key = _line_of(draft, item.field, "winrm.scheme", "winrm")
            # an Ansible inventory spells the opt-in bootstrap_allow_insecure
            allow = "bootstrap_allow_insecure" if key.startswith("ansible_") else "allow_insecure"
            log.add(
                f"{item.risk}: refused; {item.fix} (only on an isolated test network: {allow}: true "
                "for this node)",
                line=line,
                node=node.name,
                field=key,
            )
    # Set for this very node (not through defaults or group vars, which Linux nodes share with
    # Windows ones): a Linux node with Windows settings is a mistake worth naming.
    own = draft.sources.get("windows") or next(
        (src for key, src in draft.sources.items() if key.startswith("windows.")), None
    )
    if node.os != "windows" and "windows" in draft.values and own and not own.scope and "os" not in bad:
        log.add(
            "'windows' (mode, distro, wsl_user) is only for os: windows nodes: remove it, or set os: windows",
            line=own.line,
            node=node.name,
            field=own.key,
        )


def _effective_port(node: Node) -> int | str | None:
    if node.port is not None:
        return node.port
    if node.connection == "ssh":
        return 22
    return node.connection


def _build_cluster(
    values: dict[str, Any],
    sources: dict[str, Source],
    *,
    fallback_line: int | None,
    known_names: Sequence[str],
    log: IssueLog,
    base_dir: str = ".",
) -> Cluster | None:
    cluster: Cluster | None = None
    bad: set[str] = set()
    try:
        # base_dir: where paths in the file start (train.templates)
        cluster = Cluster.model_validate(values, context={"base_dir": base_dir})
        if cluster.train.templates is not None:  # its error comes later (render.templates_dir_for)
            src = sources.get("train.templates") or sources.get("train")
            cluster.train._templates_line = src.line if src else fallback_line
    except ValidationError as exc:
        bad = _report_validation(
            exc,
            values=values,
            sources=sources,
            expected=_CLUSTER_EXPECTED,
            known_fields=CLUSTER_FIELDS,
            fallback_line=fallback_line,
            node=None,
            log=log,
        )
    master = values.get("master")
    if known_names and "master" not in bad and isinstance(master, str) and master not in known_names:
        src = sources.get("master")
        log.add(
            f"master '{master}' is not a node{did_you_mean(master, known_names)}",
            line=src.line if src else fallback_line,
            field=src.key if src else "master",
        )
    return cluster


def assemble(
    *,
    source: str,
    fmt: InventoryFormat,
    drafts: list[NodeDraft],
    cluster_values: dict[str, Any],
    cluster_sources: dict[str, Source],
    cluster_line: int | None,
    default_master: str | None,
    notes: list[str],
    log: IssueLog,
) -> Inventory:
    """Validate drafts and cluster settings: an Inventory, or InventoryError with all issues."""
    nodes: list[Node] = []
    by_name: dict[str, Node] = {}
    by_address: dict[tuple[str, int | str | None], Node] = {}
    for draft in drafts:
        node, bad = _validate_node(draft, log)
        if node is None:
            continue
        _check_node(node, draft, bad, log)
        if draft.password is not None:
            _attach_password(node, draft.password)
        if "name" not in bad and "host" not in bad:
            first = by_name.get(node.name)
            if first is not None:
                line, key = _line_of(draft, "name", "host")
                at = f" (first defined at line {first.line})" if first.line else ""
                log.add(f"duplicate node name '{node.name}'{at}", line=line, node=node.name, field=key)
                continue
            by_name[node.name] = node
        if not bad & {"host", "port", "connection"}:
            address = (node.host.lower(), _effective_port(node))
            other = by_address.get(address)
            if other is not None:
                line, key = _line_of(draft, "host", "port")
                at = f" (line {other.line})" if other.line else ""
                log.add(
                    f"same address {node.address} as node '{other.name}'{at}: "
                    "nodes on one host need different ports",
                    line=line,
                    node=node.name,
                    field=key,
                )
            else:
                by_address[address] = node
        nodes.append(node)

    stem = PurePath(source).stem or "cluster"
    values = dict(cluster_values)
    values.setdefault("name", stem)
    if "master" not in values and default_master is not None:
        values["master"] = default_master
    known = [d.label for d in drafts]
    cluster = None
    if "master" in values:
        cluster = _build_cluster(
            values,
            cluster_sources,
            fallback_line=cluster_line,
            known_names=known,
            log=log,
            base_dir=str(Path(source).absolute().parent),
        )
    if cluster is None and not log:
        log.add("the inventory defines no nodes", line=cluster_line)
    log.raise_if_any()
    assert cluster is not None
    return Inventory(cluster=cluster, nodes=nodes, source=source, format=fmt, notes=list(notes))


@dataclass
class Inventory:
    """A loaded, validated inventory."""

    cluster: Cluster
    nodes: list[Node]
    source: str
    format: InventoryFormat
    notes: list[str] = field(default_factory=list)

    def node(self, name: str) -> Node:
        """The node called ``name``; :class:`InventoryError` (with the closest name) when there is none."""
        for node in self.nodes:
            if node.name == name:
                return node
        hint = did_you_mean(name, self.names)
        raise InventoryError([InventoryIssue(f"unknown node '{name}'{hint}", file=self.source)])

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def master_node(self) -> Node:
        return self.node(self.cluster.master)

    def select(self, patterns: Sequence[str]) -> list[Node]:
        """Nodes matching any pattern, in inventory order, each once.

        A pattern is a node name, an ``fnmatch`` glob (``gpu-*``) or ``tag:NAME`` (the tag may be a glob
        too); one string may hold several comma-separated patterns. A pattern matching no node is an
        :class:`InventoryError` naming it (all such patterns at once).
        """
        wanted: set[str] = set()
        issues: list[InventoryIssue] = []
        for raw in patterns:
            for pattern in (p.strip() for p in raw.split(",")):
                if not pattern:
                    continue
                matched = self._match(pattern)
                if not matched:
                    issues.append(InventoryIssue(self._no_match(pattern), file=self.source))
                wanted.update(matched)
        if issues:
            raise InventoryError(issues)
        return [n for n in self.nodes if n.name in wanted]

    def _match(self, pattern: str) -> set[str]:
        if pattern.startswith("tag:"):
            tag = pattern[4:]
            return {n.name for n in self.nodes if any(fnmatch.fnmatchcase(t, tag) for t in n.tags)}
        exact = {n.name for n in self.nodes if n.name == pattern}
        return exact or {n.name for n in self.nodes if fnmatch.fnmatchcase(n.name, pattern)}

    def _no_match(self, pattern: str) -> str:
        if pattern.startswith("tag:"):
            tags = sorted({t for n in self.nodes for t in n.tags})
            match = closest(pattern[4:], tags)
            hint = f"; did you mean 'tag:{match}'?" if match else ""
            known = ", ".join(tags) if tags else "none"
            return f"no node has tag '{pattern[4:]}'{hint} (tags: {known})"
        return f"no node matches '{pattern}'{did_you_mean(pattern, self.names)}"

    def public_dict(self) -> dict[str, Any]:
        """A JSON-safe description (no secret values; the NAME of a password variable is shown)."""
        nodes = []
        for node in self.nodes:
            entry = node.model_dump(mode="json")
            entry["tags"] = list(node.tags)
            entry["address"] = node.address
            entry["password_source"] = node.password_source
            nodes.append(entry)
        from orchestrator.redact import mask_credentials_in  # URLs (env.index_url...) may hold a login

        doc: dict[str, Any] = {
            "source": self.source,
            "format": self.format,
            "cluster": {**self.cluster.model_dump(mode="json"), "train": self.cluster.train.public_dict()},
            "nodes": nodes,
            "notes": list(self.notes),
        }
        masked: dict[str, Any] = mask_credentials_in(doc)
        return masked
