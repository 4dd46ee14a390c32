"""Launch scripts: one per node, from Jinja templates (a user directory first, then the shipped ones).

Nothing runs here. Quoting is the default, not a discipline: every ``{{ value }}`` a template writes
goes through the node platform's quoting (Jinja ``finalize``) unless a filter has already made it
shell text (:class:`ShellText`: ``q``, ``path``, ``env_name``, ``winargs``, ``comment``, ``safe``).
A forgotten filter, in our templates or a user's, therefore writes a quoted word, never a command.
Numbers are written as they are. ``StrictUndefined`` makes a misspelt variable an error, not an
empty string in a command line. Each platform gets its own Jinja environment: nodes render in
parallel threads and nothing is swapped per call.

Secrets: a ``train.env`` value written ``{from_env: NAME}`` is read from this machine's environment
only when a script is rendered for a launch (``secrets="value"``). A script shown to the user
(``"mask"``) has every secret masked: those values, values of secret-looking variable names and the
argument after a secret-looking flag (``--hf-token X``, ``--api-key=X``). A script written for the
user to run by hand (``"reference"``) requires the variable from whoever runs it instead of holding
the value.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from orchestrator.errors import InventoryError, InventoryIssue, UsageError
from orchestrator.inventory.model import MASK, FromEnv, is_secret_name, masked_args
from orchestrator.platforms import Platform, check_env_name
from orchestrator.platforms.powershell import argv_to_command_line
from orchestrator.records import new_nonce
from orchestrator.redact import mask_url_credentials
from orchestrator.resources import templates_dir
from orchestrator.runs.layout import in_workdir

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node

#: how secrets appear in a rendered script: the real values (launch), masked (shown to the user),
#: or referenced from the environment of whoever runs it (a file written for running by hand)
SecretMode = Literal["value", "mask", "reference"]


@dataclass(frozen=True)
class LaunchSpec:
    """Everything one node's launch script says, decided before any template is involved."""

    node: Node
    node_rank: int
    nnodes: int
    nproc: int
    first_rank: int  # global rank of this node's local rank 0 (ranks follow inventory order)
    world_size: int
    master_addr: str
    master_port: int
    backend: str
    python: str
    code_dir: str
    script: str
    args: tuple[str, ...]
    run_id: str
    elastic: bool
    min_nodes: int
    max_restarts: int
    local_addr: str  # the address this node's peers reach it at (torchrun --local-addr)
    cluster_name: str = ""
    env: dict[str, str] = field(default_factory=dict)
    # names in ``env`` whose value is taken from this machine's environment at launch (a secret):
    # env name -> variable name; ``env`` holds an empty placeholder for them
    env_from: dict[str, str] = field(default_factory=dict)
    # cb_shares.json for the ranks (cluster.train.shares, orchestrator/bench): uploaded with the
    # helper into the run directory when not empty
    shares_json: str = ""
    # the nonce of the run's samples (GPU use, CPU load) in its output: records.py frames, written by
    # the node's rank capture (steps/probes/rank_capture.py), read by the dashboard; one per run
    sample_nonce: str = ""
    # a directory the ranks import from besides the code directory (bench --callable: the project's,
    # while the worker runs from the run directory): refused like the code directory when another user
    # could change it (what they import from it would be theirs)
    imports_from: str = ""
    # what a code sync of the project as it is here records on the node (path -> SHA-256; None: the
    # inventory syncs no project): the node's own record is read before the run and compared
    code_record: Mapping[str, str] | None = field(default=None, compare=False, repr=False)
    # the training script as it is here (cluster.code: the project's copy, wherever bootstrap runs
    # from), uploaded into the code directory; "": the one in the current directory, when there
    script_source: str = ""


