"""Plans as data: what a step will do on one node, as plain objects that ``--dry-run`` and ``--json``
print and that ``apply`` executes, the very same objects.

A ``NodePlan`` is an ordered list of actions: ``Put`` (a file's bytes to a path on the node, with its
mode) and ``Run`` (shell text in the node's dialect, with its environment, whether it runs as root,
its timeout, and whether its output is streamed). A step builds the plan from data (the inventory,
the node's facts, the rendered templates) without touching the node; ``apply`` hands each action to
the node's transport in order. What a step must decide from an action's result (a run id that ran
there before, a command that failed) it says with ``Run.check``, which ``apply`` calls after that
action: the decision stays in the step, the execution in one place.

``describe`` gives the dry-run's view of a plan on a transport: per action, the uploads with their
sizes and SHA-256, and for each ``Run`` the exact text the node's shell would get
(``transport.plan(platform.wrap(...))``). A test runs a plan against a recording transport and
checks that it received exactly what ``describe`` printed.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.transports import Result, Transport
    from orchestrator.transports.base import OnLine


@dataclass(frozen=True)
class Put:
    """A file for the node: ``data`` (bytes made here: a rendered script) or ``source`` (a local file
    as it is: the training script), written to ``target`` with ``mode`` (POSIX nodes; None: umask)."""

    target: str
    data: bytes | None = None
    source: Path | None = None
    mode: int | None = None
    what: str = ""  # a few words for humans: "launch script", "training script"

    def content(self) -> bytes:
        if self.data is not None:
            return self.data
        assert self.source is not None, "a Put has data or a source"
        return self.source.read_bytes()

    def public_dict(self) -> dict[str, Any]:
        body = self.content()
        return {
            "put": self.target,
            "what": self.what,
            "bytes": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "mode": None if self.mode is None else f"{self.mode:04o}",
            "from": str(self.source) if self.source is not None else None,
        }


@dataclass(frozen=True)
class Run:
    """Shell text for the node (its platform's dialect), run with ``env`` exported, as root when
    ``become``. ``stream``: its lines go to the output handler given to ``apply`` while it runs.
    ``check(result)`` raises when the step cannot go on (see the module docstring). ``host``: the text
    is PowerShell for the Windows machine itself, also when the node is a WSL distribution on it
    (firewall and time rules belong to Windows there; ``Transport.run_windows``)."""

    script: str
    env: Mapping[str, str] = field(default_factory=dict)
    become: bool = False
    timeout: float | None = None
    stream: bool = False
    keep_lines: int | None = None
    what: str = ""
    check: Callable[[Result], None] | None = field(default=None, compare=False)
    host: bool = False

    def public_dict(self, transport: Transport | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "run": self.script,
            "what": self.what,
            "as_root": self.become,
            "on": "windows host" if self.host else "node",
            "timeout": self.timeout,
            "env": sorted(self.env),
        }
        if transport is not None:
            doc["sent"] = sent_text(transport, self)
        return doc


Action = Put | Run


@dataclass
class NodePlan:
    """What a step will do on ``node``, in order (no actions: nothing to change there). ``detail``:
    what the step decided along with it (counts, ports), for its verdict; not sent anywhere."""

    node: str
    actions: list[Action] = field(default_factory=list)
    detail: Any = field(default=None, compare=False)

    @property
    def uploads(self) -> list[str]:
        return [a.target for a in self.actions if isinstance(a, Put)]

    @property
    def runs(self) -> list[Run]:
        return [a for a in self.actions if isinstance(a, Run)]

    def public_dict(self, transport: Transport | None = None) -> dict[str, Any]:
        return {
            "node": self.node,
            "actions": [
                a.public_dict(transport) if isinstance(a, Run) else a.public_dict() for a in self.actions
            ],
        }


def sent_text(transport: Transport, action: Run) -> str:
    """The exact text the node's shell receives for ``action`` (what ``Transport.run`` sends)."""
    platform = transport.platform.host_shell if action.host else transport.platform
    wrapped = platform.wrap(action.script, env=action.env, become=action.become)
    return transport.plan(wrapped)


def _put(transport: Transport, action: Put) -> None:
    """Send one upload. Generated content goes through a private temporary directory that lives only
    while the file is sent: a launch's plan streams for as long as the training runs, and a
    controller killed meanwhile must not leave its files behind in the temporary directory."""
    if action.source is not None:
        transport.put(action.source, action.target, mode=action.mode)
        return
    with tempfile.TemporaryDirectory(prefix="cb-plan-") as tmp:
        local = Path(tmp) / "upload"
        local.write_bytes(action.content())
        transport.put(local, action.target, mode=action.mode)


def apply(
    plan: NodePlan,
    transport: Transport,
    *,
    output: OnLine | None = None,
    before: Callable[[Run], None] | None = None,
) -> list[Result]:
    """Execute ``plan`` on ``transport``, in order; the results of its ``Run`` actions.

    ``output`` receives the lines of streamed runs; ``before(run)`` is called just before each run
    that streams (launch marks the node as started there: from then on the run may have processes)."""
    results: list[Result] = []
    for action in plan.actions:
        if isinstance(action, Put):
            _put(transport, action)
            continue
        if action.stream and before is not None:
            before(action)
        result = (transport.run_windows if action.host else transport.run)(
            action.script,
            env=action.env or None,
            become=action.become,
            timeout=action.timeout,
            on_line=output if action.stream else None,
            keep_lines=action.keep_lines,
        )
        results.append(result)
        if action.check is not None:
            action.check(result)
    return results


def plan_lines(doc: dict[str, Any], head: str, shown: Mapping[str, str] | None = None) -> list[str]:
    """One node's plan (``NodePlan.public_dict``) as every dry run prints it: each upload (what, size,
    owner-only, sha256; below it its text when ``shown`` has it), each run (as whom, what for) and
    the text the node's shell receives when the plan knows it (``sent``), else its script."""
    lines = []
    for action in doc["actions"]:
        if "put" in action:
            private = ", owner-only" if action["mode"] == "0600" else ""
            lines.append(
                f"# ---- {head}: would upload {action['put']} ({action['what']}, {action['bytes']} bytes"
                f"{private}, sha256 {action['sha256']})"
            )
            lines += [shown[action["put"]]] if shown and action["put"] in shown else []
            continue
        host = action["on"] == "windows host"
        who = ("as an administrator" if host else "as root") if action["as_root"] else "as the login user"
        what = f" ({action['what']})" if action["what"] else ""
        lines.append(f"# ---- {head}: would run{' on the Windows host' if host else ''} {who}{what}:")
        lines.append(action.get("sent", action["run"]))
    return lines
