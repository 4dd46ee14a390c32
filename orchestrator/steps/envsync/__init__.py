"""`bootstrap sync`, environment half: the same pinned Python environment on every node, fast when
nothing changed, never half-installed.

Per node (see docs/sync.md):

1. **probe** (one round trip): the node's Python (version, wheel platform tags), uv on PATH, the
   managed venv's stamp and installed versions (offline: the node's wheelhouse listing). When the
   stamp's key equals the key the controller computes (requirements + index options + Python version
   + platform + installer setting) and the pinned versions are installed, the node is done.
2. **build** otherwise: a new venv beside the active one (a hard-link clone of it when only versions
   changed, so only changed packages move), ``pip install -r`` / ``uv pip install -r`` of the pushed
   requirements (``--require-hashes`` when the file pins hashes), the stamp, then an atomic switch of
   the stable path (a symlink) to it. A failure removes the new build: the previous venv stays active.
3. **report**: the installed versions (from the probe, or printed by the build), compared across nodes
   by :func:`orchestrator.steps.envsync.report.summarize`.
"""

from __future__ import annotations

import json
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import BootstrapError, CommandFailedError, UsageError
from orchestrator.executor import Outcome
from orchestrator.redact import mask_url_credentials
from orchestrator.steps.envsync import wheelhouse as wheelhouse_mod
from orchestrator.steps.envsync.ops import INSTALLED_MARK, BuildPlan, EnvOps, ops_for
from orchestrator.steps.envsync.report import EnvReport, NodeVersions, summarize
from orchestrator.steps.envsync.spec import (
    STAMP_NAME,
    EnvSpec,
    drift,
    env_file_text,
    env_path,
    index_environment,
    index_flags,
    python_matches,
    resolve_spec,
    stamp_key,
)
from orchestrator.steps.inspect import interpreter_for

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.transports import Transport

__all__ = [
    "EnvReport",
    "EnvSpec",
    "NodeEnv",
    "env_path",
    "plan_commands",
    "resolve_specs",
    "summarize_outcomes",
    "sync_env",
    "venv_python",
]

NOT_FOUND = 127
TAIL = 15


class EnvInstallError(CommandFailedError):
    """The installer failed on a node; ``kept`` says whether a previous environment is still active."""

    def __init__(self, message: str, *, node: str, hint: str | None, result: object, kept: bool) -> None:
        super().__init__(message, node=node, hint=hint, result=result)
        self.kept = kept


@dataclass
class Probe:
    """What the probe round trip reported, parsed."""

    data: dict[str, Any]

    @property
    def python_version(self) -> str:
        return str(self.data["python"]["version"])

    @property
    def python_path(self) -> str:
        return str(self.data["python"]["executable"])

    @property
    def platform_key(self) -> str:
        py = self.data["python"]
        return f"{py['sysconfig_platform']}-{py['implementation']}-{py['abi']}"

    @property
    def venv(self) -> dict[str, Any]:
        venv: dict[str, Any] = self.data["venv"]
        return venv

    @property
    def installed(self) -> dict[str, str] | None:
        packages = self.venv.get("packages")
        return dict(packages) if isinstance(packages, dict) else None

    @property
    def stamp(self) -> dict[str, Any]:
        stamp = self.venv.get("stamp")
        return stamp if isinstance(stamp, dict) else {}

    def target(self) -> wheelhouse_mod.Target:
        py = self.data["python"]
        impl = {"cpython": "cp", "pypy": "pp"}.get(py["implementation"], "cp")
        return wheelhouse_mod.Target(
            python=".".join(self.python_version.split(".")[:2]),
            implementation=impl,
            abi=py["abi"],
            platforms=tuple(py["platforms"]),
        )


@dataclass
class NodeEnv:
    """A node's environment after the sync."""

    node: str
    os: str
    action: str  # unchanged | installed | updated | rebuilt | planned
    path: str  # the stable path (as configured; "~" is the node user's home)
    python_path: str  # the interpreter launch should run
    python: str  # its version
    installer: str | None  # what installed the current build (from its stamp)
    env_id: str | None
    packages: dict[str, str] = field(default_factory=dict)
    changes: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    wheels_pushed: int = 0
    round_trips: int = 1
    notes: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)  # dry run only

    def public_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "path": self.path,
            "python_path": self.python_path,
            "python": self.python,
            "installer": self.installer,
            "env_id": self.env_id,
            "packages": dict(sorted(self.packages.items())),
            "changes": {k: list(v) for k, v in sorted(self.changes.items())},
            "wheels_pushed": self.wheels_pushed,
            "round_trips": self.round_trips,
            "notes": self.notes,
            **({"commands": self.commands} if self.commands else {}),
        }


