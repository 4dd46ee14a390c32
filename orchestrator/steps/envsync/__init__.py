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

This module drives those steps over the session's nodes (:func:`sync_env`) and prints them for
``--dry-run`` (:func:`plan_commands`). The probe is ``probe.py``, the build ``build.py``, the exact
commands each OS runs ``ops.py``, what a node gets ``spec.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.executor import Outcome
from orchestrator.facts import SESSION_KEY_PREFIX
from orchestrator.facts.interpreter import interpreter_for
from orchestrator.redact import mask_url_credentials
from orchestrator.steps.envsync.build import build_node, build_stamp, installer_tail
from orchestrator.steps.envsync.ops import BuildPlan, ops_for, probe_code
from orchestrator.steps.envsync.probe import EnvSharedError, env_parent, probe_args, probe_node, refuse_shared
from orchestrator.steps.envsync.report import EnvReport, NodeEnv, NodeVersions, summarize
from orchestrator.steps.envsync.spec import (
    EnvSpec,
    env_file_text,
    env_path,
    index_environment,
    index_flags,
    resolve_spec,
)

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.transports import Transport

__all__ = [
    "EnvReport",
    "EnvSharedError",
    "EnvSpec",
    "NodeEnv",
    "env_path",
    "installer_tail",
    "plan_commands",
    "probe_script",
    "resolve_specs",
    "summarize_outcomes",
    "sync_env",
    "venv_python",
]


def resolve_specs(inventory: Inventory, nodes: list[Node]) -> dict[str, EnvSpec]:
    """One spec per OS among ``nodes`` (UsageError, exit 2, when the inventory's env is unusable)."""
    return {os_name: resolve_spec(inventory, os_name) for os_name in sorted({n.python_os for n in nodes})}


def venv_python(node: Node, inventory: Inventory) -> str:
    """The interpreter inside the node's synced venv (for launch): ``<env.path>/bin/python`` on Linux
    (``<env.path>\\Scripts\\python.exe`` on Windows); ``~`` means the login user's home."""
    path = env_path(node, path_setting=inventory.cluster.env.path)
    if node.python_os == "windows":
        return path.rstrip("/\\") + "\\Scripts\\python.exe"
    return path.rstrip("/") + "/bin/python"


#: (node, activity, detail): what a node's sync is doing now, for the progress display
ProgressFn = Callable[[str, str, str], None]


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
    return build_node(node, transport, probed.spec or spec, probed, force=force, on_line=on_line)


#: stands for the probe's text in --dry-run commands (the script is printed once, before them)
PROBE_PLACEHOLDER = "<env_probe.py, printed once above (--json: env_probe)>"


def plan_commands(node: Node, transport: Transport, spec: EnvSpec, *, force: bool = False) -> list[str]:
    """What a sync runs on ``node`` (for --dry-run): the probe, then the build it runs when the
    stamp differs (shown as a fresh build; a clone replaces ``python -m venv`` when only versions
    changed). Uploads are listed as comments."""
    ops = ops_for(transport.platform)
    path = env_path(node, spec)
    wrap = transport.platform.wrap
    marker = {
        "dir": env_parent(path),
        "name": node.name,
        "token": "TOKEN",
        "marker_dir": ".cluster-bootstrap-nodes",
    }
    # the probe's text is the same for every node: shown once (probe_script), named here
    probe_command = ops.probe(interpreter_for(node), probe_args(spec, path, marker), code=PROBE_PLACEHOLDER)
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
        compile_bytecode=spec.compile_bytecode,
        stamp=build_stamp(
            spec,
            key="KEY",
            build_id="BUILD-ID",
            python="PYTHON",
            platform="PLATFORM",
            installer=installer,
            created="CREATED",
        ),
        offline=spec.offline,
        pip_runner="base",  # shown as the common case: the node's own pip 22.3+ (see build._pip_runner)
    )
    commands.append(f"# only when the stamp differs{' or --force' if not force else ''}:")
    commands.append(
        f"# first: the markers in {env_parent(path)}/.cluster-bootstrap-nodes/ are read; another node's "
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
    on_notice: Callable[[str], None] | None = None,
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

    The probe also asks each node that has something to install whether it reaches the package index
    its installer will use. One that does not fails before installing (exit 1, naming env.offline and
    env.index_url), unless its spec has ``offline_fallback`` (``--from-master``): then it installs from
    wheels this machine downloads and pushes, and ``on_notice`` gets one line naming those nodes.
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
                os=node.python_os,
                action="planned",
                path=env_path(node, specs[node.python_os]),
                python_path=_ops_venv_python(transport, env_path(node, specs[node.python_os])),
                python="",
                installer=None,
                env_id=None,
                round_trips=0,
                commands=plan_commands(node, transport, specs[node.python_os], force=force),
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
            chosen_specs[node.python_os],
            force=force,
            token=tokens.get(node.name),
            progress=reporter(node),
        ),
        step="env check",
        nodes=chosen,
    )
    waiting = {o.node: o.value for o in probed if o.value is not None and o.value.env is None}
    fallback = {name: ready.offline_reason for name, ready in waiting.items() if ready.offline_reason}
    if fallback and on_notice is not None:
        on_notice(offline_notice(fallback))

    def build(node: Node, transport: Transport) -> NodeEnv:
        ready = waiting[node.name]
        if tokens:
            refuse_shared(node, transport, ready, tokens)
        env = build_node(
            node,
            transport,
            ready.spec or chosen_specs[node.python_os],
            ready,
            force=force,
            on_line=on_line,
            progress=reporter(node),
        )
        if tokens:
            env.round_trips += 1  # the markers were read
        env.offline_reason = ready.offline_reason
        # its Python and torch changed: later phases ask for its facts again (not for its firewall)
        session.forget(node.name, *[k for k in session.keys(node.name) if k.startswith(SESSION_KEY_PREFIX)])
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


def offline_notice(reasons: dict[str, str]) -> str:
    """The one line saying which nodes install from pushed wheels, and why (the first reason: nodes
    of one network usually share it)."""
    names = ", ".join(reasons)
    why = next(iter(reasons.values()))
    return (
        f"{names} cannot reach the package index ({why}): this machine downloads the wheels and "
        "pushes them (offline mode, as with env.offline: true)"
    )


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
