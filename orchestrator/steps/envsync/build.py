"""Round trips 2 and 3 of an environment sync: build a new venv beside the active one, switch to it.

:func:`plan_build` decides the build (:class:`~orchestrator.steps.envsync.ops.BuildPlan`: a clone of
the active venv when only versions changed, which pip runs the install, the stamp); :func:`build_node`
prepares its directory, pushes the requirements (and, offline, the wheels the node lacks), runs the
build script and reads back the installed versions. A failed build leaves the previous environment
active (:class:`EnvInstallError` says whether there was one); :func:`installer_tail` is what a user
reads of the installer's output after a failure.
"""

from __future__ import annotations

import json
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orchestrator.steps.envsync.wheelhouse as wheelhouse_mod
from orchestrator.errors import CommandFailedError, UsageError
from orchestrator.facts.interpreter import interpreter_for
from orchestrator.platforms.powershell import PowerShell
from orchestrator.redact import mask_url_credentials
from orchestrator.steps.envsync.ops import INSTALLED_MARK, BuildPlan
from orchestrator.steps.envsync.probe import Probe, Probed
from orchestrator.steps.envsync.progress import STEP_MARK, InstallProgress, human_size
from orchestrator.steps.envsync.report import NodeEnv
from orchestrator.steps.envsync.spec import (
    EnvSpec,
    env_file_text,
    env_path,
    index_environment,
    index_flags,
)

if TYPE_CHECKING:
    from orchestrator.inventory import Node
    from orchestrator.transports import Transport

TAIL = 15


class EnvInstallError(CommandFailedError):
    """The installer failed on a node; ``kept`` says whether a previous environment is still active."""

    def __init__(self, message: str, *, node: str, hint: str | None, result: object, kept: bool) -> None:
        super().__init__(message, node=node, hint=hint, result=result)
        self.kept = kept


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


def build_stamp(
    spec: EnvSpec, *, key: str, build_id: str, python: str, platform: str, installer: str, created: str
) -> dict[str, object]:
    """What a build writes into its environment's stamp (--dry-run shows the same fields, with
    placeholders for the values only the node and the build give: KEY, BUILD-ID, PYTHON, ...)."""
    return {
        "key": key,
        "id": build_id,
        "python": python,
        "platform": platform,
        "installer": installer,
        "names": sorted(spec.names),
        "source": spec.source,
        "offline": spec.offline,
        "created": created,
    }


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
    stamp = build_stamp(
        spec,
        key=key,
        build_id=build_id,
        python=found.python_version,
        platform=found.platform_key,
        installer=installer[0],
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
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
        compile_bytecode=spec.compile_bytecode,
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

    if isinstance(transport.platform, PowerShell):
        # pip installing torch inside the WinRS shell's job would meet its quotas (25 processes,
        # 1 GB, children included): the build runs outside it, followed like a foreground run
        from orchestrator.runs.start import run_outside_job

        job_dir = f"{plan.versions_dir}/{plan.build_id}.job"
        result = run_outside_job(
            node, transport, job_dir, ops.build(plan), output=forward, timeout=3600, keep=400
        )
    else:
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
        os=node.python_os,
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
