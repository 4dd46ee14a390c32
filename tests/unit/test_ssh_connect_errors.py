"""What a node that cannot be reached is told as (transports/ssh.py ``_explain``): one line saying
why, not paramiko's ``[Errno None] Unable to connect to port 22``."""

from __future__ import annotations

import errno

import paramiko

from orchestrator.platforms import PosixShell
from orchestrator.transports.options import SSHOptions
from orchestrator.transports.ssh import SSHTransport


def _transport() -> SSHTransport:
    return SSHTransport(
        "node3",
        PosixShell(),
        host="198.18.0.13",
        port=22,
        user="root",
        key_file=None,
        password=lambda: None,
        options=SSHOptions(),
    )


def _refused(code: int) -> paramiko.ssh_exception.NoValidConnectionsError:
    return paramiko.ssh_exception.NoValidConnectionsError(
        {("198.18.0.13", 22): OSError(code, "Unable to connect")}
    )


def test_a_node_whose_address_answers_no_arp_is_no_route_naming_the_node() -> None:
    said = _transport()._explain(_refused(errno.EHOSTUNREACH))
    assert said.node == "node3"
    assert said.message == "no route to 198.18.0.13:22: No route to host", said.message
    assert "powered on" in (said.hint or "")


def test_nothing_listening_is_still_connection_refused() -> None:
    said = _transport()._explain(_refused(errno.ECONNREFUSED))
    assert said.message.startswith("connection refused on 198.18.0.13:22"), said.message