def plan_launch(
    inventory: Inventory,
    *,
    backend: str,
    master_addr: str,
    run_id: str,
    interfaces: Mapping[str, tuple[str | None, str | None]],
    cpus: Mapping[str, int],
    pythons: Mapping[str, str],
) -> list[LaunchSpec]:
    """One spec per node of ``inventory`` (``--nodes`` narrows the inventory itself: Inventory.only),
    in node-rank order (:attr:`Inventory.rank_order`: the master is node rank 0).

    ``interfaces``: node -> (interface, source address) from the route to the master; ``cpus``:
    node -> CPU count (OMP_NUM_THREADS); ``pythons``: node -> interpreter.
    """
    nodes = inventory.rank_order
    train = inventory.cluster.train
    world = sum(n.nproc for n in nodes)
    sample_nonce = new_nonce()
    specs = []
    first = 0
    for rank, node in enumerate(nodes):
        interface, source = interfaces.get(node.name, (node.interface, None))
        env: dict[str, str] = {}
        if interface:
            # exact names (gloo takes no prefixes); without it gloo binds whatever the hostname
            # resolves to, 127.0.1.1 on Debian (FIELD_NOTES, "Interfaces")
            env["GLOO_SOCKET_IFNAME"] = interface
            if backend == "nccl":
                env["NCCL_SOCKET_IFNAME"] = "=" + interface  # "=": exact match, not a prefix
        if node.name in cpus:
            env["OMP_NUM_THREADS"] = str(max(1, cpus[node.name] // max(1, node.nproc)))
        # the user's values win; secrets (from_env) are read when a launch renders the script
        env.update({k: "" if isinstance(v, FromEnv) else v for k, v in train.env_dict.items()})
        specs.append(
            LaunchSpec(
                node=node,
                node_rank=rank,
                nnodes=len(nodes),
                nproc=node.nproc,
                first_rank=first,
                world_size=world,
                master_addr=master_addr,
                master_port=inventory.cluster.port,
                backend=backend,
                python=pythons.get(node.name, node.python or "python3"),
                code_dir=train.code_dir or in_workdir(node, "code"),
                script=train.script,
                args=train.args,
                run_id=run_id,
                elastic=train.elastic,
                min_nodes=train.min_nodes or len(nodes),
                max_restarts=train.max_restarts,
                local_addr=source or node.host,
                cluster_name=inventory.cluster.name,
                env=env,
                env_from=train.env_from,
                sample_nonce=sample_nonce,
            )
        )
        first += node.nproc
    return specs


def templates_dir_for(inventory: Inventory, cli_value: Path | None = None) -> Path | None:
    """The user's template directory: ``--templates DIR`` when given, else the inventory's
    ``cluster.train.templates``, else None (shipped only).

    The inventory's directory (resolved when it was loaded) is checked here, not at load: only the
    commands that render need it, and `stop`, `status`, `logs`, `teardown` must work without it.
    Raises :class:`InventoryError` (exit 2) naming the field, the file and the resolved path.
    """
    if cli_value is not None:
        return cli_value  # checked by Renderer
    train = inventory.cluster.train
    if not train.templates:
        return None
    path = Path(train.templates)
    try:
        found = path.is_dir()
        what = "is not a directory" if path.exists() else "does not exist"
    except (OSError, ValueError) as exc:  # a name too long for this file system
        found, what = False, f"cannot be read ({getattr(exc, 'strerror', None) or exc})"
    if not found:
        raise InventoryError(
            [
                InventoryIssue(
                    f"{path} {what}: create it with your launch templates, fix the path (relative to "
                    "the inventory file), or remove train.templates to use the shipped templates",
                    file=inventory.source,
                    line=train.templates_line,
                    field="train.templates",
                )
            ]
        )
    return path


def missing_secrets(inventory: Inventory, environ: Mapping[str, str] | None = None) -> list[InventoryIssue]:
    """One issue per ``train.env`` secret whose variable is not set (or empty) here."""
    environ = os.environ if environ is None else environ
    issues = []
    for name, variable in inventory.cluster.train.env_from.items():
        if not environ.get(variable):
            state = "is empty" if variable in environ else "is not set"
            issues.append(
                InventoryIssue(
                    f"environment variable {variable} {state}: export {variable}=... on this machine "
                    "before launching (its value is sent to the nodes, never shown or saved here)",
                    file=inventory.source,
                    field=f"train.env.{name}",
                )
            )
    return issues


def secret_values(inventory: Inventory, environ: Mapping[str, str] | None = None) -> list[str]:
    """Values the page masks: train.env secrets (``from_env``, secret-looking names) as set here."""
    env = os.environ if environ is None else environ
    out = []
    for name, value in inventory.cluster.train.env:
        if isinstance(value, FromEnv):
            if env.get(value.from_env):
                out.append(env[value.from_env])
        elif is_secret_name(name) and value:
            out.append(value)
    return out


def require_secrets(inventory: Inventory, environ: Mapping[str, str] | None = None) -> None:
    """Before connecting to anything: every ``{from_env: NAME}`` of ``train.env`` can be read here.

    Raises :class:`InventoryError` (exit 2) naming each field and variable.
    """
    issues = missing_secrets(inventory, environ)
    if issues:
        raise InventoryError(issues)


class Renderer:
    """Jinja environment: ``user_dir`` (``--templates``) searched before the shipped templates.

    ``environ``: where ``{from_env: NAME}`` values are read when rendering for a launch (default:
    this process's environment).
    """

    #: platform name -> launch template. WSL nodes run the Linux build of torch inside their
    #: distribution: the same torchrun script as Linux. Native Windows cannot use torchrun
    #: (pytorch#148283): one Python process per local rank, in PowerShell.
    TEMPLATES: ClassVar[dict[str, str]] = {
        "posix": "torchrun.sh.j2",
        "wsl": "torchrun.sh.j2",
        "powershell": "torchrun_windows.ps1.j2",
    }

    def __init__(self, user_dir: Path | None = None, *, environ: Mapping[str, str] | None = None) -> None:
        self.environ = os.environ if environ is None else environ
        search: list[str] = []
        if user_dir is not None:
            if not user_dir.is_dir():
                raise UsageError(f"template directory {user_dir} does not exist")
            search.append(str(user_dir))
        search.append(str(templates_dir()))
        self._loader = jinja2.FileSystemLoader(search)
        # one environment per platform (its quoting is the environment's finalize): built once, never
        # changed afterwards, so threads rendering different nodes share nothing mutable
        self._envs: dict[int, tuple[Platform, jinja2.Environment]] = {}
        self._lock = threading.Lock()

    def environment(self, platform: Platform) -> jinja2.Environment:
        """The Jinja environment whose every output is quoted for ``platform`` unless marked safe."""
        with self._lock:
            cached = self._envs.get(id(platform))
            if cached is None or cached[0] is not platform:
                cached = (platform, _platform_environment(self._loader, platform))
                self._envs[id(platform)] = cached
            return cached[1]

    def render(
        self,
        spec: LaunchSpec,
        platform: Platform,
        *,
        mask: bool = False,
        template: str | None = None,
        secrets: SecretMode | None = None,
    ) -> str:
        """One node's script. ``secrets``: "value" (the default: what a launch runs), "mask" (the
        default with ``mask=True``: for showing), "reference" (for a file a user runs by hand)."""
        mode: SecretMode = secrets or ("mask" if mask else "value")
        name = template or self.TEMPLATES.get(platform.name)
        if name is None:
            raise UsageError(f"no launch template for {platform.name} nodes yet", node=spec.node.name)
        if platform.as_powershell() is not None:
            refuse_on_native_windows(spec)
        jinja_env = self.environment(platform)
        env, env_required = self._environment(spec, mode)
        args = tuple(mask_url_credentials(a) for a in masked_args(spec.args)) if mode == "mask" else spec.args
        try:
            jinja_template = jinja_env.get_template(name)
            return jinja_template.render(
                node=spec.node,
                node_rank=spec.node_rank,
                node_rank_text=f"node rank {spec.node_rank}" if not spec.elastic else "elastic",
                nnodes=spec.nnodes,
                nproc=spec.nproc,
                first_rank=spec.first_rank,
                world_size=spec.world_size,
                master_addr=spec.master_addr,
                master_port=spec.master_port,
                backend=spec.backend,
                python=spec.python,
                code_dir=spec.code_dir,
                script=spec.script,
                args=args,
                run_id=spec.run_id,
                elastic=spec.elastic,
                min_nodes=spec.min_nodes,
                max_restarts=spec.max_restarts,
                local_addr=spec.local_addr,
                env=env,
                env_required=env_required,
                cluster_name=spec.cluster_name,
            )
        except jinja2.TemplateError as exc:
            where = f"{exc.filename}:{exc.lineno}" if isinstance(exc, jinja2.TemplateSyntaxError) else name
            raise UsageError(f"template {where}: {exc}", node=spec.node.name) from None
        except ValueError as exc:  # a filter refused a value (env_name): name the template
            raise UsageError(f"template {name}: {exc}", node=spec.node.name) from None

    def _environment(self, spec: LaunchSpec, mode: SecretMode) -> tuple[list[tuple[str, str]], list[str]]:
        """(name, value) pairs the script exports, and (reference mode) the names it requires from
        whoever runs it."""
        pairs: list[tuple[str, str]] = []
        required: list[str] = []
        for name, value in spec.env.items():
            variable = spec.env_from.get(name)
            if variable is None:
                if mode == "mask":  # a login inside a URL too (HTTPS_PROXY=http://u:pw@proxy:3128)
                    value = MASK if is_secret_name(name) else mask_url_credentials(value)
                pairs.append((name, value))
            elif mode == "mask":
                pairs.append((name, MASK))
            elif mode == "reference":
                required.append(name)
            else:
                secret = self.environ.get(variable)
                if not secret:
                    state = "is empty" if variable in self.environ else "is not set"
                    raise UsageError(
                        f"train.env.{name}: environment variable {variable} {state}",
                        node=spec.node.name,
                        hint=f"export {variable}=... on this machine before launching",
                    )
                pairs.append((name, secret))
        return pairs, required


class ShellText(str):
    """Text already safe to write into a script of the node's dialect, as it is: what the quoting
    filters return. Anything else a template writes is quoted first (see :func:`_platform_environment`).

    Joining it with other text gives a plain ``str`` again (``str.__add__``), which is quoted: only a
    filter's own result is ever trusted.
    """

    __slots__ = ()


#: characters that end or bend a line in a shell, PowerShell or a terminal: controls (Cc), format
#: characters (Cf: bidi overrides), line and paragraph separators (Zl, Zp)
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")


def comment_text(value: object) -> ShellText:
    """``value`` for a ``#`` comment line: every character that could end the line (or hide text)
    shown as ``?``. A quoted word is no protection there: a newline inside quotes still ends a comment."""
    return ShellText(_UNPRINTABLE.sub("?", str(value)))


def _platform_environment(loader: jinja2.BaseLoader, platform: Platform) -> jinja2.Environment:
    quote = platform.quote

    def finalize(value: object) -> object:
        # every {{ ... }} output passes here: quoted unless a filter made it shell text already
        if isinstance(value, ShellText):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return value  # digits only: nothing to quote
        return quote(str(value))

    def shell_text(fn: Callable[..., str]) -> Callable[..., ShellText]:
        return lambda *args: ShellText(fn(*args))

    # sandboxed: a template directory comes with an inventory (train.templates), and rendering runs
    # here, on the controller: a template reads its context, never Python's internals (os, files)
    env = ImmutableSandboxedEnvironment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # shell text, quoted by the platform (finalize), never HTML
        finalize=finalize,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        q=shell_text(quote),
        path=shell_text(platform.path_word),
        env_name=shell_text(check_env_name),
        # a Windows program's arguments: one command-line string (the C runtime's splitting rules),
        # then a PowerShell literal holding it (see PowerShell.native)
        winargs=shell_text(lambda argv: quote(argv_to_command_line(["x", *argv])[2:])),
        comment=comment_text,
        # the template's author vouches for this text (a literal of the template, not a value)
        safe=ShellText,
    )
    return env


def refuse_on_native_windows(spec: LaunchSpec) -> None:
    """What a native-Windows node cannot run, refused before any script exists: elastic rendezvous
    (torchrun's agent, broken on Windows: pytorch#148283) and NCCL (Windows torch has gloo only)."""
    if spec.elastic:
        raise UsageError(
            "elastic training needs torchrun, which does not work on native Windows (pytorch#148283)",
            node=spec.node.name,
            hint="set cluster.train.elastic: false, or windows: {mode: wsl} for this node",
        )
    if spec.backend != "gloo":
        raise UsageError(
            f"backend {spec.backend} is not available on native Windows: Windows torch has gloo only",
            node=spec.node.name,
            hint="set cluster.backend: gloo, or windows: {mode: wsl} for this node",
        )


def render_all(
    renderer: Renderer,
    specs: Sequence[LaunchSpec],
    platforms: Mapping[str, Platform],
    *,
    mask: bool,
    secrets: SecretMode | None = None,
) -> dict[str, str]:
    """Every node's script, to show (``mask=True``) or to write to files (``mask=False``: values as
    the inventory writes them, but a ``{from_env: NAME}`` secret is required from whoever runs the
    script, never written). ``secrets`` overrides that choice."""
    mode: SecretMode = secrets or ("mask" if mask else "reference")
    out = {}
    for spec in specs:
        out[spec.node.name] = renderer.render(spec, platforms[spec.node.name], secrets=mode)
    return out
