"""The pieces of a WinRS shell the WinRM transport is built from: a lane (one authenticated HTTP
session and one shell), the pywinrm ``Protocol`` the inventory's settings ask for, the limits of one
command (its command line, a Send envelope), and what a command's output needs before it is text
(CRLF line ends, UTF-8 from code page 65001)."""

from __future__ import annotations

import codecs
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from winrm.protocol import Protocol

from orchestrator.errors import UsageError

if TYPE_CHECKING:
    from orchestrator.inventory import WinRMSettings
    from orchestrator.platforms import Platform
    from orchestrator.transports.winrm_diagnose import Endpoint

#: cmd.exe's limit on one command line (Microsoft's "Command prompt (Cmd.exe) command-line string
#: limitation"), which WinRS runs every command through; counted after ``%NAME%`` expansion
CMD_EXE_LIMIT = 8191
#: what WinRS puts before our line when it starts cmd.exe, at its longest plausible form (the quoted full
#: path): whether that counts against cmd.exe's limit is documented nowhere, so it is assumed to
WINRS_WRAPPING = len('"C:\\Windows\\System32\\cmd.exe" /c ')
#: room kept beyond that for what no recording shows (a longer system root, a wrapping we do not know).
#: Our lines hold no ``%`` (base64; ``cmd_command_line`` refuses it), so expansion cannot lengthen them
COMMAND_LINE_MARGIN = 128
#: the longest command line sent (8030): longer scripts are uploaded and run from the file (a platform
#: may state a lower limit as ``MAX_COMMAND_LINE``)
DEFAULT_MAX_COMMAND_LINE = CMD_EXE_LIMIT - WINRS_WRAPPING - COMMAND_LINE_MARGIN
#: smallest MaxEnvelopeSizekb a Windows host may have (150 KiB before Windows 8 / 2012; 500 since)
MAX_ENVELOPE = 150 * 1024
#: room for the SOAP header and the Send element around the payload (measured ~1.5 KiB)
ENVELOPE_OVERHEAD = 4096


def send_chunk_size(max_envelope: int = MAX_ENVELOPE, overhead: int = ENVELOPE_OVERHEAD) -> int:
    """Raw bytes per stdin Send so the envelope stays under ``max_envelope``.

    Each chunk travels as one base64 line (4/3, plus CRLF) that the Send envelope base64-encodes
    again (4/3). A multiple of 3 keeps every line free of padding.
    """
    payload = (max_envelope - overhead) * 3 // 4 - 2  # the line, once decoded from the envelope
    raw = payload * 3 // 4
    return max(3, raw - raw % 3)


def line_limit(platform: Platform) -> int:
    return min(platform.MAX_COMMAND_LINE or DEFAULT_MAX_COMMAND_LINE, DEFAULT_MAX_COMMAND_LINE)


def fits_command_line(platform: Platform, line: str) -> bool:
    """Whether ``line`` goes as it is: within :func:`line_limit`, which keeps room under cmd.exe's
    8191 characters for WinRS's own wrapping (the product's lines contain no ``%`` to expand)."""
    return len(line) <= line_limit(platform)


@dataclass
class Lane:
    """One authenticated HTTP session and one WinRS shell; used by one command at a time."""

    protocol: Protocol
    shell_id: str
    used: int = field(default=0)  # commands started in it


def new_protocol(
    settings: WinRMSettings,
    ep: Endpoint,
    *,
    password: str | None,
    key_file: str | None,
    connect_timeout: float,
    operation_timeout: int,
    read_timeout: float,
) -> Protocol:
    """pywinrm's ``Protocol`` for ``settings``: message encryption wherever HTTP carries NTLM,
    Kerberos or CredSSP, certificates checked unless the inventory says otherwise, no proxy."""
    s = settings
    if s.transport in ("ntlm", "basic", "credssp") and password is None:
        raise UsageError(
            f"winrm.transport: {s.transport} needs a password",
            node=ep.node,
            hint="set password_env: NAME (and export NAME) or password_prompt: true",
        )
    if s.scheme == "http" and s.transport in ("ntlm", "kerberos", "credssp"):
        encryption: Literal["auto", "always", "never"] = "always"
    elif s.scheme == "https":
        encryption = "auto"  # TLS already protects the messages
    else:
        encryption = "never"
    key = os.path.expanduser(key_file) if key_file else None
    kwargs: dict[str, Any] = {}
    if s.transport == "certificate":
        # one PEM file with both: Python's ssl loads the key from the certificate file as well
        kwargs.update(cert_pem=key, cert_key_pem=key)
    protocol = Protocol(
        ep.url,
        transport=s.transport,
        username=ep.user,
        password=password if password is not None else ("" if s.transport == "kerberos" else None),
        server_cert_validation="validate" if s.cert_validation else "ignore",
        ca_trust_path=os.path.expanduser(s.ca_bundle) if s.ca_bundle else None,  # type: ignore[arg-type]
        read_timeout_sec=int(read_timeout),
        operation_timeout_sec=operation_timeout,
        message_encryption=encryption,
        proxy=None,  # a LAN machine: never through a proxy from the environment
        **kwargs,
    )
    # requests takes (connect, read): the connect timeout is the user's, the read one covers
    # a Receive that the server holds for the operation timeout
    set_read_timeout(protocol, connect_timeout, read_timeout)
    return protocol


def set_read_timeout(protocol: Protocol, connect: float, read: float) -> None:
    """requests accepts (connect, read) timeouts; pywinrm passes its setting through unchanged but
    only takes one integer for both (a short connect timeout would then cut long Receives)."""
    transport: Any = protocol.transport
    transport.read_timeout_sec = (connect, read)


class Crlf:
    """CRLF to LF, also when a chunk ends between the two: Windows programs end lines with CRLF, and
    results are compared and parsed as LF text everywhere else in the product."""

    def __init__(self) -> None:
        self._cr = False

    def __call__(self, data: bytes, *, final: bool = False) -> bytes:
        if self._cr:
            data, self._cr = b"\r" + data, False
        if data.endswith(b"\r") and not final:
            data, self._cr = data[:-1], True
        return data.replace(b"\r\n", b"\n")


def utf8_decoder() -> Any:
    """An incremental UTF-8 decoder that replaces bad bytes (the shell runs with code page 65001)."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace")
