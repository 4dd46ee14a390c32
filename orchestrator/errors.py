"""One exception hierarchy and the exit codes it maps to.

Library code raises these; only ``orchestrator.cli`` turns them into printed messages and process exit
codes (pip's ``status_codes`` idea: the mapping lives in one place). Every error names the node or file
it is about, says what was tried, and says what to do next (``hint``).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable

from orchestrator.redact import mask_url_credentials


class ExitCode(enum.IntEnum):
    """Process exit codes of ``bootstrap`` (documented in docs/cli.md)."""

    OK = 0
    NODES_FAILED = 1  # at least one node failed a step or a command exited non-zero
    USAGE = 2  # bad command line or inventory: nothing was done
    CONNECTION = 3  # at least one node could not be reached, authenticated or verified
    INTERRUPTED = 130  # Ctrl-C / SIGINT (128 + 2, as shells report it)
    TERMINATED = 143  # SIGTERM (128 + 15): handled like Ctrl-C (nodes stopped, summary), then this


class Terminated(KeyboardInterrupt):
    """SIGTERM to the controller (a service manager, `kill`, a CI timeout): raised in the main thread
    so that every path that handles Ctrl-C (stop the nodes, sweep, summary) handles it too."""


class BootstrapError(Exception):
    """Base of every error the product reports to a user."""

    exit_code: ExitCode = ExitCode.NODES_FAILED
    #: a few words for a summary table's cell (the full message follows the table)
    status = "failed"

    def __init__(self, message: str, *, node: str | None = None, hint: str | None = None) -> None:
        # a URL's login never reaches a terminal, a log or --json through an error
        message = mask_url_credentials(message)
        super().__init__(message)
        self.message = message
        self.node = node
        self.hint = None if hint is None else mask_url_credentials(hint)
        # told to the user already: an error met again by a later phase (a login the node refused,
        # kept by its transport) is not printed again; tables and --json still list it everywhere
        self.shown = False

    def __str__(self) -> str:
        prefix = f"node {self.node!r}: " if self.node else ""
        text = f"{prefix}{self.message}"
        if self.hint:
            text += f" ({self.hint})"
        return text


def said_once(errors: Iterable[BootstrapError]) -> list[str]:
    """Each error's line, in order; errors alike but for their node (the same pip failure on every
    node of a cluster with no index; "no run R" where each node's path ends in its own name) as one
    line that names them all, a path's node name written ``<node>``."""
    groups: dict[tuple[type, str, str | None], list[BootstrapError]] = {}
    for error in errors:
        groups.setdefault((type(error), _any_node(error.message, error.node), error.hint), []).append(error)
    lines = []
    for (_, message, hint), group in groups.items():
        if len(group) == 1 or not all(e.node for e in group):
            lines += [str(e) for e in group]
            continue
        nodes = ", ".join(repr(e.node) for e in group)
        lines.append(f"nodes {nodes}: {message}" + (f" ({hint})" if hint else ""))
    return lines


def _any_node(message: str, node: str | None) -> str:
    """``message`` with ``node``'s name as a path component (``.../runs/R/node2/...``) written ``<node>``."""
    if not node:
        return message
    return re.sub(rf"(?<=/){re.escape(node)}(?=[/\s),:]|$)", "<node>", message)


class UsageError(BootstrapError):
    """A command-line mistake: nothing was done."""

    exit_code = ExitCode.USAGE


class SetupError(UsageError):
    """What must change is the inventory or this machine, not the node: a command whose nodes all
    failed with these (or were cancelled) exits 2, like bad input, not 1 (executor.exit_code_for)."""


class UnsafeDirectoryError(SetupError):
    """A node's run directory (or a directory above it) that another user could have planted or can
    change: refused before anything there is written, read or signalled. Exit 2, like bad input: the
    workdir is what has to change."""


class KeyFileMissingError(SetupError):
    """A node's ``key_file`` that is not on this machine: said before any connection is tried."""


class InventoryIssue:
    """One problem found in an inventory file, with where it is."""

    __slots__ = ("field", "file", "line", "message", "node")

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        node: str | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.node = node
        self.field = field

    def __str__(self) -> str:
        where = self.file or "<inventory>"
        if self.line is not None:
            where += f":{self.line}"
        parts = [where]
        if self.node:
            parts.append(f"node {self.node!r}")
        if self.field:
            parts.append(f"field {self.field!r}")
        return ": ".join(parts) + f": {self.message}"

    def __repr__(self) -> str:
        return f"InventoryIssue({str(self)!r})"


class InventoryError(BootstrapError):
    """The inventory cannot be used. Carries every issue found, each one line."""

    exit_code = ExitCode.USAGE

    def __init__(self, issues: list[InventoryIssue]) -> None:
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))

    def __str__(self) -> str:
        return self.message


class ConnectError(BootstrapError):
    """A node could not be reached, authenticated or verified."""

    status = "connection failed"

    exit_code = ExitCode.CONNECTION


class UnreachableError(ConnectError):
    status = "unreachable"


class AuthenticationError(ConnectError):
    status = "auth failed"


class HostKeyUnknownError(ConnectError):
    """The node's host key is not in known_hosts (trust on first use must be asked for)."""

    status = "unknown host key"

    def __init__(
        self,
        message: str,
        *,
        node: str | None,
        hint: str | None,
        fingerprint: str,
        host: str = "",
        key_type: str = "",
        known_hosts: str = "",
    ) -> None:
        super().__init__(message, node=node, hint=hint)
        self.fingerprint = fingerprint
        self.host = host
        self.key_type = key_type
        self.known_hosts = known_hosts


class HostKeyChangedError(ConnectError):
    """The node offered a key different from the recorded one: always refused."""

    status = "HOST KEY CHANGED"


class HostKeyRevokedError(ConnectError):
    """The node offered a key that known_hosts lists as ``@revoked``: always refused, even with
    ``--accept-new-host-keys`` (exit code 3, as for a changed key)."""

    status = "HOST KEY REVOKED"


class SecretMissingError(ConnectError):
    """A password was needed but neither its environment variable nor a terminal prompt gave one."""

    status = "no password"


class CancelledError(BootstrapError):
    """Work on a node was cut short because the user interrupted (or a fail-fast stop)."""

    status = "cancelled"

    exit_code = ExitCode.INTERRUPTED


class RunStoppedError(CancelledError):
    """The run was stopped on purpose by the operator (`bootstrap stop --run` from another terminal):
    not a failure of the node, reported as stopped, with Ctrl-C's exit code."""

    status = "stopped"


class CommandFailedError(BootstrapError):
    """A command ran on a node and failed. ``result`` keeps what it printed, when it ran at all."""

    def __init__(
        self, message: str, *, node: str | None = None, hint: str | None = None, result: object = None
    ):
        super().__init__(message, node=node, hint=hint)
        self.result = result


class SudoPasswordRequiredError(CommandFailedError):
    """``sudo -n`` refused because sudo wants a password on that node."""

    status = "sudo refused"


class CommandTimeoutError(CommandFailedError):
    status = "timeout"


class TransferError(CommandFailedError):
    pass
