"""After the probe: a node's build, as a plan (``plans.NodePlan``) decided on the controller, then
applied.

:func:`plan_build` decides the build (:class:`~orchestrator.steps.envsync.ops.BuildPlan`: its id, a
clone of the active venv when only versions changed, which pip runs the install, the stamp, the
nonce of its records); :func:`plan_node` turns it into the node's plan: read the shared-directory
markers, create the build's directory, upload the requirements, the index settings (and, offline,
the wheels the node lacks), run the build script. ``--dry-run`` prints that plan; the real run
applies the very same object (:func:`apply_node`), which then reads the installed versions from the
build's ``installed`` record. A failed build leaves the previous environment active
(:class:`EnvInstallError` says whether there was one, and holds the installer's last lines).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orchestrator.steps.envsync.wheelhouse as wheelhouse_mod
from orchestrator import records
from orchestrator.errors import CommandFailedError, UsageError
from orchestrator.facts.interpreter import interpreter_for
from orchestrator.plans import NodePlan, Put, Run
from orchestrator.plans import apply as apply_plan
from orchestrator.redact import mask_url_credentials
from orchestrator.runs.base import refused_dir
from orchestrator.steps.envsync.ops import INSTALLED_RECORD, STEP_RECORD, BuildPlan
from orchestrator.steps.envsync.probe import EnvSharedError, Probe, Probed, env_parent
from orchestrator.steps.envsync.progress import InstallProgress
from orchestrator.steps.envsync.report import NodeEnv
from orchestrator.steps.envsync.spec import (
    EnvSpec,
    env_file_text,
    env_path,
    index_environment,
    index_flags,
)
from orchestrator.view import human_bytes

if TYPE_CHECKING:
    from orchestrator.inventory import Node
    from orchestrator.transports import Result, Transport

TAIL = 15


class EnvInstallError(CommandFailedError):
    """The installer failed on a node; ``kept`` says whether a previous environment is still active,
    ``lines`` are the installer's last lines (what a user reads; logins not yet masked)."""

    status = "install failed"

    def __init__(
        self, message: str, *, node: str, hint: str | None, result: object, kept: bool, lines: list[str]
    ) -> None:
        super().__init__(message, node=node, hint=hint, result=result)
        self.kept = kept
        self.lines = lines


def new_build_id() -> str:
    """A build's id: when it was planned, and unique (its directory is ``<env.path>.versions/<id>``)."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def created_now() -> str:
    """The stamp's ``created``: when the build was planned."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


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
    """What a build writes into its environment's stamp (inside its build script: --dry-run shows it)."""
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
    """The build for a node whose stamp differs (or --force): every value chosen here, once."""
    build_id = new_build_id()
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
        created=created_now(),
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
        nonce=records.new_nonce(),
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


Change = tuple[str | None, str | None]


def _changes(before: dict[str, str] | None, after: dict[str, str]) -> dict[str, Change]:
    before = before or {}
    out: dict[str, Change] = {}
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            out[name] = (before.get(name), after.get(name))
    return out


@dataclass(frozen=True)
class OutsideJob(Run):
    """A ``Run`` a native Windows node runs outside its WinRS shell's job (runs/start.py
    ``run_outside_job``: the script goes up as the job's file, then is followed): pip installing torch
    inside the shell's job would meet its quotas (25 processes, 1 GB, children included)."""

    job_dir: str = ""

    def public_dict(self, transport: Transport | None = None) -> dict[str, Any]:
        return {**super().public_dict(transport), "outside_job": self.job_dir}


@dataclass
class EnvPlan:
    """One node's build, decided: ``plan`` is what --dry-run prints and what :func:`apply_node` runs."""

    node: Node
    probed: Probed
    build: BuildPlan
    installer: str
    plan: NodePlan
    wheels: list[Put] = field(default_factory=list)  # offline: the wheels among the plan's uploads
    notes: list[str] = field(default_factory=list)


def _marker_read(node: Node, transport: Transport, probed: Probed, tokens: dict[str, str]) -> Run:
    """Before anything is written: another node of this sync whose marker is beside this environment
    shares the directory (NFS home, shared disk). Building would delete its builds and it ours: the
    run's check refuses, saying so (the installer's errors would otherwise blame the requirements)."""
    from orchestrator.steps.preflight.shared_fs import (
        fix_text,
        marker_answer,
        marker_command,
        read_args,
        seen_markers,
        sharing,
    )

    directory = env_parent(probed.path)
    command = marker_command(node, transport.platform, read_args(node, [directory]))

    def refuse_shared(result: Result) -> None:
        seen = seen_markers(marker_answer(node, result)).get(directory, {})
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

    return Run(
        command,
        timeout=60,
        what=f"read the markers in {directory}/.cluster-bootstrap-nodes/: another node's marker of this "
        "sync there (a shared directory) stops this node before it installs anything",
        check=refuse_shared,
    )