def resolve_specs(inventory: Inventory, nodes: list[Node]) -> dict[str, EnvSpec]:
    """One spec per OS among ``nodes`` (UsageError, exit 2, when the inventory's env is unusable)."""
    return {os_name: resolve_spec(inventory, os_name) for os_name in sorted({n.os for n in nodes})}


def venv_python(node: Node, inventory: Inventory) -> str:
    """The interpreter inside the node's synced venv (for launch): ``<env.path>/bin/python`` on Linux
    (``<env.path>\\Scripts\\python.exe`` on Windows); ``~`` means the login user's home."""
    path = env_path(node, path_setting=inventory.cluster.env.path)
    if node.os == "windows":
        return path.rstrip("/\\") + "\\Scripts\\python.exe"
    return path.rstrip("/") + "/bin/python"


def _probe_args(spec: EnvSpec, path: str) -> dict[str, object]:
    args: dict[str, object] = {"path": path, "stamp": STAMP_NAME, "wheelhouse": None}
    if spec.offline:
        args["wheelhouse"] = path.rstrip("/\\") + ".wheels"
        args["create_wheelhouse"] = False
    return args


def probe(node: Node, transport: Transport, spec: EnvSpec, ops: EnvOps) -> Probe:
    """The one round trip: parse the node's report or raise a clear error."""
    interpreter = interpreter_for(node)
    result = transport.run(ops.probe(interpreter, _probe_args(spec, env_path(node, spec))), timeout=120)
    if result.exit_code == NOT_FOUND:
        raise CommandFailedError(
            f"Python interpreter {interpreter!r} not found",
            node=node.name,
            hint="install Python 3 on the node, or set python: (path of the interpreter) on the node",
            result=result,
        )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if not result.ok or not lines:
        tail = " | ".join(result.tail(3)) or f"exit code {result.exit_code}"
        raise CommandFailedError(f"the environment probe failed: {tail}", node=node.name, result=result)
    return Probe(json.loads(lines[-1]))


def _unchanged(spec: EnvSpec, found: Probe, key: str, force: bool) -> bool:
    installed = found.installed
    if force or installed is None or found.stamp.get("key") != key:
        return False
    return not drift(spec, installed).wrong


def _choose_installer(node: Node, spec: EnvSpec, found: Probe) -> tuple[str, str | None]:
    uv = found.data.get("uv")
    if spec.installer == "uv" and not uv:
        raise UsageError(
            "env.installer is uv, but uv is not on PATH on this node",
            node=node.name,
            hint="install uv there (https://docs.astral.sh/uv/), or set env.installer: auto",
        )
    if spec.installer != "pip" and uv:
        return "uv", str(uv)
    return "pip", None


def _check_node(node: Node, spec: EnvSpec, found: Probe) -> None:
    if not python_matches(spec.python_wanted, found.python_version):
        raise CommandFailedError(
            f"Python {found.python_version} ({found.python_path}), but cluster.env.python wants "
            f"{spec.python_wanted}",
            node=node.name,
            hint=f"install Python {spec.python_wanted} there and set python: (its path) on the node",
        )
    state = found.venv.get("state")
    if state in ("dir", "other"):
        raise UsageError(
            f"{found.venv.get('path')} exists and was not made by bootstrap sync (not a symlink to a build)",
            node=node.name,
            hint="move it away, or choose another place with cluster.env.path",
        )


