"""Round trip 1 of an environment sync: what a node has, and whether it is done.

:func:`probe_node` runs the probe (``env_probe.py``, one round trip) and parses its report into a
:class:`Probe`: the node's Python, uv, the managed venv's stamp and installed versions. A node whose
stamp key matches and whose pinned versions are installed is done (``Probed.env``); any other node
goes on to the build (orchestrator/steps/envsync/build.py) with what it needs in :class:`Probed`.

The probe also leaves this sync's marker beside the environment; a build's plan reads the markers
first (build.py), so that nodes sharing one directory (NFS home, shared disk) are stopped before
they install anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orchestrator.steps.envsync.wheelhouse as wheelhouse_mod
from orchestrator.errors import CommandFailedError, UnsafeDirectoryError, UsageError
from orchestrator.facts.interpreter import interpreter_for
from orchestrator.redact import mask_url_credentials
from orchestrator.steps.envsync.ops import EnvOps, ops_for
from orchestrator.steps.envsync.report import NodeEnv
from orchestrator.steps.envsync.spec import (
    FORMAT,
    STAMP_NAME,
    EnvSpec,
    drift,
    env_path,
    index_locations,
    python_matches,
    stamp_key,
)

if TYPE_CHECKING:
    from orchestrator.inventory import Node
    from orchestrator.transports import Transport

NOT_FOUND = 127


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
    def index_problem(self) -> str | None:
        """Why this node cannot reach its package index (``URL: reason``), or None: it can, or the
        probe did not ask (offline, no_index, a current stamp)."""
        failed = (self.data.get("index") or {}).get("failed") or []
        if not failed:
            return None
        first = failed[0]
        return f"{mask_url_credentials(str(first.get('url')))}: {first.get('error')}"

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


#: seconds a node is given to answer whether it reaches its package index (the probe's other work
#: runs meanwhile: a node that reaches it answers in a fraction of that)
INDEX_TIMEOUT = 4.0


def probe_args(
    spec: EnvSpec,
    path: str,
    marker: dict[str, str] | None = None,
    *,
    force: bool = False,
    check_index: bool = True,
) -> dict[str, object]:
    """The probe's argument. ``marker``: leave this sync's marker (a write); ``check_index``: ask
    whether the node reaches its package index (a request to it). A dry run asks for neither."""
    # the environment's path, walked first whatever the number of nodes (the marker's own walk rides
    # only with several): the directory it, its builds and its wheels go in, and the environment
    # itself when it is there (a link planted in a sticky /tmp: its interpreter is never run)
    args: dict[str, object] = {
        "path": path,
        "stamp": STAMP_NAME,
        "wheelhouse": None,
        "safe": path,
    }
    if spec.offline or spec.offline_fallback:
        # offline_fallback: listed when a earlier sync left one, so only missing wheels travel
        args["wheelhouse"] = path.rstrip("/\\") + ".wheels"
        args["create_wheelhouse"] = False
    if marker is not None:
        args["marker"] = marker
    urls, node_default = index_locations(spec)
    if check_index and (urls or node_default):
        check: dict[str, object] = {"urls": urls, "node_default": node_default, "timeout": INDEX_TIMEOUT}
        if not force:  # a current stamp: nothing to install, no index needed (the probe compares)
            check["unless"] = {"format": FORMAT, "specs": [s.digest for s in accepted_specs(spec)]}
        args["index"] = check
    return args


def accepted_specs(spec: EnvSpec) -> list[EnvSpec]:
    """The specs whose builds count as current: ``spec``, and with ``offline_fallback`` the same set
    installed from pushed wheels (a node that reached no index the last time)."""
    return [spec, offline_variant(spec)] if spec.offline_fallback else [spec]


def offline_variant(spec: EnvSpec) -> EnvSpec:
    return replace(spec, offline=True, offline_fallback=False)


def _marker(node: Node, path: str, token: str) -> dict[str, str]:
    """The probe's marker (steps/preflight/shared_fs.py): this node's name and this sync's token, in
    the directory holding the environment, so that nodes sharing that directory find each other."""
    from orchestrator.steps.preflight.shared_fs import MARKER_DIR

    return {"dir": env_parent(path), "name": node.name, "token": token, "marker_dir": MARKER_DIR}


def env_parent(path: str) -> str:
    """The directory holding the environment ``path`` (``~`` stays for the node to expand)."""
    parent = path.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[0]
    return parent if parent and parent != path.rstrip("/\\") else "."


def probe(
    node: Node,
    transport: Transport,
    spec: EnvSpec,
    ops: EnvOps,
    marker: dict[str, str] | None = None,
    *,
    force: bool = False,
    check_index: bool = True,
) -> Probe:
    """The one round trip: parse the node's report or raise a clear error."""
    interpreter = interpreter_for(node)
    args = probe_args(spec, env_path(node, spec), marker, force=force, check_index=check_index)
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


