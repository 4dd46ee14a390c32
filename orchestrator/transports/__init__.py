"""How bytes reach a node: ``local`` (subprocess), ``ssh`` (fabric/paramiko), ``winrm`` (later)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.errors import UsageError
from orchestrator.platforms import platform_for
from orchestrator.transports.base import LineSplitter, OnLine, Result, Stream, Transport
from orchestrator.transports.local import LocalTransport
from orchestrator.transports.options import SSHOptions

if TYPE_CHECKING:
    from orchestrator.inventory import Node, PasswordResolver
    from orchestrator.transports.ssh import SSHTransport, fingerprint


def __getattr__(name: str) -> object:
    # paramiko + fabric cost ~0.3 s to import: only commands that reach SSH nodes pay for them
    if name in ("SSHTransport", "fingerprint"):
        from orchestrator.transports import ssh

        return getattr(ssh, name)
    raise AttributeError(name)


__all__ = [
    "LineSplitter",
    "LocalTransport",
    "OnLine",
    "Result",
    "SSHOptions",
    "SSHTransport",
    "Stream",
    "Transport",
    "fingerprint",
    "open_transport",
]


def open_transport(node: Node, *, ssh: SSHOptions, passwords: PasswordResolver) -> Transport:
    """The (not yet connected) transport for ``node``, as its inventory entry asks."""
    try:
        platform = platform_for(node.os)
    except NotImplementedError as exc:
        raise UsageError(
            str(exc), node=node.name, hint="Windows support arrives with the WinRM transport"
        ) from None
    if node.connection == "local":
        return LocalTransport(node.name, platform)
    if node.connection == "ssh":
        from orchestrator.transports.ssh import SSHTransport

        return SSHTransport(
            node.name,
            platform,
            host=node.host,
            port=node.port,
            user=node.user,
            key_file=node.key_file,
            password=lambda: passwords.password_for(node),
            options=ssh,
        )
    raise UsageError(
        f"connection {node.connection!r} is not supported yet",
        node=node.name,
        hint="use connection: ssh (OpenSSH on Windows works) until WinRM support lands",
    )
