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

from orchestrator.errors import CommandFailedError, UsageError
from orchestrator.executor import Outcome
from orchestrator.facts.interpreter import interpreter_for
from orchestrator.redact import mask_url_credentials
from orchestrator.steps.envsync import wheelhouse as wheelhouse_mod
from orchestrator.steps.envsync.ops import INSTALLED_MARK, BuildPlan, EnvOps, ops_for, probe_code
from orchestrator.steps.envsync.progress import STEP_MARK, InstallProgress, human_size
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


def _probe_args(spec: EnvSpec, path: str, marker: dict[str, str] | None = None) -> dict[str, object]:
    args: dict[str, object] = {"path": path, "stamp": STAMP_NAME, "wheelhouse": None}
    if spec.offline:
        args["wheelhouse"] = path.rstrip("/\\") + ".wheels"
        args["create_wheelhouse"] = False
    if marker is not None:
        args["marker"] = marker
    return args


def _marker(node: Node, path: str, token: str) -> dict[str, str]:
    """The probe's marker (steps/preflight/shared_fs.py): this node's name and this sync's token, in
    the directory holding the environment, so that nodes sharing that directory find each other."""
    from orchestrator.steps.preflight.shared_fs import MARKER_DIR

    return {"dir": _env_parent(path), "name": node.name, "token": token, "marker_dir": MARKER_DIR}


def _env_parent(path: str) -> str:
    """The directory holding the environment ``path`` (``~`` stays for the node to expand)."""
    parent = path.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[0]
    return parent if parent and parent != path.rstrip("/\\") else "."


def probe(
    node: Node, transport: Transport, spec: EnvSpec, ops: EnvOps, marker: dict[str, str] | None = None
) -> Probe:
    """The one round trip: parse the node's report or raise a clear error."""
    interpreter = interpreter_for(node)
    args = _probe_args(spec, env_path(node, spec), marker)
    result = transport.run(ops.probe(interpreter, args), timeout=120)
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
        progress_bar="raw" if _pip_reports_bytes(found) else "off",
    )


def _version_tuple(version: str) -> tuple[int, int]:
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return 0, 0
    return major, minor


def _pip_reports_bytes(found: Probe) -> bool:
    """pip 24.1+ prints ``Progress DONE of TOTAL`` lines while it downloads (``--progress-bar raw``):
    the bytes of the progress display. Older pips do not know the option."""
    py = found.data["python"]
    runner = _pip_runner(found)
    if runner == "base":
        version = str(py.get("pip") or "")
    elif runner == "wheel":
        version = Path(str(py.get("pip_wheel") or "")).name.split("-")[1:2][0] if py.get("pip_wheel") else ""
    else:
        return False
    return _version_tuple(version) >= (24, 1)


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
    node: Node,
    transport: Transport,
    spec: EnvSpec,
    found: Probe,
    plan_path: str,
    progress: Callable[[str, str], None] = lambda activity, detail: None,
) -> tuple[int, tuple[str, ...], list[str]]:
    """Offline: fill the controller's wheelhouse for this node's platform, push what the node lacks."""
    progress("downloading wheels on this machine", "")
    house = wheelhouse_mod.fill(spec, found.target())
    remote_listing: dict[str, str] = dict((found.data.get("wheelhouse") or {}).get("files") or {})
    wheels_dir = plan_path.rstrip("/\\") + ".wheels"
    pushed = 0
    missing = [(n, d) for n, d in sorted(house.files.items()) if remote_listing.get(n) != d]
    sizes = {n: (house.directory / n).stat().st_size for n, _ in missing}
    total, sent = sum(sizes.values()), 0
    for index, (name, _digest) in enumerate(missing, start=1):
        progress(
            f"uploading wheels ({index} of {len(missing)})",
            f"{human_size(sent)} of {human_size(total)} sent",
        )
        transport.put(house.directory / name, transport.platform.transfer_path(f"{wheels_dir}/{name}"))
        sent += sizes[name]
        pushed += 1
    stale = tuple(sorted(n for n in remote_listing if n not in house.files))
    notes = [f"wheelhouse {house.directory} ({'downloaded' if house.downloaded else 'reused'})"]
    return pushed, stale, notes


#: (node, activity, detail): what a node's sync is doing now, for the progress display
ProgressFn = Callable[[str, str, str], None]


class EnvSharedError(CommandFailedError):
    """Nodes would build their environments in one directory (a shared filesystem)."""

    def __init__(self, message: str, *, node: str, hint: str, shared_with: list[str], directory: str) -> None:
        super().__init__(message, node=node, hint=hint)
        self.shared_with = shared_with
        self.directory = directory


@dataclass
class Probed:
    """A node after its probe: done (``env``: unchanged), or what its build needs."""

    found: Probe
    key: str
    ops: EnvOps
    path: str
    env: NodeEnv | None = None  # set when nothing is to be built
    marker_error: str | None = None


