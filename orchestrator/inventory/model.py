"""The inventory's data model: a node (:class:`Node`, with its WinRM and Windows settings), what
every node trains (:class:`TrainSettings`), the value types they share, and how secret-looking values
are shown (masked).

The cluster and the loaded inventory are :mod:`.cluster`, the setup steps' settings :mod:`.settings`;
loading (readers' drafts validated into an :class:`~orchestrator.inventory.cluster.Inventory`) is
:mod:`.assemble`, its messages :mod:`.issues`.

Secrets: a literal password found in an inventory (Ansible ``ansible_password``) is kept in a private
pydantic attribute of the :class:`Node` as a :class:`~pydantic.SecretStr`. It is not a field, so it never
appears in ``repr``/``str``/``model_dump``/:meth:`Inventory.public_dict`.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

__all__ = [
    "Backend",
    "ConnectionName",
    "FromEnv",
    "InsecureSetting",
    "Node",
    "OsName",
    "TrainSettings",
    "WinRMSettings",
    "WindowsSettings",
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
# A host is a word on command lines (ssh, getent): name, IPv4, IPv6 (zone), an ssh_config alias;
# never an option (leading "-"), a quote, a shell character or a control character.
HostName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=r"^[\w.:%\[\]][\w.:%\[\]-]*$")
]
Text = Annotated[str, StringConstraints(min_length=1)]
#: an absolute Windows path: a drive (C:\\ or C:/) or a UNC share (\\\\server)
WINDOWS_ABSOLUTE = re.compile(r"([A-Za-z]:[\\/]|[\\/]{2})")
#: ranks (and GPUs) on one node: far above any machine (a 16-GPU server, a 256-core CPU box)
MAX_RANKS_PER_NODE = 1024
# One line of text (a user, a path): no control character, which would end a line in what is shown
# (dry runs, tables) or truncate what is sent (NUL).
Line = Annotated[str, StringConstraints(min_length=1, pattern=r"^[^\x00-\x1f\x7f]+$")]


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
    user: Line | None = None
    key_file: Line | None = None
    password_env: str | None = None
    password_prompt: bool = False
    # bounded: every rank of a node is a line of its launch script and a process on it
    gpus: int = Field(default=0, ge=0, le=MAX_RANKS_PER_NODE)
    nproc: int = Field(default=1, ge=1, le=MAX_RANKS_PER_NODE)
    interface: Line | None = None
    python: Line | None = None
    workdir: Line | None = None
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
    def python_os(self) -> str:
        """The OS its training Python runs on, which decides its environment (venv layout, wheels):
        ``linux`` for Linux nodes and for Windows nodes in ``wsl`` mode (the Linux build of torch
        inside the distribution), ``windows`` for native Windows nodes."""
        return "windows" if self.os == "windows" and self.windows.mode == "native" else "linux"

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


def is_localhost(host: str) -> bool:
    """True for names and addresses that always mean this machine."""
    lowered = host.lower().strip("[]")
    if lowered in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(lowered).is_loopback
    except ValueError:
        return False


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

    script: Line = "examples/train_ddp.py"  # relative to the code directory on the nodes
    args: tuple[str, ...] = ()
    # stored as sorted pairs: a frozen (hashable) model cannot hold a dict; ``env_dict`` gives it back.
    # A value is a literal, or FromEnv: taken from this machine's environment at launch (a secret)
    env: tuple[tuple[str, str | FromEnv], ...] = ()
    code_dir: Line | None = None  # on the nodes; default: <workdir>/code
    elastic: bool = False  # c10d rendezvous, --nnodes MIN:MAX, restarts; else static rendezvous
    min_nodes: Annotated[int, Field(ge=1)] | None = None  # elastic: fewest nodes to start with
    max_restarts: Annotated[int, Field(ge=0)] = 0
    # each rank's share of a global batch (docs/bench.md): equal (plain DDP), measured (probed before
    # the launch), or integers, one per rank or one per node (checked against the nodes by assemble)
    shares: Literal["equal", "measured"] | tuple[int, ...] = "equal"
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

    @field_validator("shares", mode="before")
    @classmethod
    def _shares_setting(cls, value: Any) -> Any:
        if isinstance(value, str) and value in ("equal", "measured"):
            return value
        if isinstance(value, (list, tuple)) and value:
            for index, item in enumerate(value):
                if isinstance(item, bool) or not isinstance(item, int) or item < 1:
                    raise ValueError(f"item {index + 1} ({item!r}) is not an integer >= 1")
            return tuple(value)
        raise ValueError(f"{value!r} is not equal, measured or a list of integers")

    @field_validator("script")
    @classmethod
    def _script_inside_the_code_directory(cls, value: str) -> str:
        """A relative script is uploaded from here into the code directory: a '..' would read a file
        outside the project and write it outside that directory. An absolute one (on the nodes
        already) is the user's to name."""
        if value.startswith("/") or WINDOWS_ABSOLUTE.match(value):
            return value
        if value.startswith("-"):  # python would read it as one of its own options (-c CODE)
            raise ValueError(f"{value!r} starts with '-', which python reads as an option: write ./{value}")
        if ".." in re.split(r"[\\/]", value):
            raise ValueError(
                f"{value!r} leaves the code directory ('..'): a relative script is a file of the "
                "project, uploaded into it; give its path inside the project, or an absolute path on "
                "the nodes"
            )
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
