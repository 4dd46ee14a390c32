"""`bootstrap keys`: first contact with nodes that accept only a password (ssh-copy-id, verified).

Installs the controller's public key in the node user's ~/.ssh/authorized_keys (once: an existing
line is left alone), records the node's host key, then proves key login works with that key alone.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from orchestrator.errors import CancelledError, CommandFailedError, ExitCode, SecretMissingError
from orchestrator.executor import GroupResult, exit_code_for
from orchestrator.inventory import PasswordResolver
from orchestrator.platforms import PosixShell
from orchestrator.transports import SSHOptions, Transport
from orchestrator.view import Cell, CellLike, red

if TYPE_CHECKING:
    from orchestrator.executor import NodeEvent
    from orchestrator.inventory import Inventory, Node

DEFAULT_KEY = "~/.ssh/id_ed25519"


@dataclass
class ControllerKey:
    private: Path
    public_line: str
    generated: bool


def ensure_controller_key(path: str = DEFAULT_KEY) -> ControllerKey:
    """The controller's key pair, generated (ed25519, no passphrase, mode 0600) when missing."""
    private = Path(os.path.expanduser(path))
    public = private.with_name(private.name + ".pub")
    generated = False
    if not private.exists():
        key = Ed25519PrivateKey.generate()
        private.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        line = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        public.write_text(line.decode() + " cluster-bootstrap\n")
        generated = True
    if not public.exists():
        raise CommandFailedError(
            f"{private} exists but {public} does not",
            hint=f"recreate it with `ssh-keygen -y -f {private} > {public}`",
        )
    return ControllerKey(private=private, public_line=public.read_text().strip(), generated=generated)


@dataclass
class KeyInstall:
    status: str  # "added" or "present"; "" when the node failed after its host key was recorded
    verified: bool
    recorded_host_keys: list[str]

    def row(self) -> tuple[CellLike, ...]:
        """The keys table's cells: added or present, whether key login was proven, host keys recorded
        (also for a node that failed after its host key was checked: that key is in known_hosts now)."""
        if not self.status:
            return (red("failed"), "-", "\n".join(self.recorded_host_keys) or "already known")
        verified = Cell("verified", "green") if self.verified else red("FAILED")
        return (self.status, verified, "\n".join(self.recorded_host_keys) or "already known")

    def public_dict(self) -> dict[str, object]:
        return {
            "status": self.status,
            "verified": self.verified,
            "recorded_host_keys": self.recorded_host_keys,
        }


def install_key(node: Node, transport: Transport, key: ControllerKey, ssh: SSHOptions) -> KeyInstall:
    """Install ``key`` on the node over ``transport`` (password login), then verify key-only login."""
    platform = transport.platform.as_posix()
    if platform is None:
        raise CommandFailedError("installing keys is supported on Linux nodes only", node=node.name)
    if _logs_in(node, platform, key, ssh):  # as ssh-copy-id: nothing written where the key works
        return KeyInstall("logs in already", True, list(transport.recorded_host_keys))
    result = transport.run(platform.ensure_authorized_key(key.public_line), timeout=30)
    status = result.stdout.strip().splitlines()[-1] if result.ok and result.stdout.strip() else ""
    if status not in ("added", "present"):
        raise CommandFailedError(
            f"could not update ~/.ssh/authorized_keys (exit code {result.exit_code}): "
            + " | ".join(result.tail(3)),
            node=node.name,
        )
    recorded = list(transport.recorded_host_keys)
    # Prove it: a fresh connection with this key only (no agent, no other keys, no password).
    return KeyInstall(status=status, verified=_logs_in(node, platform, key, ssh), recorded_host_keys=recorded)


def _logs_in(node: Node, platform: PosixShell, key: ControllerKey, ssh: SSHOptions) -> bool:
    """Whether ``key`` alone logs in to ``node`` (no agent, no other key, no password): the host key
    checked against what is recorded (``ssh`` accepts nothing new)."""
    from orchestrator.errors import BootstrapError
    from orchestrator.transports.ssh import SSHTransport

    check = SSHTransport(
        node.name,
        platform,
        host=node.host,
        port=node.port,
        user=node.user,
        key_file=str(key.private),
        password=lambda: None,
        options=ssh,
        identities_only=True,
    )
    try:
        check.connect()
        return check.run("true", timeout=30).ok
    except BootstrapError:
        return False
    finally:
        check.close()


def key_nodes(nodes: list[Node]) -> tuple[list[Node], list[str]]:
    """The nodes `keys` works on (reached over SSH) and the names of the others (skipped)."""
    return [n for n in nodes if n.connection == "ssh"], [n.name for n in nodes if n.connection != "ssh"]


def needs_shared_password(nodes: list[Node]) -> bool:
    """Nodes with no password setting share one password, asked once (like ssh-copy-id in a loop)."""
    return any(not n.password_env and not n.password_prompt for n in nodes)


class KeysPasswords(PasswordResolver):
    """`keys` logs in with passwords: a node's own setting (``password_env``, ``password_prompt``)
    through ``own``, else the one ``shared`` password; none: the node fails saying what to do."""

    def __init__(self, own: PasswordResolver, shared: str | None) -> None:
        super().__init__(prompt=None)
        self._own, self._shared = own, shared

    def password_for(self, node: Node) -> str | None:
        if node.password_env or node.password_prompt:
            return self._own.password_for(node)
        if self._shared is None:
            raise SecretMissingError(
                "`bootstrap keys` logs in with the node's password, and none is available",
                node=node.name,
                hint="set password_env: VAR on the node (and export VAR), or run from a terminal to be asked",
            )
        return self._shared


def authorize_script(key_path: str) -> str:
    """``keys --dry-run``: the script ``install_key`` sends, the public key named by its file."""
    public = os.path.expanduser(key_path) + ".pub"
    return PosixShell().wrap(PosixShell().ensure_authorized_key(f"<contents of {public}>"))


def install_all(
    inventory: Inventory,
    nodes: list[Node],
    key: ControllerKey,
    ssh: SSHOptions,
    passwords: PasswordResolver,
    *,
    forks: int,
    on_event: Callable[[NodeEvent], None] | None = None,
) -> GroupResult[KeyInstall]:
    """:func:`install_key` on every node, in a session of its own logged in with ``passwords``: host
    keys are checked before a password is sent (unknown ones accepted only with ``ssh``'s
    ``accept_new_host_keys``), and the key login then against the host keys recorded, nothing new."""
    from orchestrator.session import Session

    check = dataclasses.replace(ssh, accept_new_host_keys=False)
    with Session(inventory, nodes, ssh=ssh, passwords=passwords, max_workers=forks, on_event=on_event) as on:
        done = on.map(lambda n, t: install_key(n, t, key, check), step="keys")
        by_name = {n.name: n for n in nodes}
        for o in done:  # a node that failed after its host key was recorded (no password): say so
            if o.value is not None or isinstance(o.error, CancelledError):
                continue
            recorded = list(on.transport(by_name[o.node]).recorded_host_keys)
            if recorded:
                o.value = KeyInstall(status="", verified=False, recorded_host_keys=recorded)
        return done


def keys_exit_code(outcomes: GroupResult[KeyInstall]) -> ExitCode:
    """1 also when a key was installed but logging in with it alone failed."""
    return exit_code_for(outcomes, lambda o: o.value is not None and not o.value.verified)
