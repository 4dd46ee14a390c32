"""Steps that change a node's system configuration run as root: one way to do it, one message when
sudo wants a password (bootstrap never types one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.errors import SudoPasswordRequiredError

if TYPE_CHECKING:
    from orchestrator.inventory import Node
    from orchestrator.transports import Result, Transport


def sudo_error(node: Node, result: Result, what: str) -> SudoPasswordRequiredError:
    user = node.user or "this user"
    return SudoPasswordRequiredError(
        f"{what} needs root, and sudo wants a password here (bootstrap never types one)",
        node=node.name,
        hint=f"on {node.name}, as root: `echo '{user} ALL=(root) NOPASSWD: ALL' > "
        "/etc/sudoers.d/cluster-bootstrap && chmod 440 /etc/sudoers.d/cluster-bootstrap` "
        "(check it with `visudo -c`), or connect as root; then rerun",
        result=result,
    )


def run_as_root(node: Node, transport: Transport, script: str, what: str, timeout: float) -> Result:
    """``script`` as root (the platform's ``become``: sudo -n for other users); a refused sudo raises
    :class:`SudoPasswordRequiredError` naming the node, ``what`` was being done and the fix."""
    result = transport.run(script, become=True, timeout=timeout)
    platform = transport.platform
    if not result.ok and platform.sudo_refused(result.stderr):
        raise sudo_error(node, result, what)
    return result
