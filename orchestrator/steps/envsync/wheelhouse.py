"""Offline mode, controller side: one local wheelhouse per target platform, filled once.

``pip download --only-binary=:all: --platform ... --python-version ... --implementation cp --abi ...``
fetches the wheels a node needs without running on it: the platform tags come from the node's own
report (``env_probe.py``), so a glibc 2.28 node and a glibc 2.36 node each get wheels they can install.
Nodes then install with ``--no-index --find-links <their wheelhouse>``: they never need the network.
The index locations reach this machine's ``pip download`` through its environment (``PIP_INDEX_URL``...,
:func:`~orchestrator.steps.envsync.spec.index_environment`), never its command line: other users of
this machine see command lines too.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import CommandFailedError
from orchestrator.logs import state_dir
from orchestrator.redact import mask_url_credentials
from orchestrator.safefiles import private_dirs
from orchestrator.steps.envsync.spec import EnvSpec, index_environment, index_flags

_COMPLETE = ".complete"


@dataclass(frozen=True)
class Target:
    """What wheels must fit: interpreter version, implementation, ABI and platform tags."""

    python: str  # "3.11"
    implementation: str  # "cp"
    abi: str  # "cp311"
    platforms: tuple[str, ...]

    def describe(self) -> str:
        first = self.platforms[0] if self.platforms else "any"
        return f"{self.implementation}{self.python.replace('.', '')} {first}"


@dataclass
class Wheelhouse:
    directory: Path
    files: dict[str, str]  # file name -> sha256
    downloaded: bool  # False: reused from an earlier run
    output: list[str] = field(default_factory=list)


def wheelhouse_root() -> Path:
    return state_dir() / "wheelhouse"


def download_command(spec: EnvSpec, target: Target, directory: Path, requirements: Path) -> list[str]:
    """The controller's ``pip download`` for one target (shown by --dry-run); it runs with
    :func:`download_environment`, which says where packages come from."""
    argv = [
        sys.executable,
        "-I",  # `-m pip` from the inventory's directory: never a `pip` package planted there
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar",
        "off",
        "--only-binary=:all:",
        "--python-version",
        target.python,
        "--implementation",
        target.implementation,
        "--abi",
        target.abi,
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]
    for platform in target.platforms:
        argv += ["--platform", platform]
    argv += index_flags(spec)
    if spec.hashes:
        argv.append("--require-hashes")
    argv += ["-d", str(directory), "-r", str(requirements)]
    return argv


def download_environment(spec: EnvSpec) -> dict[str, str]:
    """The environment of the controller's ``pip download``: this one's, plus the index locations.
    PIP_EXTRA_INDEX_URL replaces the extra indexes this machine's pip configuration names (a lab's
    mirror): they are kept, after the spec's."""
    env = {**os.environ, "PIP_NO_INPUT": "1", **index_environment(spec, "pip")}
    if extra := env.get("PIP_EXTRA_INDEX_URL"):
        urls = extra.split()
        env["PIP_EXTRA_INDEX_URL"] = " ".join(urls + [u for u in configured_extra_indexes() if u not in urls])
    return env


#: the sections of pip's configuration a ``pip download`` reads (``:env:``: PIP_* variables)
_SECTIONS = ("global", "download", "install", ":env:")


def configured_extra_indexes() -> list[str]:
    """The extra index URLs this machine's pip configuration files and environment name (``pip
    config list``: global, user, site; the ``install`` and ``download`` sections too)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return []
    urls: list[str] = []
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".extra-index-url") and key.split(".")[0] in _SECTIONS:
            urls += [u for u in value.strip().strip("'\"").split() if u not in urls]
    return urls


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def listing(directory: Path) -> dict[str, str]:
    return {
        p.name: sha256(p) for p in sorted(directory.iterdir()) if p.is_file() and not p.name.startswith(".")
    }


_locks: dict[str, threading.Lock] = {}
_failed: dict[str, CommandFailedError] = {}  # a failed download is not retried by every node of a run
_locks_guard = threading.Lock()


def _said_again(error: CommandFailedError) -> CommandFailedError:
    """A new error of the same words for one more node (an error raised for one node is that node's)."""
    return CommandFailedError(error.message, hint=error.hint)


def fill(spec: EnvSpec, target: Target, root: Path | None = None) -> Wheelhouse:
    """The wheelhouse for ``spec`` on ``target``: reused when complete, else downloaded once (nodes
    sharing a target wait for the same download)."""
    material = json.dumps({"spec": spec.digest, "target": target.__dict__}, sort_keys=True, default=list)
    key = hashlib.sha256(material.encode()).hexdigest()[:20]
    directory = (root or wheelhouse_root()) / key
    with _locks_guard:
        lock = _locks.setdefault(str(directory), threading.Lock())
    with lock:
        if str(directory) in _failed:  # one download for every node of that platform: each told
            raise _said_again(_failed[str(directory)])
        marker = directory / _COMPLETE
        if marker.is_file():
            return Wheelhouse(directory, json.loads(marker.read_text()), downloaded=False)
        private_dirs(directory)  # pip writes the wheels with its own modes: this user's alone
        with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="cb-req-", delete=False) as fh:
            fh.write(spec.requirements_text)
            requirements = Path(fh.name)
        try:
            argv = download_command(spec, target, directory, requirements)
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=download_environment(spec),
                cwd=spec.base_dir,  # relative find_links are the inventory's
            )
        finally:
            requirements.unlink(missing_ok=True)
        output = (proc.stdout + proc.stderr).splitlines()
        if proc.returncode != 0:
            said = [line for line in output if line.strip() and not line.startswith("WARNING: Retrying")]
            tail = mask_url_credentials(" | ".join(said[-4:]))  # pip's retries are noise beside why
            _failed[str(directory)] = CommandFailedError(
                f"offline mode: this machine's download of the wheels for {target.describe()} failed "
                f"(for every node of that platform): {tail}",
                hint="every package needs a binary wheel for that platform (--only-binary=:all:); "
                "check env.index_url / env.find_links, and that this machine reaches the index",
            )
            raise _said_again(_failed[str(directory)])
        files = listing(directory)
        marker.write_text(json.dumps(files, sort_keys=True))
        return Wheelhouse(directory, files, downloaded=True, output=output)
