"""``connection: winrm``: Windows nodes through WS-Management (pywinrm's low-level ``Protocol``).

Why the low-level protocol: ``Session.run_ps`` returns only when the command has ended, and the
product streams training logs line by line. Here each Receive round (one ``get_command_output_raw``)
hands its bytes to a :class:`LineSplitter` at once, so lines reach ``on_line`` while the command runs.

Shells are reused: a *lane* is one authenticated HTTP session plus one WinRS shell. A transport keeps
an idle lane for the next command; two commands running at the same time on one node get two lanes
(a shell runs one command at a time, and NTLM message encryption numbers every message of a session,
so two threads must never share one). Timeouts and cancellation terminate the command and delete its
shell: Windows ends every process the shell started (the shell's job object), so nothing is left
running. Cancellation is noticed between Receive rounds, which last at most :attr:`POLL_SECONDS`.

Files go through stdin (WinRS ``Send``) of one PowerShell process per file rather than one command
per chunk: a command line holds about 2 KiB of payload after base64 and UTF-16 encoding, a Send
envelope about 80 KiB, and every command starts a new ``powershell.exe`` (hundreds of milliseconds on
Windows). Both sides compute SHA-256 and the results are compared; files are written under a
temporary name and renamed only when the hashes agree.

On a WSL-mode node the platform is a :class:`~orchestrator.platforms.wsl.WslShell`: commands (and
file transfers) run with ``/bin/sh`` inside the distribution through ``wsl.exe``; ``run_windows``
runs PowerShell on the Windows side of the same machine. Every shell is opened with ``WSL_UTF8=1``
(wsl.exe's own messages in UTF-8), and what a wsl.exe command prints goes through
:class:`~orchestrator.platforms.wsl.WslOutput`, which decodes the UTF-16LE an older wsl.exe writes.
"""

from __future__ import annotations

import base64
import codecs
import errno
import hashlib
import html
import math
import os
import re
import socket
import ssl
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import requests
from winrm.exceptions import (
    InvalidCredentialsError,
    WinRMError,
    WinRMOperationTimeoutError,
    WinRMTransportError,
    WSManFaultError,
)
from winrm.protocol import Protocol

from orchestrator.errors import (
    AuthenticationError,
    CancelledError,
    ConnectError,
    TransferError,
    UnreachableError,
    UsageError,
)
from orchestrator.platforms import Platform, PosixShell
from orchestrator.platforms.powershell import PowerShell
from orchestrator.platforms.wsl import ROOT_MARKER, WSL_SHELL_ENV, WslOutput, is_wsl_command
from orchestrator.transports.base import Deadline, LineSplitter, OnLine, Result, Transport, log

if TYPE_CHECKING:
    from orchestrator.inventory import WinRMSettings

#: progress of a transfer: (bytes done, bytes in all)
Progress = Callable[[int, int], None]

#: cmd.exe's limit on one command line (a platform may state its own as ``MAX_COMMAND_LINE``)
DEFAULT_MAX_COMMAND_LINE = 8191
#: smallest MaxEnvelopeSizekb a Windows host may have (150 KiB before Windows 8 / 2012; 500 since)
MAX_ENVELOPE = 150 * 1024
#: room for the SOAP header and the Send element around the payload (measured ~1.5 KiB)
ENVELOPE_OVERHEAD = 4096
#: files larger than this report progress to the log even without a callback
PROGRESS_LOG_BYTES = 8 * 1024 * 1024

# WSManFault codes (wsmerror.h) of quota violations: which setting to raise for each
_QUOTA_SETTINGS: dict[int, str] = {
    0x803381A5: "MaxShellsPerUser",  # ERROR_WSMAN_QUOTA_MAX_SHELLS
    0x803381A6: "MaxConcurrentOperationsPerUser",  # ERROR_WSMAN_QUOTA_MAX_OPERATIONS
    0x803381A7: "MaxConcurrentOperationsPerUser",  # ERROR_WSMAN_QUOTA_USER
    0x803381A8: "MaxConcurrentOperations",  # ERROR_WSMAN_QUOTA_SYSTEM
    0x803381AB: "MaxConcurrentUsers",  # ERROR_WSMAN_QUOTA_MAX_SHELLUSERS
}
# where each setting lives in `winrm set`
_QUOTA_SCOPES = {
    "MaxShellsPerUser": "winrm/config/winrs",
    "MaxConcurrentUsers": "winrm/config/winrs",
    "MaxConcurrentOperationsPerUser": "winrm/config/service",
    "MaxConcurrentOperations": "winrm/config/service",
}
_ACCESS_DENIED = 5


# -- CLIXML: how powershell.exe writes its error stream when stderr is not a console -----------------

CLIXML_HEADER = "#< CLIXML"
_ESCAPE = re.compile(r"_x([0-9A-Fa-f]{4})_")
#: prefixes PowerShell's console host puts before non-error streams
_STREAM_PREFIX = {"error": "", "warning": "WARNING: ", "verbose": "VERBOSE: ", "debug": "DEBUG: "}
_STRING_RECORD = re.compile(r'<S(?:\s+S="([^"]*)")?\s*>(.*?)</S>', re.DOTALL)


def unescape_clixml(text: str) -> str:
    """A CLIXML string value as text: XML entities, then ``_xHHHH_`` escapes (PowerShell encodes CR,
    LF and other characters XML cannot carry that way; ``_x005F_`` is a literal underscore).
    Surrogate pairs written as two escapes become one character."""
    text = html.unescape(text)
    if "_x" not in text:
        return text
    decoded = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)
    # two escapes may have produced a UTF-16 surrogate pair: join it into one code point
    return decoded.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


