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
    keepalive: int = 5  # seconds between keepalives; a peer silent for 3 of them is given up (15 s)
    ssh_config: Path | None = None  # None: ~/.ssh/config (and /etc/ssh/ssh_config)
