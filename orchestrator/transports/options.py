"""Controller-side connection settings (kept apart from the transports: importing paramiko is slow)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SSHOptions:
    """Controller-side SSH settings shared by every node."""

    known_hosts: Path | None = None  # None: ssh config UserKnownHostsFile, else ~/.ssh/known_hosts
    accept_new_host_keys: bool = False  # record unknown keys (trust on first use); changed keys never
    connect_timeout: float | None = None  # None: ssh config ConnectTimeout, else 10 s
    #: a node that stops answering is given up at most keepalive + unacknowledged seconds after it
    #: went silent: a keepalive (or a heartbeat) is written within ``keepalive`` seconds, and the
    #: kernel drops a connection whose sent data stays unacknowledged for ``unacknowledged``
    #: seconds (TCP_USER_TIMEOUT). Acknowledgements come from the node's kernel, so a busy node is
    #: never mistaken for a lost one; only a network that carries nothing for 10 s is.
    keepalive: int = 2
    unacknowledged: float = 10.0
    ssh_config: Path | None = None  # None: ~/.ssh/config (and /etc/ssh/ssh_config)
