"""The master's training environment as a lock: `bootstrap sync --from-master` and `--freeze FILE`.

A cluster without ``cluster.env`` trains with each node's own Python, and nothing makes the workers'
torch the master's. Here the master's interpreter is read (``probes/master_env.py``, one round trip)
and turned into an :class:`~orchestrator.steps.envsync.spec.EnvSpec` per node OS, which the ordinary
environment sync installs (a venv per node, stamp, unchanged = one round trip). Nothing here installs
anything itself.

**The set** (docs/sync.md): torch, then torchvision, torchaudio and numpy when the master has them, and
every installed package those require (extras left out), each pinned to the master's version. Nodes of
the master's OS get exactly that. Nodes of another OS get the packages required on every platform
(a CUDA runtime wheel or triton is required on Linux only: theirs is left to the installer).

**The build** (:func:`torch_pin`): the master's own local version label (``+cpu``, ``+cu126``,
``+rocm6.2``) is kept on nodes of its OS; another OS gets ``+cpu`` when the master's torch has no
CUDA, else ``+cuXYZ`` of the master's CUDA (never PyPI's unlabeled Linux torch, a several-GB CUDA
build, for a master that has none). A labeled pin needs PyTorch's index for that build
(``https://download.pytorch.org/whl/<label>``), written into the requirements as
``--extra-index-url``, unless ``cluster.env`` says where packages come from (``index_url`` or
``no_index``: then it must serve them).

**Where training finds it** (:func:`synced_from_master`): without ``cluster.env`` the inventory names
no venv, so this machine records which nodes a ``--from-master`` sync gave one (a small JSON file per
inventory under the state directory); check, validate and launch then run those nodes' venv. Declaring
``cluster.env`` (for instance with the file ``--freeze`` wrote) replaces the record.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import CommandFailedError, UsageError
from orchestrator.facts.interpreter import interpreter_for
from orchestrator.logs import state_dir
from orchestrator.safefiles import private_dirs, write_inside
from orchestrator.steps.envsync.spec import (
    EnvSpec,
    env_path,
    parse_requirements,
)

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.transports import Transport

#: PyTorch's own wheel index: one directory per build (cpu, cu126, rocm6.2...)
PYTORCH_INDEX = "https://download.pytorch.org/whl/"
#: packages sharing torch's local version label and its index
_TORCH_FAMILY = ("torch", "torchvision", "torchaudio")
NOT_FOUND = 127


def probe_code() -> str:
    return resources.files("orchestrator.steps.envsync.probes").joinpath("master_env.py").read_text()


def os_of(platform: str) -> str:
    """Our OS name (Node.os) for a ``sys.platform`` value."""
    if platform.startswith("win"):
        return "windows"
    if platform.startswith("linux"):
        return "linux"
    return platform  # darwin...: no node of ours runs it, every node is "another OS"


@dataclass(frozen=True)
class MasterEnv:
    """What the master's interpreter has, as ``probes/master_env.py`` printed it."""

    where: str  # "node1 (/usr/bin/python3)" or "this machine (/path/python)", for messages
    python: str
    platform: str  # sys.platform
    torch: str | None  # torch's version, local label included
    cuda: str | None  # torch.version.cuda ("12.6")
    hip: str | None  # torch.version.hip (ROCm builds)
    packages: dict[str, str] = field(default_factory=dict)  # the set: canonical name -> version
    portable: frozenset[str] = frozenset()  # those required on every platform

    @property
    def os(self) -> str:
        return os_of(self.platform)

    @classmethod
    def parse(cls, where: str, data: dict[str, Any], node: str | None = None) -> MasterEnv:
        """What the master's probe answered, each value checked for what it must be (a package
        name, a version, a Python version): they become lines of the requirements every other node
        installs, so a master that is not what it seems (its interpreter or site-packages changed by
        someone) cannot add a line of its own there (``--index-url``, ``name @ URL``). Refused whole
        (CommandFailedError naming ``node``): nothing is written or installed from it."""
        torch = data.get("torch") or {}

        def checked(value: object, pattern: re.Pattern[str], what: str) -> str:
            text = str(value)
            if not pattern.fullmatch(text):
                raise CommandFailedError(
                    f"the master's Python ({where}) reported {what} {text[:80]!r}, which is no {what}: "
                    "nothing was written or installed from its answer",
                    node=node,
                    hint="check that interpreter and its site-packages on the master: they are not as "
                    "pip leaves them",
                )
            return text

        packages = {
            checked(name, _NAME, "package name"): checked(version, _VERSION, "version")
            for name, version in (data.get("packages") or {}).items()
        }
        version = torch.get("version")
        return cls(
            where=where,
            python=checked(data.get("python") or "", _PYTHON, "Python version"),
            platform=str(data.get("platform") or ""),
            torch=None if version is None else checked(version, _VERSION, "version"),
            cuda=None if torch.get("cuda") is None else checked(torch["cuda"], _VERSION, "version"),
            hip=None if torch.get("hip") is None else checked(torch["hip"], _VERSION, "version"),
            packages=packages,
            portable=frozenset(str(name) for name in data.get("portable") or () if str(name) in packages),
        )


