"""How bytes reach a node: ``local`` (subprocess), ``ssh`` (fabric/paramiko), ``winrm`` (pywinrm)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from orchestrator.errors import KeyFileMissingError, UsageError
from orchestrator.platforms import platform_for_node
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
    if node.connection == "winrm":
        # Windows: PowerShell, or POSIX inside a WSL distribution (the node's mode); late imports keep
        # pywinrm out of commands that never reach a Windows node
        from orchestrator.transports.winrm import WinRMTransport

        return WinRMTransport(
            node.name,
            platform_for_node(node),
            host=node.host,
            port=node.port,
            user=node.user,
            settings=node.winrm,
            allow_insecure=node.allow_insecure,
            key_file=node.key_file,
            password=lambda: passwords.password_for(node),
            connect_timeout=ssh.connect_timeout,
        )
    try:
        # OpenSSH on Windows starts cmd.exe: the PowerShell and WSL login lines are made for it
        platform = platform_for_node(node)
    except NotImplementedError as exc:
        raise UsageError(str(exc), node=node.name, hint="set os: linux or os: windows") from None
    if node.connection == "local":
        return LocalTransport(node.name, platform)
    if node.connection == "ssh":
        from orchestrator.transports.ssh import SSHTransport

        if node.key_file and not os.path.isfile(os.path.expanduser(node.key_file)):
            # as an inventory error, before a connection is tried: paramiko's "[Errno 2] No such
            # file" read as a connection failure, exit 3, once per node
            raise KeyFileMissingError(
                f"key_file {node.key_file!r} does not exist on this machine (the private key to log in with)",
                node=node.name,
                hint="correct key_file in the inventory, or leave it out: your default keys "
                "(~/.ssh/id_ed25519, ~/.ssh/id_rsa, the agent) are tried then",
            )

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
        f"unknown connection {node.connection!r}", node=node.name, hint="use ssh, winrm or local"
    )