def probe_node(
    node: Node,
    transport: Transport,
    spec: EnvSpec,
    *,
    force: bool = False,
    token: str | None = None,
    progress: Callable[[str, str], None] = lambda activity, detail: None,
) -> Probed:
    """Round trip 1: what the node has; an unchanged node is done here. ``token``: write this sync's
    marker beside the environment (the build then looks for other nodes' markers there)."""
    try:
        ops = ops_for(transport.platform)
    except NotImplementedError as exc:
        raise UsageError(str(exc), node=node.name) from None
    path = env_path(node, spec)
    progress("checking the environment", "")
    marker = _marker(node, path, token) if token is not None else None
    found = probe(node, transport, spec, ops, marker)
    _check_node(node, spec, found)
    key = stamp_key(spec, python_version=found.python_version, platform=found.platform_key)
    marker_error = (found.data.get("marker") or {}).get("error") if marker is not None else None
    probed = Probed(found=found, key=key, ops=ops, path=path, marker_error=marker_error)
    if _unchanged(spec, found, key, force):
        probed.env = NodeEnv(
            node=node.name,
            os=node.os,
            action="unchanged",
            path=path,
            python_path=ops.venv_python(path),
            python=str(found.venv.get("python") or found.python_version),
            installer=found.stamp.get("installer"),
            env_id=found.stamp.get("id"),
            packages=found.installed or {},
        )
    return probed


def refuse_shared(node: Node, transport: Transport, probed: Probed, tokens: dict[str, str]) -> None:
    """Before a build: another node of this sync whose marker is beside this environment shares the
    directory (NFS home, shared disk). Building would delete its builds and it ours: refuse, saying
    so (the installer's errors would otherwise blame the requirements or the index)."""
    from orchestrator.steps.preflight.shared_fs import fix_text, read_markers, sharing

    if probed.marker_error:
        return  # no marker there: nothing to compare (the build reports what is wrong with the path)
    directory = _env_parent(probed.path)
    seen = read_markers(node, transport, [directory]).get(directory, {})
    others = sharing(node.name, seen, tokens)
    if others:
        where = str((probed.found.data.get("marker") or {}).get("path") or directory)
        raise EnvSharedError(
            f"{where} is the same directory on {', '.join(others)} (a shared filesystem: NFS home, "
            "shared disk): building here would delete their environments and they this one's; "
            "nothing was installed",
            node=node.name,
            hint=fix_text() + ", then run bootstrap sync again",
            shared_with=others,
            directory=where,
        )


def build_node(
    node: Node,
    transport: Transport,
    spec: EnvSpec,
    probed: Probed,
    *,
    force: bool = False,
    on_line: Callable[[str, str], None] | None = None,
    progress: Callable[[str, str], None] = lambda activity, detail: None,
) -> NodeEnv:
    """Round trips 2 and 3: a new venv beside the active one, installed, stamped, switched to."""
    found, key, ops, path = probed.found, probed.key, probed.ops, probed.path
    venv_interpreter = ops.venv_python(path)
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
    progress("preparing the build", "")
    prepared = transport.run(ops.prepare(plan), timeout=60)
    round_trips += 1
    if not prepared.ok:
        tail = " | ".join(prepared.tail(3))
        message = f"cannot create {plan.versions_dir}: {tail}"
        raise CommandFailedError(message, node=node.name, result=prepared)
    if spec.offline:
        pushed, stale, notes = _push_wheels(node, transport, spec, found, plan.path, progress)
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

    tracker = InstallProgress("creating the environment")
    progress("creating the environment", "")

    def forward(stream: str, line: str) -> None:
        if line.startswith(INSTALLED_MARK):
            return
        tracker.feed(line)
        snapshot = tracker.snapshot()
        progress(snapshot.activity, snapshot.detail())
        if on_line is not None and not line.startswith(STEP_MARK) and not _is_raw_progress(line):
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
        last = [line.strip() for line in installer_tail(result.tail(TAIL * 4))[-TAIL:] if line.strip()]
        last = [line for line in last if not line.startswith("cluster-bootstrap:")]
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


def _is_raw_progress(line: str) -> bool:
    """pip's ``--progress-bar raw`` counter line."""
    return line.startswith("Progress ") and " of " in line


def installer_tail(lines: list[str]) -> list[str]:
    """The build's last lines without our step marks and pip's raw progress counters (what a user
    reads after a failure)."""
    return [line for line in lines if not line.startswith(STEP_MARK) and not _is_raw_progress(line)]


def sync_node(
    node: Node,
    transport: Transport,
    spec: EnvSpec,
    *,
    force: bool = False,
    on_line: Callable[[str, str], None] | None = None,
) -> NodeEnv:
    """Probe, and when needed build and switch, one node's environment (no other node involved)."""
    probed = probe_node(node, transport, spec, force=force)
    if probed.env is not None:
        return probed.env
    return build_node(node, transport, spec, probed, force=force, on_line=on_line)


#: stands for the probe's text in --dry-run commands (the script is printed once, before them)
PROBE_PLACEHOLDER = "<env_probe.py, printed once above>"