#: a distribution name (PEP 508), a version (PEP 440's characters: public and local parts, no spaces,
#: no markers, no URLs) and a Python version as the probe reports it (platform.python_version())
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_VERSION = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.!+_-]*[A-Za-z0-9])?")
_PYTHON = re.compile(r"|\d+\.\d+(?:\.\d+)?[A-Za-z0-9+.]*")


def _label(version: str) -> str:
    return version.partition("+")[2]


def build_label(master: MasterEnv, node_os: str) -> str:
    """The local version label torch (and torchvision, torchaudio) get on nodes of ``node_os``: the
    master's own on its OS; elsewhere the master's CUDA release (``cu126``), else ``cpu``."""
    assert master.torch is not None
    if node_os == master.os:
        return _label(master.torch)
    if master.cuda:
        return "cu" + master.cuda.replace(".", "")
    return "cpu"


def torch_pin(name: str, version: str, label: str) -> str:
    public = version.partition("+")[0]
    return f"{name}=={public}+{label}" if label else f"{name}=={public}"


def index_for(label: str) -> str | None:
    """PyTorch's index serving builds with ``label`` (None: an unlabeled torch comes from PyPI)."""
    return PYTORCH_INDEX + label if label else None


def requirements_text(master: MasterEnv, node_os: str, *, with_index: bool) -> str:
    """The requirements (a lock) nodes of ``node_os`` install: the header says where it comes from,
    then the index line (``with_index``: cluster.env names no index of its own), then one pin a line.
    The same text ``--freeze`` writes, so an inventory pointing ``cluster.env`` at that file installs
    the very same environment (same stamp: an unchanged node stays unchanged)."""
    if master.torch is None:
        raise ValueError("the master has no torch")
    label = build_label(master, node_os)
    names = sorted(master.packages if node_os == master.os else master.portable & set(master.packages))
    lines = [
        f"# The master's training environment for {node_os} nodes, written by bootstrap sync --freeze",
        f"# (read from {master.where}, Python {master.python}): torch and its companions, each pinned",
        "# to the version installed there. Declare it with cluster.env.requirements (docs/sync.md).",
    ]
    index = index_for(label)
    if with_index and index:
        lines.append(f"--extra-index-url {index}")
    for name in names:
        version = master.packages[name]
        lines.append(torch_pin(name, version, label) if name in _TORCH_FAMILY else f"{name}=={version}")
    return "\n".join(lines) + "\n"


def _pick(inventory: Inventory, os_name: str, name: str) -> Any:
    env = inventory.cluster.env
    override = env.linux if os_name == "linux" else env.windows if os_name == "windows" else None
    value = getattr(override, name, None) if override is not None else None
    return getattr(env, name) if value is None else value


def spec_from_master(inventory: Inventory, master: MasterEnv, os_name: str) -> EnvSpec:
    """The :class:`EnvSpec` installing the master's set on nodes of ``os_name``, with cluster.env's
    other settings (index, offline, installer, path, python) as the inventory gives them."""
    env = inventory.cluster.env
    index_url = _pick(inventory, os_name, "index_url")
    no_index = bool(_pick(inventory, os_name, "no_index"))
    text = requirements_text(master, os_name, with_index=not (index_url or no_index))
    source = f"the master's environment ({master.where})"
    reqs, hashes, warnings = parse_requirements(text, source)
    return EnvSpec(
        os=os_name,
        source=source,
        requirements_text=text,
        requirements=reqs,
        hashes=hashes,
        python_wanted=env.python,
        index_url=index_url,
        extra_index_urls=tuple(_pick(inventory, os_name, "extra_index_urls") or ()),
        find_links=tuple(_pick(inventory, os_name, "find_links") or ()),
        no_index=no_index,
        offline=env.offline,
        installer=env.installer,
        path_setting=env.path,
        compile_bytecode=env.compile_bytecode,
        base_dir=str(Path(inventory.source).parent),
        warnings=tuple(warnings),
        # the user named no package source: a node without an index gets the master's set from here
        offline_fallback=not env.offline,
    )