def _prepared(node: Node, plan: BuildPlan) -> Callable[[Result], None]:
    def check(result: Result) -> None:
        if (refused := refused_dir(result, node.name)) is not None:
            raise refused  # a directory another user made or can change: nothing built there
        if not result.ok:
            tail = " | ".join(result.tail(3))
            raise CommandFailedError(
                f"cannot create {plan.versions_dir}: {tail}", node=node.name, result=result
            )

    return check


def plan_node(
    node: Node,
    transport: Transport,
    spec: EnvSpec,
    probed: Probed,
    *,
    force: bool = False,
    tokens: dict[str, str] | None = None,
    progress: Callable[[str, str], None] = lambda activity, detail: None,
) -> EnvPlan:
    """The build of a node whose probe found something to do, every value decided (its id, its
    nonce, its stamp, the wheels to push: offline, this machine's wheelhouse is filled here). With
    ``tokens`` (this sync's markers, several nodes) the plan first reads the markers beside the
    environment. Raises when the node cannot build (no venv module, uv asked for and absent)."""
    found, key, ops, path = probed.found, probed.key, probed.ops, probed.path
    if not found.data["python"].get("venv_module"):
        raise CommandFailedError(
            f"{found.python_path} cannot create virtual environments (no venv/ensurepip module)",
            node=node.name,
            hint="Debian/Ubuntu: apt-get install python3-venv (or python3.X-venv for that version)",
        )
    installer = _choose_installer(node, spec, found)
    index_env: dict[str, str] = {}
    if spec.offline:
        # the node's absolute path (the probe expanded "~"): pip takes --find-links literally. Our
        # own directory, no login in it; the inventory's locations were for this machine's download
        index_args = ["--no-index", "--find-links", str(found.venv["path"]).rstrip("/\\") + ".wheels"]
    else:
        index_args = index_flags(spec)
        index_env = index_environment(spec, installer[0])
    build = plan_build(
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
    platform = transport.platform
    actions: list[Run | Put] = []
    if tokens and not probed.marker_error:  # no marker written there: the build says what is wrong
        actions.append(_marker_read(node, transport, probed, tokens))
    actions.append(
        Run(ops.prepare(build), timeout=60, what="the build's directories", check=_prepared(node, build))
    )
    wheels: list[Put] = []
    notes: list[str] = []
    if spec.offline:
        progress("downloading the wheels here", "this machine's download, for every node of this platform")
        house = wheelhouse_mod.fill(spec, found.target())
        have: dict[str, str] = dict((found.data.get("wheelhouse") or {}).get("files") or {})
        wheels = [
            Put(
                platform.transfer_path(f"{build.wheelhouse}/{name}"),
                source=house.directory / name,
                what="wheel",
            )
            for name, digest in sorted(house.files.items())
            if have.get(name) != digest
        ]
        build = replace(build, remove_wheels=tuple(sorted(n for n in have if n not in house.files)))
        notes.append(f"wheelhouse {house.directory} ({'downloaded' if house.downloaded else 'reused'})")
    actions += wheels
    # owner-only, both: a requirements file may name an index with its login, the index settings
    # hold them (the build script reads and deletes that file before installing)
    actions.append(
        Put(
            platform.transfer_path(build.requirements_file),
            data=spec.requirements_text.encode("utf-8"),
            mode=0o600,
            what=f"the requirements ({spec.source})",
        )
    )
    if build.index_env_file:
        text = env_file_text(dict(build.index_env))
        actions.append(
            Put(
                platform.transfer_path(build.index_env_file),
                data=text.encode("utf-8"),
                mode=0o600,
                what="the index settings: " + "; ".join(mask_url_credentials(text).splitlines()),
            )
        )
    what = "build, stamp and switch to the new environment, then list it"
    if ops.absolute_paths:  # native Windows (see OutsideJob)
        job_dir = f"{build.versions_dir}/{build.build_id}.job"
        script: Run = OutsideJob(
            ops.build(build), timeout=3600, stream=True, keep_lines=400, what=what, job_dir=job_dir
        )
    else:
        script = Run(ops.build(build), timeout=3600, stream=True, keep_lines=400, what=what)
    actions.append(script)
    return EnvPlan(node, probed, build, installer[0], NodePlan(node.name, actions), wheels, notes)


def apply_node(
    planned: EnvPlan,
    transport: Transport,
    *,
    on_line: Callable[[str, str], None] | None = None,
    progress: Callable[[str, str], None] = lambda activity, detail: None,
) -> NodeEnv:
    """Run ``planned.plan`` on the node, in order (each action as ``plans.apply`` runs it; the build
    followed for its progress), then judge the build from its records: the installed versions, or
    :class:`EnvInstallError`. Raises what a check of the plan raised (shared directory, no directory)."""
    node, build = planned.node, planned.build
    tracker = InstallProgress("creating the environment")

    def forward(stream: str, line: str) -> None:
        said = records.decode_line(line.rstrip("\r"), build.nonce)
        if said is not None:
            if said.kind == STEP_RECORD:
                tracker.set(said.text(0))
            else:
                return
        else:
            tracker.feed(line)
        snapshot = tracker.snapshot()
        progress(snapshot.activity, snapshot.detail())
        if on_line is not None and said is None and not _is_raw_progress(line):
            on_line(node.name, mask_url_credentials(line))

    total = sum(
        len(w.content()) if w.data is not None else Path(str(w.source)).stat().st_size for w in planned.wheels
    )
    sent = 0
    results: list[Result] = []
    progress("preparing the build", "")
    for action in planned.plan.actions:
        if isinstance(action, Put) and action in planned.wheels:
            index = planned.wheels.index(action) + 1
            progress(
                f"uploading wheels ({index} of {len(planned.wheels)})",
                f"{human_bytes(sent)} of {human_bytes(total)} sent",
            )
            sent += Path(str(action.source)).stat().st_size
        elif isinstance(action, Run) and action.stream:
            progress("creating the environment", "")
        if isinstance(action, OutsideJob):
            from orchestrator.runs.start import run_outside_job

            results.append(
                run_outside_job(
                    node,
                    transport,
                    action.job_dir,
                    action.script,
                    output=forward,
                    timeout=action.timeout,
                    keep=action.keep_lines or 400,
                )
            )
        else:
            results += apply_plan(NodePlan(node.name, [action]), transport, output=forward)
    return _judge(planned, results[-1], round_trips=1 + len(results))


def _judge(planned: EnvPlan, result: Result, *, round_trips: int) -> NodeEnv:
    """The node's environment after its build script ran (``result``)."""
    node, build, found, path = planned.node, planned.build, planned.probed.found, planned.probed.path
    venv_interpreter = planned.probed.ops.venv_python(path)
    said = records.find(result.stdout, build.nonce, INSTALLED_RECORD)
    listing: dict[str, Any] | None = None
    if said is not None:
        try:
            decoded = json.loads(said.text(0))
        except ValueError:
            decoded = None
        listing = decoded if isinstance(decoded, dict) else None
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
        tail = installer_tail(result.tail(TAIL * 4), build.nonce)[-TAIL:]
        last = [line.strip() for line in tail if line.strip()]
        last = [line for line in last if not line.startswith("cluster-bootstrap:")]
        errors = [line for line in last if "error" in line.lower()]
        why = (errors or last or [f"exit code {result.exit_code}"])[-1]
        raise EnvInstallError(
            f"{planned.installer} install failed ({why}); {kept}",
            node=node.name,
            hint="fix the requirements or the index settings and run bootstrap sync again",
            result=result,
            kept=had_env,
            lines=tail,
        )
    packages = dict(listing.get("packages") or {})
    if build.clone:
        action = "updated"
    elif found.venv.get("state") == "link":
        action = "rebuilt"
    else:
        action = "installed"
    notes = list(planned.notes)
    if build.clone:
        notes.append(f"cloned from {found.stamp.get('id')}")
    return NodeEnv(
        node=node.name,
        os=node.python_os,
        action=action,
        path=path,
        python_path=venv_interpreter,
        python=str(listing.get("python") or found.python_version),
        installer=planned.installer,
        env_id=build.build_id,
        packages=packages,
        changes=_changes(found.installed, packages),
        wheels_pushed=len(planned.wheels),
        round_trips=round_trips,
        notes=notes,
    )


def _is_raw_progress(line: str) -> bool:
    """pip's ``--progress-bar raw`` counter line."""
    return line.startswith("Progress ") and " of " in line


def installer_tail(lines: list[str], nonce: str) -> list[str]:
    """The build's last lines without its records (``nonce``) and pip's raw progress counters (what a
    user reads after a failure)."""
    return [
        line
        for line in lines
        if records.decode_line(line.rstrip("\r"), nonce) is None and not _is_raw_progress(line)
    ]