def plan_build(
    node: Node,
    spec: EnvSpec,
    found: Probe,
    key: str,
    *,
    force: bool,
    installer: tuple[str, str | None],
    index_args: list[str],
    index_env: dict[str, str] | None = None,
    remove_wheels: tuple[str, ...] = (),
    path: str | None = None,
    supports_clone: bool = True,
) -> BuildPlan:
    """The build for a node whose stamp differs (or --force)."""
    build_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
    stamp_names = set(found.stamp.get("names") or [])
    clone = (
        supports_clone
        and not force
        and found.venv.get("state") == "link"
        and found.installed is not None
        and found.stamp.get("python") == found.python_version
        and stamp_names <= spec.names  # a package left the list: start fresh, nothing stale stays
    )
    stamp: dict[str, object] = {
        "key": key,
        "id": build_id,
        "python": found.python_version,
        "platform": found.platform_key,
        "installer": installer[0],
        "names": sorted(spec.names),
        "source": spec.source,
        "offline": spec.offline,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return BuildPlan(
        interpreter=interpreter_for(node),
        path=path or env_path(node, spec),
        pip_runner=_pip_runner(found),
        pip_wheel=found.data["python"].get("pip_wheel"),
        build_id=build_id,
        clone=bool(clone),
        installer=installer[0],
        uv=installer[1],
        index_args=tuple(index_args),
        index_env=tuple(sorted((index_env or {}).items())),
        require_hashes=spec.hashes,
        stamp=stamp,
        offline=spec.offline,
        remove_wheels=remove_wheels,
    )


def _pip_runner(found: Probe) -> str:
    """The node's own pip when it has ``--python`` (22.3+), else a pip wheel shipped with Python,
    else ensurepip inside the venv (slow: seconds per venv)."""
    py = found.data["python"]
    version = str(py.get("pip") or "")
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        major, minor = 0, 0
    if (major, minor) >= (22, 3):
        return "base"
    if py.get("pip_wheel"):
        return "wheel"
    return "venv"


def _installed_from(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(INSTALLED_MARK):
            data: dict[str, Any] = json.loads(line[len(INSTALLED_MARK) :])
            return data
    return None


Change = tuple[str | None, str | None]


def _changes(before: dict[str, str] | None, after: dict[str, str]) -> dict[str, Change]:
    before = before or {}
    out: dict[str, Change] = {}
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            out[name] = (before.get(name), after.get(name))
    return out


def _push_wheels(
    node: Node, transport: Transport, spec: EnvSpec, found: Probe, plan_path: str
) -> tuple[int, tuple[str, ...], list[str]]:
    """Offline: fill the controller's wheelhouse for this node's platform, push what the node lacks."""
    house = wheelhouse_mod.fill(spec, found.target())
    remote_listing: dict[str, str] = dict((found.data.get("wheelhouse") or {}).get("files") or {})
    wheels_dir = plan_path.rstrip("/\\") + ".wheels"
    pushed = 0
    for name, digest in sorted(house.files.items()):
        if remote_listing.get(name) == digest:
            continue
        transport.put(house.directory / name, transport.platform.transfer_path(f"{wheels_dir}/{name}"))
        pushed += 1
    stale = tuple(sorted(n for n in remote_listing if n not in house.files))
    notes = [f"wheelhouse {house.directory} ({'downloaded' if house.downloaded else 'reused'})"]
    return pushed, stale, notes


def sync_node(
    node: Node,
    transport: Transport,
    spec: EnvSpec,
    *,
    force: bool = False,
    on_line: Callable[[str, str], None] | None = None,
) -> NodeEnv:
    """Probe, and when needed build and switch, one node's environment."""
    try:
        ops = ops_for(transport.platform)
    except NotImplementedError as exc:
        raise UsageError(str(exc), node=node.name) from None
    path = env_path(node, spec)
    found = probe(node, transport, spec, ops)
    _check_node(node, spec, found)
    key = stamp_key(spec, python_version=found.python_version, platform=found.platform_key)
    venv_interpreter = ops.venv_python(path)
    if _unchanged(spec, found, key, force):
        return NodeEnv(
            node=node.name,
            os=node.os,
            action="unchanged",
            path=path,
            python_path=venv_interpreter,
            python=str(found.venv.get("python") or found.python_version),
            installer=found.stamp.get("installer"),
            env_id=found.stamp.get("id"),
            packages=found.installed or {},
        )
    if not found.data["python"].get("venv_module"):
        raise CommandFailedError(
            f"{found.python_path} cannot create virtual environments (no venv/ensurepip module)",
            node=node.name,
            hint="Debian/Ubuntu: apt-get install python3-venv (or python3.X-venv for that version)",
        )
    installer = _choose_installer(node, spec, found)
    round_trips = 1
    notes: list[str] = []
    pushed = 0
    stale: tuple[str, ...] = ()
    index_env: dict[str, str] = {}
    if spec.offline:
        # the node's absolute path (the probe expanded "~"): pip takes --find-links literally. Our
        # own directory, no login in it; the inventory's locations were for this machine's download
        index_args = ["--no-index", "--find-links", str(found.venv["path"]).rstrip("/\\") + ".wheels"]
    else:
        index_args = index_flags(spec)
        index_env = index_environment(spec, installer[0])
    plan = plan_build(
        node,
        spec,
        found,
        key,
        force=force,
        installer=installer,
        index_args=index_args,
        index_env=index_env,
        path=str(found.venv["path"]) if ops.absolute_paths else path,
        supports_clone=ops.supports_clone,
    )
    prepared = transport.run(ops.prepare(plan), timeout=60)
    round_trips += 1
    if not prepared.ok:
        tail = " | ".join(prepared.tail(3))
        message = f"cannot create {plan.versions_dir}: {tail}"
        raise CommandFailedError(message, node=node.name, result=prepared)
    if spec.offline:
        pushed, stale, notes = _push_wheels(node, transport, spec, found, plan.path)
        plan = BuildPlan(**{**plan.__dict__, "remove_wheels": stale})
    with tempfile.TemporaryDirectory(prefix="cb-env-") as tmp:
        # owner-only, both: a requirements file may name an index with its login, the index
        # settings hold them (the build script reads and deletes that file before installing)
        local = Path(tmp) / "requirements.txt"
        local.write_text(spec.requirements_text, encoding="utf-8")
        transport.put(local, transport.platform.transfer_path(plan.requirements_file), mode=0o600)
        if plan.index_env_file:
            settings = Path(tmp) / "index.env"
            settings.write_text(env_file_text(dict(plan.index_env)), encoding="utf-8")
            transport.put(settings, transport.platform.transfer_path(plan.index_env_file), mode=0o600)

    def forward(stream: str, line: str) -> None:
        if on_line is not None and not line.startswith(INSTALLED_MARK):
            on_line(node.name, mask_url_credentials(line))

    result = transport.run(ops.build(plan), timeout=3600, on_line=forward, keep_lines=400)
    round_trips += 1
    listing = _installed_from(result.stdout)
    if result.ok and listing is None:
        raise CommandFailedError(
            f"the new environment is active at {path}, but listing its packages failed",
            node=node.name,
            hint=f"run {venv_interpreter} -m pip list on the node to see why",
            result=result,
        )
    if not result.ok or listing is None:
        had_env = found.venv.get("state") == "link" and found.installed is not None
        kept = (
            f"the previous environment ({found.stamp.get('id') or 'unstamped'}) is still active at {path}"
            if had_env
            else "no environment was installed"
        )
        last = [
            line.strip()
            for line in result.tail(TAIL)
            if line.strip() and not line.startswith("cluster-bootstrap:")
        ]
        errors = [line for line in last if "error" in line.lower()]
        why = (errors or last or [f"exit code {result.exit_code}"])[-1]
        raise EnvInstallError(
            f"{installer[0]} install failed ({why}); {kept}",
            node=node.name,
            hint="fix the requirements or the index settings and run bootstrap sync again",
            result=result,
            kept=had_env,
        )
    packages = dict(listing.get("packages") or {})
    if plan.clone:
        action = "updated"
    elif found.venv.get("state") == "link":
        action = "rebuilt"
    else:
        action = "installed"
    if plan.clone:
        notes.append(f"cloned from {found.stamp.get('id')}")
    return NodeEnv(
        node=node.name,
        os=node.os,
        action=action,
        path=path,
        python_path=venv_interpreter,
        python=str(listing.get("python") or found.python_version),
        installer=installer[0],
        env_id=plan.build_id,
        packages=packages,
        changes=_changes(found.installed, packages),
        wheels_pushed=pushed,
        round_trips=round_trips,
        notes=notes,
    )


def plan_commands(node: Node, transport: Transport, spec: EnvSpec, *, force: bool = False) -> list[str]:
    """What a sync runs on ``node`` (for --dry-run): the probe, then the build it runs when the
    stamp differs (shown as a fresh build; a clone replaces ``python -m venv`` when only versions
    changed). Uploads are listed as comments."""
    ops = ops_for(transport.platform)
    path = env_path(node, spec)
    wrap = transport.platform.wrap
    commands = [wrap(ops.probe(interpreter_for(node), _probe_args(spec, path)))]
    installer = "uv" if spec.installer == "uv" else "pip"
    offline = ["--no-index", "--find-links", path.rstrip("/\\") + ".wheels"]
    index_args = offline if spec.offline else index_flags(spec)
    index_env = {} if spec.offline else index_environment(spec, installer)
    plan = BuildPlan(
        interpreter=interpreter_for(node),
        path=path,
        build_id="BUILD-ID",
        clone=False,
        installer=installer,
        uv="uv" if spec.installer == "uv" else None,
        index_args=tuple(index_args),
        index_env=tuple(sorted(index_env.items())),
        require_hashes=spec.hashes,
        stamp={"key": "KEY", "id": "BUILD-ID"},
        offline=spec.offline,
        pip_runner="base",  # shown as the common case: the node's own pip 22.3+ (see _pip_runner)
    )
    commands.append(f"# only when the stamp differs{' or --force' if not force else ''}:")
    commands.append(wrap(ops.prepare(plan)))
    if spec.offline:
        commands.append(f"# upload: wheels this node lacks -> {plan.wheelhouse}/")
    commands.append(f"# upload (owner-only): {spec.source} -> {plan.requirements_file}")
    if plan.index_env_file:
        # what the installer's environment gets, logins masked (one line per variable)
        settings = mask_url_credentials(env_file_text(index_env)).splitlines()
        commands.append(f"# upload (owner-only): index settings -> {plan.index_env_file}")
        commands.extend(f"#   {line}" for line in settings)
    commands.append(wrap(ops.build(plan)))
    return commands


def sync_env(
    session: Session,
    inventory: Inventory,
    nodes: list[Node] | None = None,
    *,
    dry_run: bool = False,
    force: bool = False,
    on_line: Callable[[str, str], None] | None = None,
) -> list[Outcome[NodeEnv]]:
    """Sync every node's environment in parallel (the pipeline's entry point).

    Returns ``[]`` when the inventory declares no environment. Raises UsageError (exit 2) before
    contacting any node when ``cluster.env`` is unusable; per-node failures are in the outcomes.
    With ``dry_run`` nothing is contacted: each outcome's value holds the commands. Compare the
    result with :func:`summarize_outcomes` (``.mismatch``: the environments differ, fail the run).
    """
    chosen = list(session.nodes if nodes is None else nodes)
    if not inventory.cluster.env.declared:
        return []  # no cluster.env: nothing to install (the pipeline goes on with the nodes' Python)
    specs = resolve_specs(inventory, chosen)
    if dry_run:
        outcomes: list[Outcome[NodeEnv]] = []
        for node in chosen:
            transport = session.transport(node)
            value = NodeEnv(
                node=node.name,
                os=node.os,
                action="planned",
                path=env_path(node, specs[node.os]),
                python_path=venv_python(node, inventory),
                python="",
                installer=None,
                env_id=None,
                round_trips=0,
                commands=plan_commands(node, transport, specs[node.os], force=force),
            )
            outcomes.append(Outcome(node.name, value, None, 0.0))
        return outcomes
    return session.map(
        lambda node, transport: sync_node(node, transport, specs[node.os], force=force, on_line=on_line),
        step="env",
        nodes=chosen,
    )


def summarize_outcomes(outcomes: list[Outcome[NodeEnv]]) -> EnvReport:
    """Distinct environments among the nodes that synced (failed nodes have none to compare)."""
    envs = [
        NodeVersions(o.value.node, o.value.os, o.value.python, o.value.packages)
        for o in outcomes
        if o.value is not None and o.value.action != "planned"
    ]
    return summarize(envs)


def failed_errors(outcomes: list[Outcome[NodeEnv]]) -> list[BootstrapError]:
    return [o.error for o in outcomes if o.error is not None]