def _unchanged(spec: EnvSpec, found: Probe, keys: list[str], force: bool) -> bool:
    installed = found.installed
    if force or installed is None or found.stamp.get("key") not in keys:
        return False
    return not drift(spec, installed).wrong


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
    #: what the build installs from: the sync's spec, or its offline variant for a node that reaches
    #: no index (``offline_reason`` says why)
    spec: EnvSpec | None = None
    offline_reason: str | None = None


def probe_node(
    node: Node,
    transport: Transport,
    spec: EnvSpec,
    *,
    force: bool = False,
    token: str | None = None,
    check_index: bool = True,
    progress: Callable[[str, str], None] = lambda activity, detail: None,
) -> Probed:
    """Round trip 1: what the node has; an unchanged node is done here. ``token``: write this sync's
    marker beside the environment (the build then looks for other nodes' markers there);
    ``check_index``: ask whether the node reaches its index (off: a dry run, which assumes it does)."""
    try:
        ops = ops_for(transport.platform)
    except NotImplementedError as exc:
        raise UsageError(str(exc), node=node.name) from None
    path = env_path(node, spec)
    progress("checking the environment", "")
    marker = _marker(node, path, token) if token is not None else None
    found = probe(node, transport, spec, ops, marker, force=force, check_index=check_index)
    if isinstance(unsafe := found.data.get("unsafe"), str):  # a directory another user can change
        raise UnsafeDirectoryError(unsafe, node=node.name, hint="nothing was installed there")
    _check_node(node, spec, found)
    keys = [
        stamp_key(s, python_version=found.python_version, platform=found.platform_key)
        for s in accepted_specs(spec)
    ]
    key = keys[0]
    marker_error = (found.data.get("marker") or {}).get("error") if marker is not None else None
    if isinstance(marker_error, str) and marker_error.startswith("refusing "):
        # a directory another user can change: what is built there could be changed under the ranks
        raise UnsafeDirectoryError(marker_error, node=node.name, hint="nothing was installed there")
    probed = Probed(found=found, key=key, ops=ops, path=path, marker_error=marker_error, spec=spec)
    unreachable = found.index_problem
    if _unchanged(spec, found, keys, force):
        unreachable = None  # installs nothing: no index needed
    elif unreachable is not None and spec.offline_fallback:
        probed.spec = offline_variant(spec)
        probed.key = stamp_key(probed.spec, python_version=found.python_version, platform=found.platform_key)
        probed.offline_reason = unreachable
    elif unreachable is not None:
        raise CommandFailedError(
            f"cannot reach the package index ({unreachable}): nothing was installed",
            node=node.name,
            hint="set env.offline: true to have this machine download the wheels and push them, or "
            "env.index_url to an index the nodes reach (docs/sync.md)",
        )
    if _unchanged(spec, found, keys, force):
        probed.env = NodeEnv(
            node=node.name,
            os=node.python_os,
            action="unchanged",
            path=path,
            python_path=ops.venv_python(path),
            python=str(found.venv.get("python") or found.python_version),
            installer=found.stamp.get("installer"),
            env_id=found.stamp.get("id"),
            packages=found.installed or {},
        )
    return probed
