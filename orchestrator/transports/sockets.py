"""TCP options of the SSH transport's connection (each one measured or needed by an issue)."""

from __future__ import annotations

import socket

__all__ = ["limit_unacknowledged", "no_delay"]


def limit_unacknowledged(sock: object, seconds: float) -> None:
    # paramiko's keepalives expect no answer: a node that vanished (power cut, cable, `ip link set
    # down`) would leave a command waiting for minutes (70-100 s with 15 s keepalives: issue 17).
    # TCP_USER_TIMEOUT makes the kernel drop the connection when sent data (keepalives, heartbeats)
    # stays unacknowledged this long.
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is not None and isinstance(sock, socket.socket):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, option, int(seconds * 1000))
        except OSError:
            pass


def no_delay(sock: object) -> None:
    # Every command is a few small messages each way (channel open, exec, window adjusts, exit
    # status). With Nagle's algorithm on, a message sent while the previous one is unacknowledged
    # waits for the peer's delayed ACK (40 ms on Linux): about 50 ms per command, measured
    # (benchmarks/pipeline.py). OpenSSH's own client turns it off for the same reason.
    if isinstance(sock, socket.socket):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
