"""`bootstrap sync`, environment half: the same pinned Python environment on every node, fast when
nothing changed, never half-installed.

Per node (see docs/sync.md):

1. **probe** (one round trip, a read): the node's Python (version, wheel platform tags), uv on PATH,
   the managed venv's stamp and installed versions (offline: the node's wheelhouse listing). When the
   stamp's key equals the key the controller computes (requirements + index options + Python version
   + platform + installer setting) and the pinned versions are installed, the node is done.
2. **plan** otherwise (build.py): every value decided on the controller (the build's id, its stamp,
   the nonce of its records, the wheels to push) into a ``plans.NodePlan``: read the shared-directory
   markers, create the build's directory, upload the requirements and the index settings, run the
   build script (a new venv beside the active one, a hard-link clone of it when only versions
   changed; installed, stamped, then an atomic switch of the stable path). ``--dry-run`` prints
   that plan; the real run applies the same object. A failure removes the new build: the previous
   venv stays active.
3. **report**: the installed versions (from the probe, or the build's ``installed`` record),
   compared across nodes by :func:`orchestrator.steps.envsync.report.summarize`.

This module drives those steps over the session's nodes (:func:`sync_env`). The probe is
``probe.py``, the plan and its application ``build.py``, the exact commands each OS runs ``ops.py``,
what a node gets ``spec.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.executor import Outcome
from orchestrator.facts import SESSION_KEY_PREFIX
from orchestrator.steps.envsync.build import EnvInstallError, EnvPlan, apply_node, plan_node
from orchestrator.steps.envsync.probe import EnvSharedError, probe_node
from orchestrator.steps.envsync.report import EnvReport, NodeEnv, NodeVersions, summarize
from orchestrator.steps.envsync.spec import EnvSpec, env_path, resolve_spec

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.transports import Transport

__all__ = [
    "EnvInstallError",
    "EnvReport",
    "EnvSharedError",
    "EnvSpec",
    "NodeEnv",
    "env_path",
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
    are in the outcomes. Compare the result with :func:`summarize_outcomes` (``.mismatch``: the
    environments differ, fail the run).

    Every node is probed and its build planned first (one round trip: an unchanged node is done),
    then the plans are applied. Between the two, every probe has left this sync's marker beside its
    environment: a plan first reads the markers, and a node finding another's (a shared directory)
    is refused before it installs anything. ``on_progress(node, activity, detail)`` is called from
    worker threads as each node moves on. With ``dry_run`` the probe only reads (no marker, no
    request to the index) and each planned node's value holds its plan (``NodeEnv.plan``, action
    ``planned``): exactly what the real run applies when the node has not changed meanwhile.

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
    chosen_specs = specs
    # this sync's markers (several nodes: shared directories); a dry run writes none
    tokens = {n.name: new_marker_token() for n in chosen} if len(chosen) > 1 else {}

    def reporter(node: Node) -> Callable[[str, str], None]:
        def report(activity: str, detail: str) -> None:
            if on_progress is not None:
                on_progress(node.name, activity, detail)

        return report

    # nodes that found no index: told in one line, also when planning then failed for them (this
    # machine's download of their wheels: the reason is what the user needs first)
    fallback: dict[str, object] = {}

    def read_and_plan(node: Node, transport: Transport) -> NodeEnv | EnvPlan:
        spec = chosen_specs[node.python_os]
        probed = probe_node(
            node,
            transport,
            spec,
            force=force,
            token=None if dry_run else tokens.get(node.name),
            check_index=not dry_run,
            progress=reporter(node),
        )
        if probed.env is not None:
            return probed.env
        if probed.offline_reason:
            fallback[node.name] = probed.offline_reason
        return plan_node(
            node, transport, probed.spec or spec, probed, force=force, tokens=tokens, progress=reporter(node)
        )

    planned = session.map(read_and_plan, step="env check", nodes=chosen)
    waiting = {o.node: o.value for o in planned if isinstance(o.value, EnvPlan)}
    fallback = {n.name: fallback[n.name] for n in chosen if n.name in fallback}  # in node order
    if fallback and on_notice is not None:
        on_notice(offline_notice({n: str(why) for n, why in fallback.items()}))
    if dry_run:
        return [_shown(o, session) for o in planned]

    def build(node: Node, transport: Transport) -> NodeEnv:
        ready = waiting[node.name]
        env = apply_node(ready, transport, on_line=on_line, progress=reporter(node))
        env.offline_reason = ready.probed.offline_reason
        env.plan = ready.plan.public_dict(transport)
        # its Python and torch changed: later phases ask for its facts again (not for its firewall)
        session.forget(node.name, *[k for k in session.keys(node.name) if k.startswith(SESSION_KEY_PREFIX)])
        return env

    built: dict[str, Outcome[NodeEnv]] = {}
    if waiting:
        builders = [n for n in chosen if n.name in waiting]
        built = {o.node: o for o in session.map(build, step="env build", nodes=builders)}
    merged: list[Outcome[NodeEnv]] = []
    for first in planned:
        second = built.get(first.node)
        if isinstance(first.value, NodeEnv):
            merged.append(Outcome(first.node, first.value, None, first.duration, first.finished))
        elif second is not None:
            merged.append(
                Outcome(
                    second.node, second.value, second.error, first.duration + second.duration, second.finished
                )
            )
        else:
            merged.append(Outcome(first.node, None, first.error, first.duration, first.finished))
    return merged


def _shown(outcome: Outcome[NodeEnv | EnvPlan], session: Session) -> Outcome[NodeEnv]:
    """A dry run's outcome: the node as it is (unchanged), or the build planned for it."""
    value = outcome.value
    if not isinstance(value, EnvPlan):
        return Outcome(outcome.node, value, outcome.error, outcome.duration, outcome.finished)
    node, found = value.node, value.probed.found
    env = NodeEnv(
        node=node.name,
        os=node.python_os,
        action="planned",
        path=value.probed.path,
        python_path=value.probed.ops.venv_python(value.probed.path),
        python=found.python_version,
        installer=value.installer,
        env_id=value.build.build_id,
        wheels_pushed=len(value.wheels),
        notes=value.notes,
        plan=value.plan.public_dict(session.transport(node)),
    )
    return Outcome(outcome.node, env, None, outcome.duration, outcome.finished)


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


def summarize_outcomes(outcomes: list[Outcome[NodeEnv]]) -> EnvReport:
    """Distinct environments among the nodes that synced (failed nodes have none to compare)."""
    envs = [
        NodeVersions(o.value.node, o.value.os, o.value.python, o.value.packages)
        for o in outcomes
        if o.value is not None and o.value.action != "planned"
    ]
    return summarize(envs)