# -- reading the master --------------------------------------------------------------------------


def _parse_output(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                data: dict[str, Any] = json.loads(line)
            except ValueError:
                return None
            return data
    return None


def read_node(node: Node, transport: Transport) -> MasterEnv | None:
    """The master node's own interpreter (not a venv a sync gave it): None when it has no torch."""
    python = interpreter_for(node)
    result = transport.run(transport.platform.join([python, "-c", probe_code()]), timeout=120)
    data = _parse_output(result.stdout) if result.ok else None
    if result.exit_code == NOT_FOUND or data is None:
        return None
    env = MasterEnv.parse(f"{node.name}: {python}", data, node.name)
    return env if env.torch else None


def read_local() -> MasterEnv | None:
    """The interpreter running bootstrap on this machine (the master, per the README): None when it
    has no torch."""
    # isolated (-I): nothing imported from the directory bootstrap runs in (another user's json.py
    # there ran as root), nor PYTHONPATH's; this interpreter's own site-packages as they are
    proc = subprocess.run(
        [sys.executable, "-I", "-c", probe_code()], capture_output=True, text=True, timeout=120, check=False
    )
    data = _parse_output(proc.stdout) if proc.returncode == 0 else None
    if data is None:
        return None
    env = MasterEnv.parse(f"this machine: {sys.executable}", data)
    return env if env.torch else None


@dataclass(frozen=True)
class Reference:
    """Whose environment the nodes get, and whether the master node trains in its own interpreter
    (then it is not synced: it is the reference)."""

    env: MasterEnv
    master_is_reference: bool


def read_reference(inventory: Inventory, transport: Transport) -> Reference:
    """The master node's own interpreter when it has torch, else this machine's (bootstrap runs on
    the master: the README installs torch beside it). Neither: a clear error, exit 1."""
    master = inventory.master_node
    found = read_node(master, transport)
    if found is not None:
        return Reference(found, master_is_reference=True)
    local = read_local()
    if local is not None:
        return Reference(local, master_is_reference=False)
    raise CommandFailedError(
        f"no torch on the master: neither {interpreter_for(master)} there nor {sys.executable} here "
        "has it, so there is no environment to copy",
        node=master.name,
        hint="install torch on the master first (pip install 'torch==X.Y.Z'; docs/quickstart.md), "
        "or declare the environment with cluster.env (docs/sync.md)",
    )


def freeze_texts(path: Path, inventory: Inventory, nodes: list[Node], master: MasterEnv) -> dict[Path, str]:
    """``--freeze FILE``: the lock for each OS among ``nodes`` (FILE for the master's OS, or for the
    only OS; ``FILE`` with ``.windows``/``.linux`` before its suffix for another), file -> text."""
    oses: list[str] = sorted({n.python_os for n in nodes}) or [master.os]
    out: dict[Path, str] = {}
    for os_name in oses:
        target = path
        if len(oses) > 1 and os_name != master.os:
            target = path.with_name(f"{path.stem}.{os_name}{path.suffix}")
        index_url = _pick(inventory, os_name, "index_url")
        no_index = bool(_pick(inventory, os_name, "no_index"))
        out[target] = requirements_text(master, os_name, with_index=not (index_url or no_index))
    return out


def write_freeze(path: Path, inventory: Inventory, nodes: list[Node], master: MasterEnv) -> list[Path]:
    """Write :func:`freeze_texts`; returns the files."""
    written: list[Path] = []
    for target, text in freeze_texts(path, inventory, nodes, master).items():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--freeze: cannot write {target}: {exc.strerror or exc}") from None
        written.append(target)
    return written


# -- the record: which nodes train in a venv a --from-master sync made --------------------------------

_record_lock = threading.Lock()
_record_cache: dict[str, tuple[float, dict[str, Any]]] = {}


def record_file(inventory: Inventory) -> Path:
    source = os.path.abspath(str(inventory.source))
    key = hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return state_dir() / "from-master" / f"{key}.json"


def _load(path: Path) -> dict[str, Any]:
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return {}
    with _record_lock:
        cached = _record_cache.get(str(path))
        if cached is not None and cached[0] == mtime:
            return cached[1]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    with _record_lock:
        _record_cache[str(path)] = (mtime, data)
    return data


def _identity(node: Node, inventory: Inventory) -> dict[str, Any]:
    return {
        "host": node.host,
        "user": node.user,
        "os": node.os,
        "path": env_path(node, path_setting=inventory.cluster.env.path),
    }


def synced_from_master(node: Node, inventory: Inventory) -> bool:
    """True when a `bootstrap sync --from-master` gave this node its venv (at the path the inventory
    still gives: a moved workdir or another host means the record no longer applies), and the
    inventory declares no environment of its own."""
    if inventory.cluster.env.declared:
        return False
    entry = (_load(record_file(inventory)).get("nodes") or {}).get(node.name)
    if not isinstance(entry, dict):
        return False
    return all(entry.get(k) == v for k, v in _identity(node, inventory).items())


def recorded_nodes(inventory: Inventory) -> list[str]:
    """The inventory's nodes that train in a --from-master venv."""
    return [n.name for n in inventory.nodes if synced_from_master(n, inventory)]


def remember(inventory: Inventory, synced: dict[str, dict[str, Any]]) -> Path:
    """Record ``synced`` (node name -> what was installed) for the inventory; other nodes' entries are
    kept (a sync of --nodes node2 leaves node3's venv in use)."""
    path = record_file(inventory)
    data = dict(_load(path))
    nodes = dict(data.get("nodes") or {})
    by_name = {n.name: n for n in inventory.nodes}
    for name, info in synced.items():
        nodes[name] = {**_identity(by_name[name], inventory), **info}
    data = {"inventory": os.path.abspath(str(inventory.source)), "nodes": nodes}
    private_dirs(path.parent)
    write_inside(path.parent, path.name, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
    return path


# -- what `check` tells a node without the master's torch (steps/preflight/checks.py) ---------------


def slurm_env_fix(master_torch: str | None) -> str:
    """On Slurm every compute node runs one interpreter from the shared file system: how to give
    them the first node's torch (a sync per node, --from-master, does not apply there)."""
    pin = f"=={master_torch}" if master_torch else ""
    return (
        "on Slurm every compute node runs one interpreter from the shared file system: set "
        f"cluster.slurm.python to one with torch{pin}, or pin torch{pin} in cluster.env and run "
        "`bootstrap sync` (it builds the environment once in cluster.slurm.dir); a node that finds "
        "another torch (its own PYTHONPATH, a module its shell loads) differs"
    )


def torch_missing_fix(master_torch: str | None, declared: bool | None = None, *, slurm: bool = False) -> str:
    """The fix for a node whose training interpreter has no torch: the sync that installs it (never a
    pip into a sync-managed venv: it has no pip). ``declared``: whether the inventory declares
    cluster.env (None: unknown here, both ways are named). ``slurm``: the nodes are an allocation's."""
    if slurm:
        return slurm_env_fix(master_torch)
    want = f" {master_torch}" if master_torch else ""
    pin = f"=={master_torch}" if master_torch else ""
    from_master = (
        f"`bootstrap sync --from-master` installs the master's torch{want} and its companions in a venv "
        "on every node, which training then uses (in the pipeline: `bootstrap --sync-from-master`)"
    )
    declared_fix = f"add torch{pin} to cluster.env's requirements, then run `bootstrap sync`"
    if declared is None:
        return f"{from_master}; if the inventory declares cluster.env: {declared_fix}"
    return declared_fix if declared else from_master


def versions_differ_fix(
    mine: dict[str, str | None], master: dict[str, str | None], *, slurm: bool = False
) -> str:
    """The fix for a node whose torch or Python is not the master's (``slurm``: an allocation's)."""
    torch_differs = (mine.get("torch") or "").partition("+")[0] != (master.get("torch") or "").partition("+")[
        0
    ]
    python_differs = (mine.get("python") or "").split(".")[:2] != (master.get("python") or "").split(".")[:2]
    parts = []
    if python_differs:
        minor = ".".join((master.get("python") or "").split(".")[:2])
        parts.append(f"install Python {minor} (the master's) on this node and set python: to it")
    if torch_differs and slurm:
        parts.append(slurm_env_fix(master.get("torch")))
    elif torch_differs:
        parts.append(
            "`bootstrap sync --from-master` gives every node the master's torch "
            f"{master.get('torch')} (with cluster.env: pin torch=={master.get('torch')} there and run "
            "`bootstrap sync`)"
        )
    return (
        "; ".join(parts or ["use the same torch release and Python on every node"])
        + " (torch checks nothing at init: a mismatch fails later in obscure ways)"
    )