class ClixmlDecoder:
    """Turns a stderr stream into readable text as it arrives (chunks may split anywhere).

    Plain text passes through. After a ``#< CLIXML`` line, ``<S S="Error">`` records become their text
    (PowerShell splits each error into records ending in ``_x000D__x000A_``), warnings, verbose and
    debug records get the prefix the console would show, and progress records (``<Obj S="progress">``,
    e.g. "Preparing modules for first use.") are dropped: they are screen updates, not messages.
    """

    def __init__(self) -> None:
        self._buf = ""
        self._in_xml = False

    def feed(self, text: str) -> str:
        self._buf += text
        out: list[str] = []
        while self._buf:
            if not self._in_xml:
                start = self._buf.find(CLIXML_HEADER)
                if start < 0:
                    # keep a tail that could be the start of a header split across chunks
                    keep = _partial_suffix(self._buf, CLIXML_HEADER)
                    out.append(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                out.append(self._buf[:start])
                end = self._buf.find("\n", start)
                if end < 0:
                    self._buf = self._buf[start:]
                    break
                self._buf = self._buf[end + 1 :]
                self._in_xml = True
                continue
            consumed = self._record(out)
            if consumed == 0:
                break
            self._buf = self._buf[consumed:]
        return "".join(out)

    def _record(self, out: list[str]) -> int:
        """Consume one complete element (or whitespace) from the buffer; 0 when more input is needed."""
        buf = self._buf
        stripped = len(buf) - len(buf.lstrip())
        if stripped:
            return stripped
        if buf.startswith("</Objs>"):
            self._in_xml = False
            return len("</Objs>")
        if buf.startswith("<Objs"):
            end = buf.find(">")
            return end + 1 if end >= 0 else 0
        if buf.startswith("<S") and buf[2:3] in (" ", ">", "\t"):
            match = _STRING_RECORD.match(buf)
            if match is None:
                return 0 if "</S>" not in buf else buf.index("</S>") + 4
            stream = (match.group(1) or "error").lower()
            prefix = _STREAM_PREFIX.get(stream, "")
            text = unescape_clixml(match.group(2))
            out.append(prefix + text if prefix and text.strip() else text)
            if prefix and not text.endswith("\n"):
                out.append("\r\n")
            return match.end()
        if buf.startswith("<Obj"):
            return _element_end(buf, "Obj")
        if buf.startswith("<"):
            end = buf.find(">")
            if end < 0:
                return 0
            if buf[end - 1] == "/":
                return end + 1
            name = re.match(r"<([A-Za-z0-9_]+)", buf)
            return _element_end(buf, name.group(1)) if name else end + 1
        # text that is not XML after all (a native program wrote to stderr mid-document): keep it
        nxt = buf.find("<")
        if nxt < 0:
            out.append(buf)
            return len(buf)
        out.append(buf[:nxt])
        return nxt

    def close(self) -> str:
        """The rest: a truncated document's plain-looking remainder, never half a tag."""
        rest, self._buf = self._buf, ""
        if self._in_xml:
            return "".join(unescape_clixml(m.group(2)) for m in _STRING_RECORD.finditer(rest))
        return rest


def _partial_suffix(text: str, token: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``token``."""
    for size in range(min(len(token) - 1, len(text)), 0, -1):
        if token.startswith(text[-size:]):
            return size
    return 0


def _element_end(buf: str, name: str) -> int:
    """End offset of the element named ``name`` starting at 0 (nested ones counted), or 0."""
    depth = 0
    pattern = re.compile(rf"<(/?){name}(?=[\s>/])([^>]*)>")
    for match in pattern.finditer(buf):
        if match.group(1):
            depth -= 1
        elif not match.group(2).endswith("/"):
            depth += 1
        if depth == 0:
            return match.end()
    return 0


def decode_clixml(text: str) -> str:
    """Whole stderr text as a person would have seen it in a console."""
    decoder = ClixmlDecoder()
    return decoder.feed(text) + decoder.close()


# -- planning: command lines and transfer chunks ---------------------------------------------------


def send_chunk_size(max_envelope: int = MAX_ENVELOPE, overhead: int = ENVELOPE_OVERHEAD) -> int:
    """Raw bytes per stdin Send so the envelope stays under ``max_envelope``.

    Each chunk travels as one base64 line (4/3, plus CRLF) that the Send envelope base64-encodes
    again (4/3). A multiple of 3 keeps every line free of padding.
    """
    payload = (max_envelope - overhead) * 3 // 4 - 2  # the line, once decoded from the envelope
    raw = payload * 3 // 4
    return max(3, raw - raw % 3)


def plan_chunks(size: int, chunk: int) -> list[tuple[int, int]]:
    """(offset, length) of each Send for a file of ``size`` bytes; an empty file is one empty Send
    (the one that closes stdin)."""
    if size <= 0:
        return [(0, 0)]
    return [(offset, min(chunk, size - offset)) for offset in range(0, size, chunk)]


def _line_limit(platform: Platform) -> int:
    return int(getattr(platform, "MAX_COMMAND_LINE", DEFAULT_MAX_COMMAND_LINE))


def fits_command_line(platform: Platform, line: str) -> bool:
    """Whether cmd.exe (which WinRS starts every command through) accepts ``line`` as it is."""
    return len(line) <= _line_limit(platform)


def windows_side(platform: Platform) -> Platform:
    """The PowerShell platform of the Windows host (a WSL platform keeps one as ``.windows``)."""
    inner = getattr(platform, "windows", None)
    return inner if isinstance(inner, Platform) else platform


def is_powershell(platform: Platform) -> bool:
    """PowerShell runs the node's scripts (native mode); otherwise POSIX sh in a WSL distribution."""
    return isinstance(platform, PowerShell)


def _ps1_bytes(platform: Platform, script: str) -> bytes:
    """A .ps1 file: UTF-8 with a byte order mark (Windows PowerShell 5.1 reads a file without one in
    the ANSI code page)."""
    maker = getattr(platform, "script_file", None)
    return bytes(maker(script)) if maker is not None else b"\xef\xbb\xbf" + script.encode("utf-8")


# PowerShell transfer scripts. Values reach them only through the platform's quote(); the receiving
# script reads stdin through $input, which powershell.exe fills from the WinRS stdin stream.
_RESOLVE = "$target = $ExecutionContext.SessionState.Path.GetUnresolvedProviderPathFromPSPath({path})"
_TEMP_TARGET = "$target = Join-Path ([IO.Path]::GetTempPath()) {name}"
_PUT_SCRIPT = """\
$ErrorActionPreference = 'Stop'
$ProgressPreference = 'SilentlyContinue'
{target}
$expected = {expected}
$directory = [IO.Path]::GetDirectoryName($target)
if ($directory) {{ [void][IO.Directory]::CreateDirectory($directory) }}
$part = $target + {suffix}
$sha = [Security.Cryptography.SHA256]::Create()
$file = [IO.File]::Open($part, [IO.FileMode]::Create, [IO.FileAccess]::Write)
try {{
    foreach ($line in $input) {{
        if (-not $line) {{ continue }}
        $bytes = [Convert]::FromBase64String($line)
        $file.Write($bytes, 0, $bytes.Length)
        [void]$sha.TransformBlock($bytes, 0, $bytes.Length, $bytes, 0)
    }}
    [void]$sha.TransformFinalBlock((New-Object byte[] 0), 0, 0)
}} finally {{
    $file.Dispose()
}}
$actual = -join ($sha.Hash | ForEach-Object {{ $_.ToString('x2') }})
if ($actual -ne $expected) {{
    Remove-Item -LiteralPath $part -Force
    [Console]::Error.WriteLine('sha256 mismatch: received ' + $actual + ', sent ' + $expected)
    exit 3
}}
Move-Item -LiteralPath $part -Destination $target -Force
[Console]::Out.WriteLine('sha256 ' + $actual)
[Console]::Out.WriteLine('path ' + $target)
"""
_GET_SCRIPT = """\
$ErrorActionPreference = 'Stop'
$ProgressPreference = 'SilentlyContinue'
{target}
$sha = [Security.Cryptography.SHA256]::Create()
$file = [IO.File]::OpenRead($target)
try {{
    [Console]::Out.WriteLine('size ' + $file.Length)
    $buffer = New-Object byte[] {chunk}
    while (($count = $file.Read($buffer, 0, $buffer.Length)) -gt 0) {{
        [void]$sha.TransformBlock($buffer, 0, $count, $buffer, 0)
        [Console]::Out.WriteLine('data ' + [Convert]::ToBase64String($buffer, 0, $count))
    }}
    [void]$sha.TransformFinalBlock($buffer, 0, 0)
}} finally {{
    $file.Dispose()
}}
[Console]::Out.WriteLine('sha256 ' + (-join ($sha.Hash | ForEach-Object {{ $_.ToString('x2') }})))
"""
_REMOVE_SCRIPT = "Remove-Item -LiteralPath {path} -Force -ErrorAction SilentlyContinue\n"
#: raw bytes per line of a download: 48 KiB -> 64 KiB of base64 per line
GET_CHUNK = 48 * 1024
PART_SUFFIX = ".bootstrap-part"


def put_script(platform: Platform, remote: str | None, expected_sha256: str, *, suffix: str = ".tmp") -> str:
    """PowerShell that writes its stdin (base64 lines) to ``remote`` (None: a new file named
    ``bootstrap-RANDOM{suffix}`` in the temp directory) through a temporary name, checks the SHA-256
    and prints ``sha256 HEX`` and ``path P``."""
    if remote is None:
        target = _TEMP_TARGET.format(name=platform.quote(f"bootstrap-{uuid.uuid4().hex}{suffix}"))
    else:
        target = _RESOLVE.format(path=platform.quote(remote))
    return _PUT_SCRIPT.format(
        target=target, expected=platform.quote(expected_sha256), suffix=platform.quote(PART_SUFFIX)
    )


def get_script(platform: Platform, remote: str, chunk: int = GET_CHUNK) -> str:
    """PowerShell printing ``size N``, then ``data BASE64`` lines, then ``sha256 HEX`` for ``remote``."""
    return _GET_SCRIPT.format(target=_RESOLVE.format(path=platform.quote(remote)), chunk=int(chunk))


def remove_script(platform: Platform, remote: str) -> str:
    return _REMOVE_SCRIPT.format(path=platform.quote(remote))


# The same protocol inside a WSL distribution (POSIX sh, GNU coreutils): stdin carries base64 lines,
# output is ``sha256 HEX`` / ``path P`` (put) or ``size N`` / ``data B64`` / ``sha256 HEX`` (get).
# Relative paths are relative to the home directory, as over SFTP.
_POSIX_PUT = """\
set -e
cd
{umask}target={target}
expected={expected}
mkdir -p -- "$(dirname -- "$target")"
part="$target{suffix}"
tr -d '\\r' | base64 -d > "$part"
actual=$(sha256sum < "$part" | cut -d ' ' -f 1)
if [ "$actual" != "$expected" ]; then
  rm -f -- "$part"
  echo "sha256 mismatch: received $actual, sent $expected" >&2
  exit 3
fi
{chmod}mv -f -- "$part" "$target"
echo "sha256 $actual"
echo "path $target"
"""
_POSIX_GET = """\
set -e
cd
source={source}
if [ ! -f "$source" ] || [ ! -r "$source" ]; then
  echo "cannot read $source: no such file or not readable" >&2
  exit 1
fi
echo "size $(wc -c < "$source" | tr -d ' ')"
base64 -w {width} < "$source" | sed 's/^/data /'
echo "sha256 $(sha256sum < "$source" | cut -d ' ' -f 1)"
"""


def _posix_word(platform: Platform, path: str) -> str:
    word = getattr(platform, "path_word", None)
    return str(word(path)) if word is not None else platform.quote(path)


def posix_put_script(
    platform: Platform, remote: str, expected_sha256: str, *, mode: int | None = None
) -> str:
    """sh writing its stdin (base64 lines) to ``remote`` through a temporary name, SHA-256 checked;
    ``mode`` (e.g. 0o600) is applied before the rename, and a private mode also sets the umask so
    the content is never readable by others, not even while it is written."""
    private = mode is not None and not mode & 0o077
    return _POSIX_PUT.format(
        umask="umask 077\n" if private else "",
        target=_posix_word(platform, remote),
        expected=platform.quote(expected_sha256),
        suffix=PART_SUFFIX,
        chmod=f'chmod {mode:o} "$part"\n' if mode is not None else "",
    )


def posix_get_script(platform: Platform, remote: str, chunk: int = GET_CHUNK) -> str:
    return _POSIX_GET.format(source=_posix_word(platform, remote), width=(chunk // 3) * 4)


# -- error messages ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """Where a transport goes, for messages (never a secret)."""

    node: str
    host: str
    port: int
    scheme: Literal["https", "http"]
    auth: str
    user: str | None

    @property
    def where(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.where}/wsman"


def listener_fix(scheme: str, port: int) -> str:
    """The commands that make a Windows host listen for WinRM (run as administrator)."""
    if scheme == "https":
        return (
            "on the Windows machine, in an administrator PowerShell: "
            "`$c = New-SelfSignedCertificate -DnsName $env:COMPUTERNAME -CertStoreLocation "
            "Cert:\\LocalMachine\\My; New-Item -Path WSMan:\\localhost\\Listener -Transport HTTPS "
            "-Address * -CertificateThumbPrint $c.Thumbprint -Force; New-NetFirewallRule -DisplayName "
            f"'WinRM HTTPS' -Direction Inbound -Protocol TCP -LocalPort {port} -Action Allow` "
            "(or `winrm quickconfig -transport:https` when a certificate for the host name is "
            "installed); see docs/windows.md"
        )
    return (
        "on the Windows machine, in an administrator PowerShell: `Enable-PSRemoting -Force` "
        "(HTTP listener on 5985); prefer HTTPS, see docs/windows.md"
    )


def _errnos(exc: BaseException) -> set[int]:
    """Every errno in an exception's cause/context chain (requests wraps urllib3 wraps OSError)."""
    found: set[int] = set()
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and isinstance(current.errno, int):
            found.add(current.errno)
        for arg in current.args:
            if isinstance(arg, BaseException):
                stack.append(arg)
        reason = getattr(current, "reason", None)
        if isinstance(reason, BaseException):
            stack.append(reason)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                stack.append(linked)
    return found


def _text_chain(exc: BaseException) -> str:
    parts: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(parts) < 6:
        parts.append(str(current))
        current = current.__cause__ or current.__context__
    return " | ".join(parts)


def explain(exc: BaseException, ep: Endpoint, *, connect_timeout: float | None = None) -> ConnectError:
    """One clear message per way reaching a WinRM endpoint fails, with the fix."""
    where, node = ep.where, ep.node
    text = _text_chain(exc)
    if isinstance(exc, InvalidCredentialsError):
        if "requires a username" in str(exc):
            return AuthenticationError(
                f"WinRM {ep.auth} authentication needs a user name", node=node, hint="set user: for this node"
            )
        if "requires a password" in str(exc):
            return AuthenticationError(
                f"WinRM {ep.auth} authentication needs a password",
                node=node,
                hint="set password_env: (and export it) or password_prompt: true for this node",
            )
        return auth_rejected(ep, offered=None)
    if isinstance(exc, WSManFaultError):
        return explain_fault(exc, ep)
    if isinstance(exc, (requests.exceptions.SSLError, ssl.SSLError)):
        return tls_failure(text, ep)
    codes = _errnos(exc)
    if errno.ECONNREFUSED in codes or "Connection refused" in text:
        return UnreachableError(
            f"WinRM is not listening on {where} (connection refused)",
            node=node,
            hint=listener_fix(ep.scheme, ep.port),
        )
    if isinstance(exc, requests.exceptions.ConnectTimeout) or (
        isinstance(exc, (socket.timeout, TimeoutError))
        and not isinstance(exc, requests.exceptions.ReadTimeout)
    ):
        after = f" after {connect_timeout:g}s" if connect_timeout else ""
        return UnreachableError(
            f"connection to {where} timed out{after}",
            node=node,
            hint=f"is the machine on and the address right? A firewall dropping TCP {ep.port} looks "
            f"the same: allow it on the Windows machine with `New-NetFirewallRule -DisplayName "
            f"'WinRM' -Direction Inbound -Protocol TCP -LocalPort {ep.port} -Action Allow`",
        )
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return UnreachableError(
            f"WinRM on {where} stopped answering (read timed out)",
            node=node,
            hint="the machine may be overloaded or gone off the network",
        )
    if (
        codes & {errno.EHOSTUNREACH, errno.ENETUNREACH}
        or "No route to host" in text
        or "Network is unreachable" in text
    ):
        return UnreachableError(
            f"no route to {where}", node=node, hint="is the machine on this network and powered on?"
        )
    if "Name or service not known" in text or "nodename nor servname" in text or "getaddrinfo" in text:
        return UnreachableError(
            f"cannot resolve host name {ep.host!r}",
            node=node,
            hint="fix host: in the inventory or add the name to DNS / /etc/hosts",
        )
    if isinstance(exc, requests.exceptions.ConnectionError):
        dropped = any(w in text for w in ("RemoteDisconnected", "Connection aborted", "BadStatusLine"))
        if dropped and ep.scheme == "http":
            return UnreachableError(
                f"{where} closed the connection without an HTTP answer",
                node=node,
                hint="is this an HTTPS listener? set winrm.scheme: https (port 5986)",
            )
        return UnreachableError(f"cannot connect to WinRM on {where}: {exc}", node=node)
    if isinstance(exc, WinRMTransportError):
        return http_failure(exc.code, exc.response_text, ep)
    if isinstance(exc, WinRMError) and "message encryption" in str(exc):
        return ConnectError(
            f"WinRM over HTTP needs message encryption, which {ep.auth} cannot provide here: {exc}",
            node=node,
            hint="use winrm.scheme: https (recommended) or winrm.transport: ntlm",
        )
    if isinstance(exc, WinRMError):
        return ConnectError(f"WinRM error from {where}: {exc}", node=node)
    return UnreachableError(f"cannot reach WinRM on {where}: {type(exc).__name__}: {exc}", node=node)


def tls_failure(text: str, ep: Endpoint) -> ConnectError:
    where = ep.where
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        if "Hostname mismatch" in text or "doesn't match" in text or "IP address mismatch" in text:
            return ConnectError(
                f"the TLS certificate of {where} is not issued for {ep.host!r}",
                node=ep.node,
                hint="use the host name the certificate names in host:, or issue a certificate for "
                "this name (New-SelfSignedCertificate -DnsName ...) and bind it to the listener",
            )
        return ConnectError(
            f"the TLS certificate of {where} is not trusted (certificate verify failed)",
            node=ep.node,
            hint="set winrm.ca_bundle to a PEM file with the CA (or self-signed certificate) of the "
            "WinRM listener; only on a network you control: winrm.cert_validation: false together "
            "with allow_insecure: true",
        )
    if "WRONG_VERSION_NUMBER" in text or "wrong version number" in text or "record layer failure" in text:
        return ConnectError(
            f"{where} does not speak TLS: it looks like an HTTP listener",
            node=ep.node,
            hint="set winrm.scheme: http with port 5985 (NTLM then encrypts every message), or "
            "create an HTTPS listener (docs/windows.md)",
        )
    return ConnectError(f"TLS handshake with {where} failed: {text}", node=ep.node)


def auth_rejected(ep: Endpoint, *, offered: list[str] | None) -> ConnectError:
    """HTTP 401. ``offered``: the schemes the server's WWW-Authenticate header lists, when known."""
    who = f"{ep.user!r}" if ep.user else "the configured user"
    if offered is not None:
        names = {o.lower() for o in offered}
        wanted = {"basic": "basic", "ntlm": "negotiate", "credssp": "credssp", "kerberos": "negotiate"}
        need = wanted.get(ep.auth)
        if need and need not in names and not (need == "negotiate" and "ntlm" in names):
            setting = {"basic": "Basic", "negotiate": "Negotiate", "credssp": "CredSSP"}[need]
            listed = ", ".join(offered) if offered else "none"
            return AuthenticationError(
                f"{ep.auth} authentication is disabled on {ep.where} (the server offers: {listed})",
                node=ep.node,
                hint=f"on the Windows machine, as administrator: `winrm set winrm/config/service/auth "
                f'@{{{setting}="true"}}`, or set winrm.transport: to one the server offers',
            )
    hint = (
        "check user: and the password (password_env / prompt); a local account is written "
        "`.\\user` or `HOST\\user`, a domain account `DOMAIN\\user`"
    )
    if ep.auth == "basic":
        hint += "; Basic works only with local accounts"
        if ep.scheme == "http":
            hint += (
                "; over HTTP Windows also rejects Basic while `winrm set winrm/config/service "
                '@{AllowUnencrypted="true"}` is not set (prefer HTTPS)'
            )
    return AuthenticationError(
        f"{ep.auth} authentication as {who} on {ep.where} was rejected", node=ep.node, hint=hint
    )


def http_failure(code: int, body: str, ep: Endpoint) -> ConnectError:
    if code == 404:
        return UnreachableError(
            f"{ep.where} answers HTTP but has no WinRM endpoint at /wsman (HTTP 404)",
            node=ep.node,
            hint="is the port right (5986 HTTPS, 5985 HTTP)? " + listener_fix(ep.scheme, ep.port),
        )
    if code in (400, 415, 500) and ep.scheme == "http" and ep.auth in ("ntlm", "kerberos", "credssp"):
        return ConnectError(
            f"{ep.where} refused the encrypted WinRM message (HTTP {code})",
            node=ep.node,
            hint="the listener may not accept message encryption over HTTP: use winrm.scheme: https",
        )
    return UnreachableError(f"WinRM on {ep.where} answered HTTP {code}", node=ep.node)


def explain_fault(exc: WSManFaultError, ep: Endpoint) -> ConnectError:
    code = exc.wsman_fault_code
    reason = (exc.reason or "").strip()
    setting = _QUOTA_SETTINGS.get(code or 0)
    if setting is None and "maximum number of" in reason.lower():
        lowered = reason.lower()
        setting = (
            "MaxConcurrentUsers"
            if "users" in lowered
            else ("MaxShellsPerUser" if "shell" in lowered else "MaxConcurrentOperationsPerUser")
        )
    if setting is not None:
        scope = _QUOTA_SCOPES[setting]
        return ConnectError(
            f"WinRM quota exceeded on {ep.where}: {reason}",
            node=ep.node,
            hint=f"close other WinRM sessions of this user, or raise the limit as administrator: "
            f'`winrm set {scope} @{{{setting}="50"}}`',
        )
    if code == _ACCESS_DENIED or "access is denied" in reason.lower():
        return AuthenticationError(
            f"WinRM on {ep.where} denied access to {ep.user!r}: {reason}",
            node=ep.node,
            hint="the account must be an administrator of that machine (or a member of Remote "
            "Management Users); for a local administrator over NTLM on a workgroup machine run "
            "`Set-ItemProperty HKLM:\\SOFTWARE\\Microsoft\\Windows\\CurrentVersion\\Policies\\System "
            "LocalAccountTokenFilterPolicy 1` as administrator",
        )
    return ConnectError(f"WinRM on {ep.where} refused the request: {reason}", node=ep.node)


# -- the transport ----------------------------------------------------------------------------------


@dataclass
class _Lane:
    """One authenticated HTTP session and one WinRS shell; used by one command at a time."""

    protocol: Protocol
    shell_id: str
    used: int = field(default=0)  # commands started in it


class WinRMTransport(Transport):
    kind = "winrm"

    #: OperationTimeout of each Receive: the longest a timeout or a cancellation waits to be noticed
    POLL_SECONDS = 2
    #: read timeout beyond the operation timeout (a busy Windows host can be slow to answer)
    READ_MARGIN = 30.0
    #: read timeout of the clean-up requests sent when stopping (the host may be gone)
    STOP_TIMEOUT = 5.0
    #: after closing a stopped WSL command's stdin, how long it may take to stop its processes
    STOP_GRACE = 8.0

    def __init__(
        self,
        node_name: str,
        platform: Platform,
        *,
        host: str,
        port: int | None,
        user: str | None,
        settings: WinRMSettings,
        password: Callable[[], str | None],
        allow_insecure: bool = False,
        key_file: str | None = None,
        connect_timeout: float | None = None,
    ) -> None:
        super().__init__(node_name, platform)
        self.settings = settings
        self.allow_insecure = allow_insecure
        self.key_file = key_file
        self.connect_timeout = float(connect_timeout if connect_timeout is not None else 10.0)
        self._password = password
        scheme = settings.scheme
        self.endpoint = Endpoint(
            node=node_name,
            host=host,
            port=port or (5986 if scheme == "https" else 5985),
            scheme=scheme,
            auth=settings.transport,
            user=user,
        )
        self.warnings: list[str] = self._check_settings()
        self._lock = threading.Lock()
        self._idle: list[_Lane] = []
        self._busy: set[int] = set()  # id() of lanes running a command
        self._closed = False
        self._connected = False

    # -- settings -------------------------------------------------------------------------------

    def _check_settings(self) -> list[str]:
        """Refuse insecure combinations unless the inventory allows them; the warnings to repeat."""
        s, ep, node = self.settings, self.endpoint, self.node_name
        warnings: list[str] = []
        # the inventory refuses these too (exit 2, naming file and line); this covers every other caller
        for item in s.insecure():
            if not self.allow_insecure:
                raise UsageError(
                    f"{item.risk}; refused",
                    node=node,
                    hint=f"{item.fix}; on an isolated test network set allow_insecure: true",
                )
            warnings.append(f"allow_insecure: {item.risk} (WinRM on {ep.where})")
        if s.transport == "certificate":
            if s.scheme != "https":
                raise UsageError(
                    "winrm.transport: certificate works only over HTTPS",
                    node=node,
                    hint="set winrm.scheme: https",
                )
            if not self.key_file or not os.path.isfile(os.path.expanduser(self.key_file)):
                raise UsageError(
                    "winrm.transport: certificate needs the client certificate"
                    + (f": key_file {self.key_file!r} is not a readable file" if self.key_file else ""),
                    node=node,
                    hint="set key_file: to a PEM file holding the client certificate and its private key",
                )
        if s.transport in ("ntlm", "basic", "credssp") and not ep.user:
            raise UsageError(
                f"winrm.transport: {s.transport} needs a user name",
                node=node,
                hint="set user: (a local account as `.\\name` or `HOST\\name`, "
                "a domain one as `DOMAIN\\name`)",
            )
        if s.transport == "kerberos":
            from winrm.transport import HAVE_KERBEROS

            if not HAVE_KERBEROS:
                raise UsageError(
                    "winrm.transport: kerberos needs the Kerberos libraries",
                    node=node,
                    hint="pip install 'pywinrm[kerberos]' (and have a ticket: kinit user@REALM)",
                )
        if s.transport == "credssp":
            from winrm.transport import HAVE_CREDSSP

            if not HAVE_CREDSSP:
                raise UsageError(
                    "winrm.transport: credssp needs requests-credssp",
                    node=node,
                    hint="pip install 'pywinrm[credssp]'",
                )
        if s.ca_bundle and not os.path.isfile(os.path.expanduser(s.ca_bundle)):
            raise UsageError(
                f"winrm.ca_bundle {s.ca_bundle!r} is not a readable file",
                node=node,
                hint="point it at a PEM file with the CA certificate of the WinRM listener",
            )
        return warnings

    def describe(self) -> str:
        ep = self.endpoint
        who = f"{ep.user}@" if ep.user else ""
        return f"winrm {ep.scheme}://{who}{ep.where} ({ep.auth})"

    def _new_protocol(self) -> Protocol:
        s, ep = self.settings, self.endpoint
        password = None
        if s.transport in ("ntlm", "basic", "credssp", "kerberos"):
            password = self._password()  # may raise SecretMissingError; cached by the resolver
            if password is None and s.transport != "kerberos":
                raise UsageError(
                    f"winrm.transport: {s.transport} needs a password",
                    node=self.node_name,
                    hint="set password_env: NAME (and export NAME) or password_prompt: true",
                )
        if s.scheme == "http" and s.transport in ("ntlm", "kerberos", "credssp"):
            encryption: Literal["auto", "always", "never"] = "always"
        elif s.scheme == "https":
            encryption = "auto"  # TLS already protects the messages
        else:
            encryption = "never"
        key = os.path.expanduser(self.key_file) if self.key_file else None
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
            read_timeout_sec=self.POLL_SECONDS + int(self.READ_MARGIN),
            operation_timeout_sec=self.POLL_SECONDS,
            message_encryption=encryption,
            proxy=None,  # a LAN machine: never through a proxy from the environment
            **kwargs,
        )
        # requests takes (connect, read): the connect timeout is the user's, the read one covers
        # a Receive that the server holds for the operation timeout
        _read_timeout(protocol, self.connect_timeout, self.POLL_SECONDS + self.READ_MARGIN)
        return protocol

    # -- lanes ----------------------------------------------------------------------------------

    def _cancelled(self) -> CancelledError:
        return CancelledError("cancelled before the command could run", node=self.node_name)

    def _open_lane(self) -> _Lane:
        try:
            protocol = self._new_protocol()
        except WinRMError as exc:  # pywinrm refusing the settings (a missing library, a bad file)
            raise ConnectError(f"cannot set up WinRM: {exc}", node=self.node_name) from None
        try:
            # WSL_UTF8=1: every wsl.exe this shell starts (commands in the distribution, and those
            # of PowerShell scripts) writes its own messages in UTF-8, not UTF-16LE
            shell_id = protocol.open_shell(codepage=65001, noprofile=True, env_vars=dict(WSL_SHELL_ENV))
        except Exception as exc:
            protocol.transport.close_session()
            if self._closed:
                raise self._cancelled() from None
            if isinstance(exc, InvalidCredentialsError):
                raise auth_rejected(self.endpoint, offered=self._offered_schemes()) from None
            raise explain(exc, self.endpoint, connect_timeout=self.connect_timeout) from None
        return _Lane(protocol, shell_id)

    def _offered_schemes(self) -> list[str] | None:
        """The authentication schemes the endpoint advertises (an unauthenticated POST's 401)."""
        s = self.settings
        try:
            response = requests.post(
                self.endpoint.url,
                data=b"",
                headers={"Content-Type": "application/soap+xml;charset=UTF-8"},
                timeout=(self.connect_timeout, 10.0),
                verify=(os.path.expanduser(s.ca_bundle) if s.ca_bundle else True)
                if s.cert_validation
                else False,
                proxies={"http": "", "https": ""},
            )
        except requests.RequestException:
            return None
        if response.status_code != 401:
            return None
        header = response.headers.get("WWW-Authenticate", "")
        return [part.strip().split(" ")[0] for part in header.split(",") if part.strip()]

    def connect(self) -> None:
        with self._lock:
            if self._closed:
                raise self._cancelled()
            if self._connected:
                return
        for warning in self.warnings:
            log.warning("node %r: %s", self.node_name, warning)
        lane = self._open_lane()
        with self._lock:
            if self._closed:
                self._discard(lane)
                raise self._cancelled()
            if self._connected:  # another thread connected meanwhile: keep both shells useful
                self._idle.append(lane)
                return
            self._idle.append(lane)
            self._connected = True
        log.info("%s: connected: %s", self.node_name, self.describe())

    def _acquire(self) -> _Lane:
        self.connect()
        with self._lock:
            if self._closed:
                raise self._cancelled()
            if self._idle:
                lane = self._idle.pop()
                self._busy.add(id(lane))
                return lane
        lane = self._open_lane()
        with self._lock:
            if self._closed:
                self._discard(lane)
                raise self._cancelled()
            self._busy.add(id(lane))
            return lane

    def _release(self, lane: _Lane, *, reusable: bool) -> None:
        with self._lock:
            self._busy.discard(id(lane))
            if reusable and not self._closed:
                self._idle.append(lane)
                return
        self._discard(lane)

    def _discard(self, lane: _Lane) -> None:
        """Delete the lane's shell (Windows then ends every process it started) and its session."""
        _read_timeout(lane.protocol, self.connect_timeout, self.STOP_TIMEOUT)
        try:
            lane.protocol.close_shell(lane.shell_id)
        except Exception as exc:  # best effort: the host may be gone; the shell then times out there
            log.debug("%s: deleting WinRM shell failed: %s", self.node_name, exc)
            lane.protocol.transport.close_session()

    # -- commands -------------------------------------------------------------------------------

    def plan(self, script: str) -> str:
        """The script as the node runs it: readable text, not the base64 of ``-EncodedCommand``;
        a script too long for one command line is noted as uploaded first."""
        script = self.platform.stop_on_hangup(script)
        line = self.platform.login_command(script)
        if fits_command_line(self.platform, line):
            return script
        return (
            f"# {len(line)} characters on a command line exceed the limit of "
            f"{_line_limit(self.platform)}: uploaded to a temporary file and run from there\n{script}"
        )

    def run_raw(
        self,
        script: str,
        *,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        keep_lines: int | None = None,
    ) -> Result:
        return self._run_on(self.platform, script, timeout=timeout, on_line=on_line, keep_lines=keep_lines)

    def run_windows(
        self,
        command: str,
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        keep_lines: int | None = None,
    ) -> Result:
        """Run PowerShell ``command`` on the Windows side of the node, also when the node's platform is
        a WSL distribution (firewall, ``.wslconfig``, ``wsl --status``). ``run`` on a WSL node runs
        inside the distribution instead."""
        platform = windows_side(self.platform)
        script = platform.wrap(command, env=env, cwd=cwd)
        first = command.strip().splitlines()[0] if command.strip() else ""
        log.info("%s: run (Windows) %s", self.node_name, first[:120])
        result = self._run_on(platform, script, timeout=timeout, on_line=on_line, keep_lines=keep_lines)
        result.command = command
        return result

    def _run_on(
        self,
        platform: Platform,
        script: str,
        *,
        timeout: float | None,
        on_line: OnLine | None,
        keep_lines: int | None,
    ) -> Result:
        deadline = Deadline(timeout)
        # POSIX (WSL): the script's process group stops when wsl.exe's stdin closes, which is what
        # happens inside the distribution when Windows ends wsl.exe (timeout, cancel, shell deleted)
        script = platform.stop_on_hangup(script)
        line = platform.login_command(script)
        uploaded: str | None = None
        if not fits_command_line(platform, line):
            line, uploaded = self._from_file(platform, script, len(line))
        try:
            result = self._execute(
                line,
                deadline=deadline,
                on_line=on_line,
                keep_lines=keep_lines,
                stop_by_eof=isinstance(platform, PosixShell),  # its stop_on_hangup watches stdin
            )
        finally:
            if uploaded is not None and not self._closed:
                self._remove(platform, uploaded)
        result.command = script
        return result

    def _from_file(self, platform: Platform, script: str, length: int) -> tuple[str, str]:
        """Upload ``script`` and return the command line that runs it, and the uploaded path.

        PowerShell: a ``.ps1`` in the Windows temp directory, run with ``-File``. WSL: a private
        file in the distribution's /tmp (written from inside the distribution, so no Windows path
        mapping is involved), run by ``/bin/sh`` with the same user the script asks for."""
        if is_powershell(platform):
            path = self._upload(platform, _ps1_bytes(platform, script), None, suffix=".ps1")
            line = str(platform.file_command(path))  # type: ignore[attr-defined]
        else:
            path = f"/tmp/bootstrap-{uuid.uuid4().hex}.sh"
            self._upload(platform, script.encode("utf-8"), path, mode=0o600, label="a long script")
            # a script marked to run as root in the distribution: its runner carries the mark too
            marker = ROOT_MARKER + "\n" if script.startswith(ROOT_MARKER) else ""
            run_script = getattr(platform, "run_script", None)
            runner = str(run_script(path)) if run_script else f"/bin/sh {platform.quote(path)}"
            line = platform.login_command(marker + runner)
        log.info(
            "%s: a %d-character command line is over the limit: running the script from %s",
            self.node_name,
            length,
            path,
        )
        return line, path

    def _remove(self, platform: Platform, path: str) -> None:
        """Delete an uploaded script (best effort: the run's own outcome matters more)."""
        if is_powershell(platform):
            line = platform.login_command(remove_script(platform, path))
        else:
            line = platform.login_command(f"rm -f -- {platform.quote(path)}")
        try:
            self._execute(line, deadline=Deadline(30.0), on_line=None, keep_lines=1)
        except Exception as exc:
            log.warning("node %r: could not delete %s: %s", self.node_name, path, exc)

    def _execute(
        self,
        command_line: str,
        *,
        deadline: Deadline,
        on_line: OnLine | None,
        keep_lines: int | None,
        stdin: Iterator[bytes] | None = None,
        decode_clixml: bool = True,
        stop_by_eof: bool = False,
    ) -> Result:
        """Run one command line in a lane's shell, streaming its output; the lane is reused after a
        clean exit and deleted (with everything the command started) after a timeout or a cancel.
        A wsl.exe command's streams are read through :class:`WslOutput` (its own UTF-16LE messages
        decoded)."""
        lane, command_id = self._start(command_line, console_mode_stdin=stdin is None)
        protocol, shell = lane.protocol, lane.shell_id
        out = LineSplitter("stdout", on_line, keep_lines)
        err = LineSplitter("stderr", on_line, keep_lines)
        clixml = ClixmlDecoder() if decode_clixml else None
        err_text = codecs_decoder()
        timed_out = False
        exit_code: int | None = None
        healthy = False

        out_crlf, err_crlf = _Crlf(), _Crlf()
        wsl = is_wsl_command(command_line)
        out_wsl, err_wsl = (WslOutput(), WslOutput()) if wsl else (None, None)

        def feed_out(data: bytes, final: bool = False) -> None:
            if out_wsl is not None:
                data = out_wsl(data, final=final)
            out.feed(out_crlf(data, final=final))

        def feed_err(data: bytes, final: bool = False) -> None:
            if err_wsl is not None:
                data = err_wsl(data, final=final)
            text = err_text.decode(data, final=final)
            if clixml is not None:
                text = clixml.feed(text) + (clixml.close() if final else "")
            if text or final:
                err.feed(err_crlf(text.encode("utf-8"), final=final))

        try:
            if stdin is not None:
                self._send_stdin(protocol, shell, command_id, stdin)
            while True:
                if self._closed:
                    break
                if deadline.expired:
                    timed_out = True
                    break
                wait = max(1, math.ceil(deadline.remaining(self.POLL_SECONDS)))
                protocol.operation_timeout_sec = wait
                try:
                    stdout, stderr, code, done = protocol.get_command_output_raw(shell, command_id)
                except WinRMOperationTimeoutError:
                    continue
                except Exception as exc:
                    if self._closed:
                        break
                    raise self._lost(exc, "read output") from None
                if stdout:
                    feed_out(stdout)
                if stderr:
                    feed_err(stderr)
                if done:
                    exit_code = code
                    break
            if exit_code is None and stop_by_eof and stdin is None:
                self._stop_by_eof(protocol, shell, command_id, feed_out, feed_err)
            if exit_code is not None:
                try:
                    protocol.cleanup_command(shell, command_id)
                    healthy = True
                except Exception as exc:
                    log.debug("%s: WinRM command clean-up failed: %s", self.node_name, exc)
        finally:
            feed_err(b"", final=True)
            feed_out(b"", final=True)
            out.close()
            err.close()
            if not healthy and exit_code is None:
                self._terminate(lane, command_id)
            self._release(lane, reusable=healthy)
        return Result(
            node=self.node_name,
            command=command_line,
            exit_code=None if timed_out or (self._closed and exit_code is None) else exit_code,
            stdout=out.text,
            stderr=err.text,
            duration=deadline.elapsed,
            timed_out=timed_out,
        )

    def _start(self, command_line: str, *, console_mode_stdin: bool) -> tuple[_Lane, str]:
        """Start ``command_line`` in an idle lane (or a new one). A reused lane may have gone stale
        while idle (Windows deletes idle shells after IdleTimeout, HTTP.sys drops idle connections
        after two minutes): such a lane is discarded and the command started in a fresh one."""
        for _ in range(3):
            lane = self._acquire()
            try:
                command_id = lane.protocol.run_command(
                    lane.shell_id, command_line, console_mode_stdin=console_mode_stdin
                )
            except Exception as exc:
                stale = lane.used > 0
                self._release(lane, reusable=False)
                if self._closed:
                    raise self._cancelled() from None
                if not stale:
                    raise self._lost(exc, "start a command") from None
                log.info("%s: an idle WinRM shell is gone (%s); opening a new one", self.node_name, exc)
                continue
            lane.used += 1
            return lane, command_id
        raise UnreachableError(
            f"WinRM on {self.endpoint.where} keeps refusing new commands", node=self.node_name
        )

    def _stop_by_eof(
        self,
        protocol: Protocol,
        shell: str,
        command_id: str,
        feed_out: Callable[[bytes], None],
        feed_err: Callable[[bytes], None],
    ) -> None:
        """Close the command's stdin and give it :attr:`STOP_GRACE` seconds to end.

        A POSIX script in WSL stops its own process group when its stdin reaches end-of-file (the
        platform's ``stop_on_hangup``, as over SSH). Deleting the shell only ends ``wsl.exe`` on the
        Windows side, which may leave the Linux processes running; the end-of-file reaches them."""
        _read_timeout(protocol, self.connect_timeout, self.STOP_TIMEOUT)
        try:
            protocol.send_command_input(shell, command_id, b"", end=True)
        except Exception as exc:
            log.debug("%s: closing stdin failed: %s", self.node_name, exc)
            return
        grace = Deadline(self.STOP_GRACE)
        while not grace.expired:
            protocol.operation_timeout_sec = 1
            try:
                stdout, stderr, _code, done = protocol.get_command_output_raw(shell, command_id)
            except WinRMOperationTimeoutError:
                continue
            except Exception as exc:
                log.debug("%s: reading after end-of-file failed: %s", self.node_name, exc)
                return
            if stdout:
                feed_out(stdout)
            if stderr:
                feed_err(stderr)
            if done:
                return

    def _send_stdin(self, protocol: Protocol, shell: str, command_id: str, chunks: Iterator[bytes]) -> None:
        """Send every chunk, the last one closing stdin. A command that has already exited (it failed
        early) refuses more input: stop sending; its output tells why."""
        pending = next(chunks, b"")
        while True:
            if self._closed:
                return
            following = next(chunks, None)
            try:
                protocol.send_command_input(shell, command_id, pending, end=following is None)
            except (WSManFaultError, WinRMTransportError) as exc:
                log.debug("%s: stdin refused (the command ended?): %s", self.node_name, exc)
                return
            except Exception as exc:
                if self._closed:
                    return
                raise self._lost(exc, "send input") from None
            if following is None:
                return
            pending = following

    def _terminate(self, lane: _Lane, command_id: str) -> None:
        """Signal terminate, then the lane is discarded (its shell deleted) by ``_release``."""
        _read_timeout(lane.protocol, self.connect_timeout, self.STOP_TIMEOUT)
        try:
            lane.protocol.cleanup_command(lane.shell_id, command_id)
        except Exception as exc:
            log.debug("%s: WinRM terminate signal failed: %s", self.node_name, exc)

    def _lost(self, exc: BaseException, doing: str) -> ConnectError:
        if isinstance(exc, ConnectError):
            return exc
        if isinstance(exc, WSManFaultError):
            return explain_fault(exc, self.endpoint)
        if isinstance(exc, InvalidCredentialsError):
            return auth_rejected(self.endpoint, offered=None)
        return UnreachableError(
            f"the WinRM connection to {self.endpoint.where} failed while trying to {doing}: "
            f"{type(exc).__name__}: {exc}",
            node=self.node_name,
            hint="the node may have gone down or off the network; output so far is in the log",
        )

    # -- files ----------------------------------------------------------------------------------

    def put(
        self, local: Path, remote: str, *, mode: int | None = None, progress: Progress | None = None
    ) -> None:
        """Copy ``local`` to ``remote``: a Windows path on a native node (``mode`` has no meaning
        there), a path inside the distribution on a WSL node (``mode`` applied)."""
        try:
            data = local.read_bytes()
        except OSError as exc:
            raise TransferError(f"cannot read {local}: {exc.strerror}", node=self.node_name) from None
        if is_powershell(self.platform):
            remote = self.platform.transfer_path(remote)
        self._upload(self.platform, data, remote, mode=mode, progress=progress, label=str(local))

    def _upload(
        self,
        platform: Platform,
        data: bytes,
        remote: str | None,
        *,
        suffix: str = ".tmp",
        mode: int | None = None,
        progress: Progress | None = None,
        label: str = "a script",
    ) -> str:
        """Write ``data`` to ``remote`` (None: a new file in the Windows temp directory), SHA-256
        checked on the node; returns the full path the node reports."""
        digest = hashlib.sha256(data).hexdigest()
        if is_powershell(platform):
            script = put_script(platform, remote, digest, suffix=suffix)
        else:
            assert remote is not None
            script = posix_put_script(platform, remote, digest, mode=mode)
        total = len(data)
        chunk = send_chunk_size()
        report = self._progress(progress, total, label)

        def chunks() -> Iterator[bytes]:
            done = 0
            for offset, length in plan_chunks(total, chunk):
                piece = data[offset : offset + length]
                yield base64.b64encode(piece) + b"\n" if piece else b""
                done += length
                report(done)

        result = self._execute(
            platform.login_command(script),
            deadline=Deadline(None),
            on_line=None,
            keep_lines=None,
            stdin=chunks(),
        )
        where = remote or "a temporary file"
        if self._closed and result.exit_code is None:
            raise CancelledError(f"cancelled while copying {label} to {where}", node=self.node_name)
        fields = dict(_fields(result.stdout))
        if result.exit_code != 0 or fields.get("sha256") != digest:
            reason = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
            if "sha256 mismatch" in result.stderr or (fields.get("sha256") and fields["sha256"] != digest):
                raise TransferError(
                    f"copying {label} to {where} failed the SHA-256 check: the node received different "
                    f"bytes ({reason or 'hash ' + fields.get('sha256', '?')}); nothing was replaced",
                    node=self.node_name,
                    hint="retry; if it repeats, something on the path alters the data",
                    result=result,
                )
            if not reason:
                reason = (
                    f"exit code {result.exit_code}"
                    if result.exit_code != 0
                    else "the node did not confirm the copy (no sha256 line in its output)"
                )
            raise TransferError(
                f"cannot copy {label} to {where}: {reason}",
                node=self.node_name,
                result=result,
            )
        return fields.get("path", remote or "")

    def get(self, remote: str, local: Path, *, progress: Progress | None = None) -> None:
        """Copy ``remote`` to ``local``: written as ``local.part`` and renamed once the SHA-256 matches."""
        if is_powershell(self.platform):
            script = get_script(self.platform, self.platform.transfer_path(remote))
        else:
            script = posix_get_script(self.platform, remote)
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TransferError(
                f"cannot create {local.parent}: {exc.strerror}", node=self.node_name
            ) from None
        part = local.with_name(local.name + ".part")
        digest = hashlib.sha256()
        state: dict[str, Any] = {"size": None, "done": 0, "sha256": None, "bad": None}
        report: Callable[[int], None] = lambda done: None  # noqa: E731

        with part.open("wb") as fh:

            def on_line(stream: str, line: str) -> None:
                nonlocal report
                if stream != "stdout":
                    return
                kind, _, value = line.partition(" ")
                if kind == "data":
                    try:
                        piece = base64.b64decode(value, validate=True)
                    except ValueError:
                        state["bad"] = state["bad"] or f"undecodable data line at byte {state['done']}"
                        return
                    fh.write(piece)
                    digest.update(piece)
                    state["done"] += len(piece)
                    report(state["done"])
                elif kind == "size":
                    state["size"] = int(value) if value.isdigit() else None
                    report = self._progress(progress, state["size"] or 0, remote)
                elif kind == "sha256":
                    state["sha256"] = value.strip()

            result = self._execute(
                self.platform.login_command(script),
                deadline=Deadline(None),
                on_line=on_line,
                keep_lines=20,
            )
        try:
            if self._closed and result.exit_code is None:
                raise CancelledError(f"cancelled while copying {remote}", node=self.node_name)
            if result.exit_code != 0:
                reason = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
                raise TransferError(
                    f"cannot copy {remote} from the node: {reason or f'exit code {result.exit_code}'}",
                    node=self.node_name,
                    result=result,
                )
            local_hash = digest.hexdigest()
            if state["bad"] or state["sha256"] != local_hash:
                raise TransferError(
                    f"copying {remote} to {local} failed the SHA-256 check: the node hashed "
                    f"{state['sha256'] or 'nothing'}, {local_hash} arrived"
                    + (f" ({state['bad']})" if state["bad"] else "")
                    + f"; {local} was not written",
                    node=self.node_name,
                    hint="retry; if it repeats, something on the path alters the data",
                    result=result,
                )
            os.replace(part, local)
        finally:
            if part.exists():
                part.unlink()

    def _progress(self, callback: Progress | None, total: int, label: str) -> Callable[[int], None]:
        """A reporter of bytes done: the callback, plus a log line per 10% for large files."""
        step = max(total // 10, 1)
        last = [0]

        def report(done: int) -> None:
            if callback is not None:
                callback(done, total)
            if total >= PROGRESS_LOG_BYTES and (done - last[0] >= step or done == total):
                last[0] = done
                log.info("%s: %s: %d%% of %d bytes", self.node_name, label, done * 100 // total, total)

        return report

    def close(self) -> None:
        """Close for good (also from another thread). Idle shells are deleted now; a running command
        is terminated, and its shell deleted, at its next Receive round."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for lane in idle:
            self._discard(lane)


def _read_timeout(protocol: Protocol, connect: float, read: float) -> None:
    """requests accepts (connect, read) timeouts; pywinrm passes its setting through unchanged but
    only takes one integer for both (a short connect timeout would then cut long Receives)."""
    transport: Any = protocol.transport
    transport.read_timeout_sec = (connect, read)


class _Crlf:
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


def _fields(stdout: str) -> Iterator[tuple[str, str]]:
    for line in stdout.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            yield key, value.strip()


def codecs_decoder() -> Any:
    """An incremental UTF-8 decoder that replaces bad bytes (the shell runs with code page 65001)."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace")
