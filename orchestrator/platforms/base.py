"""What the shell on the other end speaks.

A platform turns *intent* (run this argv, with this environment, in this directory, as root) into the
exact text a node's shell executes. Transports move that text; nothing else in the product builds shell
syntax (Ansible keeps the same split: connection plugins vs shell plugins).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.platforms.transfer import GET_CHUNK

if TYPE_CHECKING:
    from orchestrator.platforms.posix import PosixShell
    from orchestrator.platforms.powershell import PowerShell

#: exit code of a script that refused a directory another user could have planted or can change
#: (``new_private_dir``, ``check_own_dir``): its one stderr line says which, whose, and what to do.
#: 77 is sysexits' EX_NOPERM.
UNSAFE_DIR_EXIT = 77

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def check_env_name(name: str) -> str:
    """Environment variable names are identifiers on every platform we drive."""
    if not _ENV_NAME.match(name):
        raise ValueError(f"invalid environment variable name {name!r}: use letters, digits and '_'")
    return name


@dataclass(frozen=True)
class ScriptFile:
    """A script too long for one command line, as it is uploaded to run from a file."""

    data: bytes  # the file's bytes
    suffix: str  # the end of its name (a new file in the node's temporary directory)
    mode: int | None  # its permission bits where the node has them


class Platform(ABC):
    """Shell dialect of a node: everything a transport asks of the shell is declared here."""

    #: short name shown to users and in --json ("posix", "powershell", ...)
    name: str
    #: the longest ``login_command`` line the node's command runner accepts (None: no limit that
    #: matters); a longer script is uploaded (``long_script``) and run with ``run_long_script``
    MAX_COMMAND_LINE: int | None = None
    #: whether a script made by ``stop_on_hangup`` stops (its whole tree) when its stdin reaches
    #: end-of-file: a transport closes that stdin before giving up on a command
    stops_on_stdin_eof: bool = False

    #: whether the node's files carry POSIX permission bits (a copy compares and sets them)
    file_modes: bool = True

    #: a Linux distribution inside WSL, entered from its Windows host (POSIX sh, Windows beside it)
    in_wsl: bool = False

    def as_posix(self) -> PosixShell | None:
        """This shell when it speaks POSIX sh (a Linux node's, or the sh inside a WSL distribution):
        what a step writing sh scripts needs; None when it does not."""
        return None

    def as_powershell(self) -> PowerShell | None:
        """This shell when it is a Windows machine's PowerShell; None when it is not."""
        return None

    @property
    def host_shell(self) -> Platform:
        """The shell of the machine itself: this one, except inside a WSL distribution, where it is
        the Windows host's PowerShell (firewall, time, ``.wslconfig``)."""
        return self

    def shell_quota(self, output: str) -> str | None:
        """The quota of the node's remote shell that a failed command's ``output`` shows it ran into
        (the setting's name, for the error's hint); None when it shows none. Only WinRS shells have
        such quotas."""
        return None

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
    def stop_on_hangup(self, script: str, *, silence: float | None = None) -> str:
        """``script`` made to stop (its whole process tree) when the transport's stdin closes, or,
        with ``silence``, when no byte came on that stdin for that many seconds (the transport
        writes a heartbeat byte far more often while the command runs): a controller cut off by
        the network."""

    @staticmethod
    def sudo_refused(stderr: str) -> bool:
        """``stderr`` says sudo wanted a password (which bootstrap never types). Only POSIX shells
        elevate with sudo; elsewhere elevation fails in its own way."""
        return False

    @abstractmethod
    def login_command(self, script: str) -> str:
        """The one line a remote login shell executes to run ``script`` unchanged."""

    @abstractmethod
    def record_functions(self, nonce: str) -> str:
        """Definitions that let the rest of a script print framed records (orchestrator/records.py)
        carrying ``nonce``: the node-side encoder in this shell's dialect."""

    @abstractmethod
    def sectioned(self, sections: Sequence[tuple[str, str]], token: str) -> str:
        """One script running every ``(name, command)`` in turn, each answering with one record (nonce
        ``token``, orchestrator/records.py) ``section NAME DATA`` once it ended, DATA its output, a NUL
        and its exit code, so one round trip gathers many facts (facts/base.py reads them)."""

    @abstractmethod
    def transfer_path(self, path: str) -> str:
        """``path`` as a file-transfer protocol (SFTP) expects it: no shell expansion happens there."""

    @abstractmethod
    def local_argv(self, script: str) -> list[str]:
        """The argv that runs ``script`` on the controller's own machine (``connection: local``)."""

    # -- files through a command (see platforms/transfer.py for the protocol) -------------------------

    @abstractmethod
    def upload_script(
        self, remote: str | None, expected_sha256: str, *, mode: int | None = None, suffix: str = ".tmp"
    ) -> str:
        """The script that writes its stdin (base64 lines) to ``remote`` (None: a new file in the
        node's temporary directory, its name ending in ``suffix``), renamed into place only when the
        SHA-256 of what arrived is ``expected_sha256``; prints ``sha256 HEX`` and ``path P``.
        ``mode``: the file's permission bits where the node has them (see ``Transport.put``)."""

    @abstractmethod
    def download_script(self, remote: str, chunk: int = GET_CHUNK) -> str:
        """The script printing ``size N``, ``data BASE64`` lines (``chunk`` bytes each at most) and
        ``sha256 HEX`` for the file ``remote``."""

    @abstractmethod
    def remove_file(self, remote: str) -> str:
        """The script deleting the file ``remote`` (no error when it is gone already)."""

    @abstractmethod
    def long_script(self, script: str) -> ScriptFile:
        """``script`` as a file to upload when its ``login_command`` is too long for one line."""

    @abstractmethod
    def run_long_script(self, path: str, script: str) -> str:
        """The command line running ``script`` once uploaded (``long_script``) to ``path``."""