def plan_commands(node: Node, transport: Transport, spec: EnvSpec, *, force: bool = False) -> list[str]:
    """What a sync runs on ``node`` (for --dry-run): the probe, then the build it runs when the
    stamp differs (shown as a fresh build; a clone replaces ``python -m venv`` when only versions
    changed). Uploads are listed as comments."""
    ops = ops_for(transport.platform)
    path = env_path(node, spec)
    wrap = transport.platform.wrap
    marker = {
        "dir": _env_parent(path),
        "name": node.name,
        "token": "TOKEN",
        "marker_dir": ".cluster-bootstrap-nodes",
    }
    # the probe's text is the same for every node: shown once (probe_script), named here
    probe_command = ops.probe(interpreter_for(node), _probe_args(spec, path, marker), code=PROBE_PLACEHOLDER)
    commands = [wrap(probe_command)]
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
    commands.append(
        f"# first: the markers in {_env_parent(path)}/.cluster-bootstrap-nodes/ are read; another node's "
        "marker of this sync there (a shared directory) stops this node before it installs anything"
    )
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
    on_progress: ProgressFn | None = None,
    specs: dict[str, EnvSpec] | None = None,
) -> list[Outcome[NodeEnv]]:
    """Sync every node's environment in parallel (the pipeline's entry point).

    Returns ``[]`` when the inventory declares no environment and no ``specs`` are given (``specs``:
    one per OS, e.g. the master's environment: orchestrator/steps/envsync/master.py). Raises
    UsageError (exit 2) before contacting any node when ``cluster.env`` is unusable; per-node failures
    are in the outcomes. With ``dry_run`` nothing is contacted: each outcome's value holds the
    commands (the probe script itself is :func:`probe_script`, the same for every node). Compare the
    result with :func:`summarize_outcomes` (``.mismatch``: the environments differ, fail the run).

    Every node is probed first (one round trip: an unchanged node is done), then the nodes to build
    are built. Between the two, every probe has left this sync's marker beside its environment: a node
    finding another's (a shared directory) is refused before it installs anything (:func:`refuse_shared`).
    ``on_progress(node, activity, detail)`` is called from worker threads as each node moves on.
    """
    chosen = list(session.nodes if nodes is None else nodes)
    if specs is None:
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
                python_path=_ops_venv_python(transport, env_path(node, specs[node.os])),
                python="",
                installer=None,
                env_id=None,
                round_trips=0,
                commands=plan_commands(node, transport, specs[node.os], force=force),
            )
            outcomes.append(Outcome(node.name, value, None, 0.0))
        return outcomes
    chosen_specs = specs
    tokens = {n.name: new_marker_token() for n in chosen} if len(chosen) > 1 else {}

    def reporter(node: Node) -> Callable[[str, str], None]:
        def report(activity: str, detail: str) -> None:
            if on_progress is not None:
                on_progress(node.name, activity, detail)

        return report

    probed = session.map(
        lambda node, transport: probe_node(
            node,
            transport,
            chosen_specs[node.os],
            force=force,
            token=tokens.get(node.name),
            progress=reporter(node),
        ),
        step="env check",
        nodes=chosen,
    )
    waiting = {o.node: o.value for o in probed if o.value is not None and o.value.env is None}

    def build(node: Node, transport: Transport) -> NodeEnv:
        ready = waiting[node.name]
        if tokens:
            refuse_shared(node, transport, ready, tokens)
        env = build_node(
            node,
            transport,
            chosen_specs[node.os],
            ready,
            force=force,
            on_line=on_line,
            progress=reporter(node),
        )
        if tokens:
            env.round_trips += 1  # the markers were read
        session.forget(node.name)  # its Python and torch changed: later phases ask for facts again
        return env

    built: dict[str, Outcome[NodeEnv]] = {}
    if waiting:
        builders = [n for n in chosen if n.name in waiting]
        built = {o.node: o for o in session.map(build, step="env build", nodes=builders)}
    merged: list[Outcome[NodeEnv]] = []
    for first in probed:
        second = built.get(first.node)
        if first.value is not None and first.value.env is not None:
            merged.append(Outcome(first.node, first.value.env, None, first.duration, first.finished))
        elif second is not None:
            merged.append(
                Outcome(
                    second.node, second.value, second.error, first.duration + second.duration, second.finished
                )
            )
        else:
            merged.append(Outcome(first.node, None, first.error, first.duration, first.finished))
    return merged


def new_marker_token() -> str:
    from orchestrator.steps.preflight.shared_fs import new_token

    return new_token()


def _ops_venv_python(transport: Transport, path: str) -> str:
    try:
        return ops_for(transport.platform).venv_python(path)
    except NotImplementedError:
        return path


def probe_script() -> tuple[str, str]:
    """(file name, text) of the environment probe every node runs first (--dry-run shows it once)."""
    return "env_probe.py", probe_code()


def summarize_outcomes(outcomes: list[Outcome[NodeEnv]]) -> EnvReport:
    """Distinct environments among the nodes that synced (failed nodes have none to compare)."""
    envs = [
        NodeVersions(o.value.node, o.value.os, o.value.python, o.value.packages)
        for o in outcomes
        if o.value is not None and o.value.action != "planned"
    ]
    return summarize(envs)
