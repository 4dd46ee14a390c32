"""`bootstrap run`'s step: one shell command on a node, its output streamed line by line.

The command is the user's own text, read by the node's shell as `ssh host CMD` would; what the step
adds is what a user would otherwise meet as a bare failure: sudo asking for a password it will
never get (``become``), a WinRS shell quota met on a native Windows node (which setting, how to raise
it), and a timeout told as one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import CommandTimeoutError, ExitCode, SudoPasswordRequiredError
from orchestrator.executor import GroupResult, Outcome, exit_code_for
from orchestrator.inventory import Node
from orchestrator.logs import LineSink, PrefixedOutput, RunLog
from orchestrator.platforms import Platform
from orchestrator.platforms.windows_admin import shell_quota_error
from orchestrator.runs.ids import command_run_dir
from orchestrator.transports import Result, Transport
from orchestrator.transports.base import OnLine
from orchestrator.view import Cell, Said, View, failures

if TYPE_CHECKING:
    from orchestrator.session import Session


def run_command(
    node: Node,
    transport: Transport,
    text: str,
    *,
    env: Mapping[str, str],
    cwd: str | None,
    timeout: float | None,
    become: bool,
    keep_lines: int,
    on_line: OnLine,
) -> Result:
    """Run ``text`` on the node; a non-zero exit is the result's to tell (not an error here)."""
    result = transport.run(
        text, env=dict(env), cwd=cwd, timeout=timeout, on_line=on_line, become=become, keep_lines=keep_lines
    )
    if become and not result.ok and transport.platform.sudo_refused(result.stderr):
        raise SudoPasswordRequiredError(
            "sudo needs a password here, and bootstrap never types one",
            node=node.name,
            hint="allow passwordless sudo for this user (a line `USER ALL=(ALL) NOPASSWD: ALL` "
            "in /etc/sudoers.d/cluster-bootstrap, edited with visudo) or connect as root",
            result=result,
        )
    setting = None if result.ok else transport.platform.shell_quota(result.stderr + result.stdout)
    if setting is not None:
        raise shell_quota_error(node.name, setting, result)
    if result.timed_out:
        raise CommandTimeoutError(
            f"timed out after {timeout:g}s; the command was stopped", node=node.name, result=result
        )
    return result


def command_script(
    platform: Platform, text: str, *, env: Mapping[str, str], cwd: str | None, become: bool
) -> str:
    """``run --dry-run``: the script :func:`run_command` has the transport send."""
    return platform.wrap(text, env=dict(env), cwd=cwd, become=become)


@dataclass
class RunReport:
    """`bootstrap run` on every node: each node's result (a non-zero exit is a value, not an error),
    and where the controller kept every node's whole output."""

    outcomes: GroupResult[Result]
    log_dir: Path

    @staticmethod
    def failed(outcome: Outcome[Result]) -> bool:
        """The command ran and exited non-zero."""
        return outcome.value is not None and not outcome.value.ok

    def node_ok(self, outcome: Outcome[Result]) -> bool:
        return outcome.ok and not self.failed(outcome)

    def exit_code(self) -> ExitCode:
        return exit_code_for(self.outcomes, self.failed)

    @staticmethod
    def result(outcome: Outcome[Result]) -> str:
        """A node's result in a word or two: ``ok``, ``exit 3``, or its error's (``unreachable``)."""
        if outcome.error is not None:
            return outcome.error.status
        return (
            "ok"
            if outcome.value is not None and outcome.value.ok
            else f"exit {outcome.value.exit_code if outcome.value else '?'}"
        )

    def view(self) -> View:
        """The summary (on stderr, under the streamed lines): each node's result and time."""
        view = View("run summary", ("node", "result", "time"), stderr=True)
        for o in self.outcomes:
            result = self.result(o)
            view.add(o.node, Cell(result, "green" if result == "ok" else "red"), f"{o.duration:.2f}s")
        return view

    def printed(self) -> bool:
        """Whether any node printed anything (the log then holds it)."""
        return any(o.value is not None and o.value.stdout + o.value.stderr for o in self.outcomes)

    def said(self) -> list[View | Said]:
        """The summary, what failed, and where the output is kept (when a node printed anything)."""
        kept = [Said("note", f"output kept in {self.log_dir}")] if self.printed() else []
        return [self.view(), *failures(self.outcomes), *kept]


def run_everywhere(
    session: Session,
    text: str,
    *,
    env: Mapping[str, str],
    cwd: str | None,
    timeout: float | None,
    become: bool,
    keep_lines: int,
    printer: LineSink | None,
) -> RunReport:
    """:func:`run_command` on every node of ``session`` at once, each node's lines into a new log of
    the controller's (``runs.ids.command_run_dir``) and onto ``printer`` as ``[node] line``."""
    log = RunLog(command_run_dir(session.inventory.cluster.name))
    outputs = {n.name: PrefixedOutput(n.name, log, printer) for n in session.nodes}
    try:
        outcomes = session.map(
            lambda node, t: run_command(
                node,
                t,
                text,
                env=env,
                cwd=cwd,
                timeout=timeout,
                become=become,
                keep_lines=keep_lines,
                on_line=outputs[node.name],
            ),
            step="run",
        )
    finally:
        log.close()
    return RunReport(outcomes, log.directory)


def result_fields(outcome: Outcome[Any]) -> dict[str, Any]:
    """A node's ``--json`` fields for a command's output (``Result.public_dict``), also when it
    failed after producing some (a timeout, sudo refused: the error carries the result)."""
    result = outcome.value if outcome.value is not None else getattr(outcome.error, "result", None)
    if isinstance(result, Result):
        return result.public_dict()
    return {"exit_code": None, "duration": round(outcome.duration, 4)}
