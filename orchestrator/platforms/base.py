"""What the shell on the other end speaks.

A platform turns *intent* (run this argv, with this environment, in this directory, as root) into the
exact text a node's shell executes. Transports move that text; nothing else in the product builds shell
syntax (Ansible keeps the same split: connection plugins vs shell plugins).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def check_env_name(name: str) -> str:
    """Environment variable names are identifiers on every platform we drive."""
    if not _ENV_NAME.match(name):
        raise ValueError(f"invalid environment variable name {name!r}: use letters, digits and '_'")
    return name


class Platform(ABC):
    """Shell dialect of a node."""

    #: short name shown to users and in --json ("posix", "powershell", ...)
    name: str

    @abstractmethod
    def quote(self, value: str) -> str:
        """One argument, quoted so the shell passes it through unchanged."""

    def join(self, argv: Sequence[str]) -> str:
        """A command line whose words reach the program exactly as given."""
        return " ".join(self.quote(a) for a in argv)

    def path_word(self, path: str) -> str:
        """``path`` as one word of this shell, with ``~`` meaning the user's home on the node."""
        return self.quote(path)

    @abstractmethod
    def wrap(
        self,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        become: bool = False,
    ) -> str:
        """The script (in this platform's shell) that runs ``command`` (shell text) with ``env``
        exported, inside ``cwd``, optionally as root."""

    @abstractmethod
    def stop_on_hangup(self, script: str, *, heartbeat: float | None = None) -> str:
        """``script`` made to stop (its whole process tree) when the transport's stdin closes, or,
        with ``heartbeat`` (seconds between the bytes the transport writes to that stdin while the
        command runs), when three heartbeats are missed: a controller cut off by the network."""

    @abstractmethod
    def login_command(self, script: str) -> str:
        """The one line a remote login shell executes to run ``script`` unchanged."""

    @abstractmethod
    def sectioned(self, sections: Sequence[tuple[str, str]], token: str) -> str:
        """One script running every ``(name, command)`` in turn, each section's stdout framed by
        markers carrying ``token`` and its exit code, so one round trip gathers many facts."""

    @abstractmethod
    def transfer_path(self, path: str) -> str:
        """``path`` as a file-transfer protocol (SFTP) expects it: no shell expansion happens there."""
