"""The WS-Management / WinRS server: HTTP(S) front end, authentication, shells and commands.

A command line received by WinRS is dispatched like this:

- run through cmd.exe (``WINRS_SKIP_CMD_SHELL`` not TRUE): a played ``cmd.exe`` process in the shell's
  job (``MaxProcessesPerShell`` counts it) is the parent of what the line runs; when ``cmd.exe /c `` plus
  the line after ``%NAME%`` expansion is longer than 8191 characters, what cmd.exe does: ``The command
  line is too long.`` on stderr, exit code 1 (the WinRS Command itself succeeds);
  longer than 32767: the CreateProcess fault (``The filename or extension is too long.``);
- ``powershell[.exe]`` / ``pwsh[.exe]``: decoded (-EncodedCommand, -Command, -File from :attr:`files`),
  parsed with tests/pwsh.py, recorded in :attr:`calls`, answered by the handler;
- ``wsl[.exe]``: see :mod:`tests.winrm_server.wsl` (the Linux command runs for real);
- anything else: ``/bin/sh -c LINE`` for real, in its own process group.

Stopping a command (Signal terminate, or Delete of its shell) is what Windows' job object does: every
process of the command ends. PowerShell commands (and WinRS's cmd.exe of every command) are played
processes of :attr:`WinRMServer.processes` (:mod:`tests.winrm_server.processes`): each is in its shell's
job, with the job's ``MaxProcessesPerShell`` (``max_processes_per_shell=``) enforced for what is created
inside it and ``MaxMemoryPerShellMB`` (``max_memory_per_shell_mb=``) for the memory of the real
processes standing for them; a handler creates the processes the script would (``Win32_Process``
Create: outside every job).
A ``wsl.exe`` command is different: only wsl.exe (and its cmd.exe) are Windows processes, so only
they end; the Linux processes it started keep running, their stdin still open and their output read
by no one (see :meth:`Command.end_wsl_exe`). What stops them is the client closing the command's stdin first
(WinRS Send with ``End="true"``), which reaches the Linux process as EOF.

A default Windows host (``AllowUnencrypted=false``, ``MaxEnvelopeSizekb=500``) is what the server
plays unless told otherwise: over plain HTTP it answers 401 to Basic and to any SOAP message that is
not NTLM-sealed (``allow_unencrypted=True`` opts out); a request body over ``max_envelope_kb`` KiB
gets HTTP 413; a Receive response never exceeds the client's ``MaxEnvelopeSize`` header.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests import pwsh
from tests.winrm_server import auth as _auth
from tests.winrm_server import cmdexe, cmdline, soap
from tests.winrm_server import powershell as ps
from tests.winrm_server.processes import MEMORY_MESSAGE, ProcessTable, QuotaExceeded, WinProcess
from tests.winrm_server.tls import TlsFiles, issue_client_certificate, make_tls_files

#: cmd.exe: "the maximum length of the string that you can use at the command prompt is 8191
#: characters" (Microsoft's "Command prompt (Cmd.exe) command-line string limitation"). The server's
#: own value, on purpose not the product's constant: the tests check the product against this one.
CMD_LINE_LIMIT = 8191
#: how WinRS hands a command to cmd.exe unless WINRS_SKIP_CMD_SHELL is TRUE (the shortest form: that it
#: is measured with cmd.exe's 8191 characters is documented, not recorded; a longer real prefix, such
#: as the full path of cmd.exe, would only lower the limit further)
WINRS_WRAPPING = "cmd.exe /c "
CREATE_PROCESS_LIMIT = 32767  # CreateProcessW lpCommandLine
#: the Authorization header of WinRM's certificate authentication (WS-Management's HTTPS mutual profile)
CERTIFICATE_AUTH = "http://schemas.dmtf.org/wbem/wsman/1/wsman/secprofile/https/mutual"
MAX_RESPONSE_BYTES = 96 * 1024  # raw stream bytes per Receive response (base64 stays below 153600)
STATUS_CONTROL_C_EXIT = 3221225786  # 0xC000013A: exit code of a process ended by Ctrl+C
CTRL_C_GRACE = 2.0  # seconds a command has after Ctrl+C (SIGINT) before its process group is killed
#: Windows' default MaxEnvelopeSizekb (MS-WSMV 2.2.4.10: "SHOULD be 500"; 150 before Windows 8 / 2012)
DEFAULT_MAX_ENVELOPE_KB = 500
#: room for the envelope and the Stream elements around the base64 of a Receive response
RESPONSE_OVERHEAD = 4096
_BASE64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
#: set in the environment of every Linux process a wsl.exe command starts (inherited by all it
#: starts, in whatever session): how the server finds them again, to list and to clean up
WSL_TOKEN_ENV = "WINRM_TEST_SERVER_WSL"


@dataclass
class Answer:
    """What a handler makes a command print and return.

    ``stdout`` str is written with CRLF line ends in the shell's code page (WINRS_CODEPAGE: 437 unless the
    client asked for 65001/UTF-8), bytes as they are; ``stderr`` is PowerShell error records (Write-Error,
    a failing cmdlet), emitted as CLIXML, the only stderr Windows PowerShell serialises; ``console_stderr``
    is what reaches the same stream as plain text: ``[Console]::Error.WriteLine`` and native programs
    the script runs (str: CRLF line ends in the shell's code page, bytes as they are). It is written
    while the script runs, before the CLIXML document (``console_stderr_inside=True``: after the
    document's first record, where text written between two error records lands). ``chunks`` are
    further stdout pieces sent one by one as the iterator yields them (it may block, e.g. on an Event
    the test sets: the client sees the earlier pieces while the command still runs).
    """

    stdout: str | bytes = ""
    stderr: str = ""
    exit_code: int = 0
    chunks: Iterable[bytes] | None = None
    console_stderr: str | bytes = ""
    console_stderr_inside: bool = False


@dataclass
class PwshCall:
    """One powershell.exe run the server received."""

    script: str
    tree: Any  # tree_sitter.Tree
    commands: list[pwsh.Command]
    stdin: bytes
    command_line: str
    file: str | None = None  # -File path, if run from a file
    file_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # shell environment from the Create request
    cwd: str | None = None  # shell WorkingDirectory from the Create request (a Windows path)
    #: the played powershell.exe running it, in its shell's job (processes.WinProcess)
    process: WinProcess | None = None

    def command(self, name: str) -> pwsh.Command:
        """The first command called ``name`` (case-insensitive) on the tree; AssertionError if none."""
        for cmd in self.commands:
            if cmd.name.lower() == name.lower():
                return cmd
        raise AssertionError(f"no {name} in the script; commands: {[c.name for c in self.commands]}")


Handler = Callable[[PwshCall], "Answer | None"]


class FakeFiles(MutableMapping[str, bytes]):
    """A Windows filesystem in a dict: keys are paths compared without case, ``/`` and ``\\`` alike."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[str, bytes]] = {}
        self._mtimes: dict[str, float] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _norm(path: str) -> str:
        return path.replace("/", "\\").rstrip("\\").lower()

    def __getitem__(self, key: str) -> bytes:
        with self._lock:
            return self._data[self._norm(key)][1]

    def __setitem__(self, key: str, value: bytes) -> None:
        with self._lock:
            self._data[self._norm(key)] = (key, bytes(value))
            self._mtimes[self._norm(key)] = time.time()

    def __delitem__(self, key: str) -> None:
        with self._lock:
            del self._data[self._norm(key)]
            self._mtimes.pop(self._norm(key), None)

    def append(self, key: str, data: bytes) -> None:
        """Add ``data`` at the end of the file (created when missing), in one step."""
        with self._lock:
            name, old = self._data.get(self._norm(key), (key, b""))
            self._data[self._norm(key)] = (name, old + data)
            self._mtimes[self._norm(key)] = time.time()

    def mtime(self, key: str) -> float | None:
        """The file's last write (``time.time()``), None when there is no such file."""
        with self._lock:
            return self._mtimes.get(self._norm(key))

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter([k for k, _ in self._data.values()])

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"FakeFiles({sorted(self)})"


# -- commands ---------------------------------------------------------------------------------------------


@dataclass
class Corruption:
    """One byte the server changes in a command's stream, as a faulty path would (a test arms it with
    :meth:`WinRMServer.corrupt`): the first base64 character at or after byte ``at`` of ``stream``
    ("stdin": what Send delivers to the command; "stdout": what the command serves) that is followed
    by another one is replaced by the next character of the alphabet, so the text still decodes, to
    different bytes. It fires once, in the first command whose stream gets that far."""

    stream: str
    at: int = 1000
    command_line: str | None = None  # the command it hit
    offset: int | None = None  # where in that stream
    original: int | None = None  # the byte it replaced

    @property
    def fired(self) -> bool:
        return self.offset is not None

    def apply(self, command_line: str, data: bytes, start: int) -> bytes:
        for i in range(max(0, self.at - start), len(data) - 1):
            if data[i] in _BASE64_ALPHABET and data[i + 1] in _BASE64_ALPHABET:
                changed = bytearray(data)
                changed[i] = _BASE64_ALPHABET[(_BASE64_ALPHABET.index(data[i]) + 1) % 64]
                self.command_line, self.offset, self.original = command_line, start + i, data[i]
                return bytes(changed)
        return data


class Command:
    """One WinRS command: its output buffer, stdin and (for real processes) the process group."""

    def __init__(self, shell: Shell, command_line: str, server: WinRMServer | None = None) -> None:
        self.id = str(uuid.uuid4()).upper()
        self.shell = shell
        self.command_line = command_line
        self.server = server
        self.wsl = False  # a wsl.exe command: its process is Linux, outside the shell's job
        self.detached = False  # wsl.exe ended while its Linux process lives on: its output goes nowhere
        self.counts = {"stdin": 0, "stdout": 0, "stderr": 0}  # bytes through each stream so far
        self.token = f"{server.instance if server is not None else 'x'}-{self.id}"  # see WSL_TOKEN_ENV
        self.cond = threading.Condition()
        self.pending: list[tuple[str, bytes]] = []
        self.open_streams = {"stdout", "stderr"}
        self.exit_code: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.stdin = bytearray()
        self.stdin_closed = False
        self.deferred: Callable[[], None] | None = None  # handler run, started on first Receive/stdin end
        self.killed = False
        self.interrupted = False
        self.wait_for_stdin = False
        self.process: WinProcess | None = None  # a played powershell.exe (WinRMServer.processes)
        self.cmd_exe: WinProcess | None = None  # WinRS's cmd.exe /c (None: WINRS_SKIP_CMD_SHELL)

    def _tamper(self, stream: str, data: bytes) -> bytes:
        start = self.counts[stream]
        self.counts[stream] += len(data)
        armed = self.server.corruption if self.server is not None else None
        if armed is None or armed.fired or armed.stream != stream:
            return data
        return armed.apply(self.command_line, data, start)

    # output side
    def emit(self, stream: str, data: bytes) -> None:
        if not data or self.detached:
            return
        data = self._tamper(stream, data)
        with self.cond:
            self.pending.append((stream, data))
            self.cond.notify_all()

    def finish(self, exit_code: int) -> None:
        with self.cond:
            if self.exit_code is None:
                self.exit_code = exit_code
            self.cond.notify_all()
        if self.server is not None:
            for process in (self.process, self.cmd_exe):  # cmd.exe /c ends with its command
                if process is not None:
                    self.server.processes.exited(process, exit_code)

    def start_deferred(self) -> None:
        with self.cond:
            run, self.deferred = self.deferred, None
        if run is not None:
            threading.Thread(target=run, name=f"winrm-cmd-{self.id[:8]}", daemon=True).start()

    def take(
        self, timeout: float, limit: int = MAX_RESPONSE_BYTES
    ) -> tuple[list[tuple[str, bytes]], list[str], int | None] | None:
        """Wait up to ``timeout`` for output or the end: (chunks of at most ``limit`` bytes in all,
        streams ending now, exit code or None); None when nothing happened in time."""
        if not self.wait_for_stdin or self.stdin_closed:
            self.start_deferred()
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.pending and self.exit_code is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
            chunks: list[tuple[str, bytes]] = []
            size = 0
            while self.pending and size < limit:
                stream, data = self.pending[0]
                room = limit - size
                if len(data) > room:
                    chunks.append((stream, data[:room]))
                    self.pending[0] = (stream, data[room:])
                    size += room
                    break
                chunks.append(self.pending.pop(0))
                size += len(data)
            if self.pending or self.exit_code is None:
                return chunks, [], None
            ended: list[str] = [s for s in ("stdout", "stderr") if s in self.open_streams]
            self.open_streams.clear()
            return chunks, ended, self.exit_code

    # input side
    def send(self, data: bytes, end: bool) -> None:
        data = self._tamper("stdin", data) if data else data
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ValueError, OSError):
                if data:
                    self.proc.stdin.write(data)
                    self.proc.stdin.flush()
                if end:
                    self.proc.stdin.close()
        else:
            self.stdin += data
        if end:
            self.stdin_closed = True
            self.start_deferred()

    def signal(self, code: str) -> None:
        if self.wsl and code in (soap.SIGNAL_CTRL_C, soap.SIGNAL_CTRL_BREAK):
            # wsl.exe passes Ctrl+C on to the Linux process as SIGINT and ends when that process ends;
            # what ignores SIGINT goes on running (no job object reaches it)
            self.interrupted = True
            self._killpg(signal.SIGINT)
            return
        if code in (soap.SIGNAL_CTRL_C, soap.SIGNAL_CTRL_BREAK):
            self.interrupted = True
            proc = self.proc
            self._killpg(signal.SIGINT)

            def finish_group() -> None:
                # Ctrl+C ends the console's processes: SIGINT first (handlers run), then whatever ignored it
                # (background jobs of a non-interactive sh do) is killed with the group
                if proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(CTRL_C_GRACE)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                with self.cond:
                    self.deferred = None
                self.finish(STATUS_CONTROL_C_EXIT)

            threading.Thread(target=finish_group, daemon=True).start()
        else:
            self.kill()

    def kill(self) -> None:
        """What Windows does to the command when it is terminated or its shell deleted: the shell's
        job object ends every process of it. A wsl.exe command: see :meth:`end_wsl_exe`."""
        if self.wsl:
            self.end_wsl_exe()
            return
        self.killed = True
        self._killpg(signal.SIGKILL)
        if self.server is not None:
            for process in (self.cmd_exe, self.process):
                if process is not None:
                    self.server.processes.terminate_tree(process)
        with self.cond:
            self.deferred = None
        self.finish(1)

    def end_wsl_exe(self) -> None:
        """Windows ends ``wsl.exe`` (the only Windows process of the command) and nothing else: the
        Linux processes it started are no part of the shell's job and keep running. Their stdin is
        left open (WSL's relay holds it: killing wsl.exe is not an end-of-file for them) and their
        output is read by no one. Reported by WSL users (microsoft/WSL#2496: the Linux tree survives
        ``taskkill /t /f`` of the Windows side; usbipd-win#936: "when you kill the windows wsl.exe
        command, the linux command that it started actually keeps running"); whether the relay
        turns wsl.exe's death into an end-of-file is not documented, so the server takes the case a
        client cannot rely on. The processes are listed in :meth:`WinRMServer.orphaned_pids` (and
        killed when the server stops, as clean-up of the tests' machine, not as Windows would)."""
        self.killed = True
        with self.cond:
            self.deferred = None
            self.detached = True
            self.pending.clear()
        self.finish(1)
        if self.proc is not None and self.server is not None:
            self.server.adopt_orphan(self)

    def _killpg(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    # real processes
    def spawn(self, argv: list[str], cwd: str | None, env: dict[str, str], **popen: Any) -> None:
        """Run argv in a new session (its own process group), streaming stdout/stderr as produced."""
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=env,
                start_new_session=True,
                **popen,
            )
        except (OSError, ValueError) as exc:  # no such program; an environment name Linux refuses
            self.emit("stderr", f"{exc}\r\n".encode())
            self.finish(1)
            return
        readers = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, "stdout"), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, "stderr"), daemon=True),
        ]
        for t in readers:
            t.start()

        def reap() -> None:
            assert self.proc is not None
            rc = self.proc.wait()
            for t in readers:
                t.join()
            if not self.wsl and (self.interrupted or rc == -signal.SIGINT):
                rc = STATUS_CONTROL_C_EXIT  # wsl.exe instead reports the Linux process' own exit code
            elif rc < 0:
                rc = 1
            self.finish(rc)

        threading.Thread(target=reap, name=f"winrm-reap-{self.proc.pid}", daemon=True).start()

    def _pump(self, pipe: Any, stream: str) -> None:
        fd = pipe.fileno()
        try:
            while True:
                data = os.read(fd, 65536)
                if not data:
                    break
                self.emit(stream, data)
        except OSError:
            pass
        finally:
            pipe.close()


@dataclass
class Shell:
    id: str
    owner: str
    env: dict[str, str]
    cwd: str | None
    codepage: int
    commands: dict[str, Command] = field(default_factory=dict)

    def encoding(self) -> str:
        return {65001: "utf-8", 437: "cp437", 850: "cp850", 1252: "cp1252"}.get(self.codepage, "cp437")


# -- the server -------------------------------------------------------------------------------------------


class WinRMServer:
    """A WinRM service for the tests; see the package docstring and docs/testing.md.

    ``auth``: "basic", "ntlm" or "basic,ntlm". ``strict`` (default): leaving the ``with`` block raises
    AssertionError when PowerShell that did not parse, or a handler exception, happened (a test that wants
    them sets strict=False and asserts on :attr:`parse_errors` / :attr:`handler_errors`).

    Windows' defaults unless told otherwise: ``allow_unencrypted=False`` (``AllowUnencrypted=false``:
    over plain HTTP, Basic and SOAP messages that are not NTLM-sealed get 401) and ``max_envelope_kb=500``
    (``MaxEnvelopeSizekb``: a larger request body gets HTTP 413). A test that needs plain HTTP says
    ``allow_unencrypted=True``, as an administrator would run ``winrm set winrm/config/service
    @{AllowUnencrypted="true"}``. :attr:`refusals` lists every request refused for either reason.
    """

    def __init__(
        self,
        auth: str = "basic",
        username: str = "bob",
        password: str = "pw",
        tls: bool = False,
        on_powershell: Handler | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        answers: list[dict[str, Any]] | None = None,
        max_shells_per_user: int = 30,
        computer_name: str = "WINHOST",
        tls_dir: Path | None = None,
        record: Path | None = None,
        strict: bool = True,
        progress_record: bool = True,
        wsl: Any = None,
        allow_unencrypted: bool = False,
        max_envelope_kb: int = DEFAULT_MAX_ENVELOPE_KB,
        max_processes_per_shell: int = 25,
        max_memory_per_shell_mb: int = 1024,
    ) -> None:
        from tests.winrm_server.wsl import WslConfig  # late: wsl imports this module's types

        self.auth_methods = {m.strip().lower() for m in auth.split(",") if m.strip()}
        if not self.auth_methods <= {"basic", "ntlm", "certificate"}:
            raise ValueError(f"auth must be basic, ntlm and/or certificate, not {auth!r}")
        if "certificate" in self.auth_methods and not tls:
            raise ValueError("certificate authentication needs tls=True (it is a TLS client certificate)")
        self.username = username
        self.password = password
        self.tls = tls
        self.on_powershell = on_powershell
        self.host = host
        self.port = port
        self.answers = list(answers or [])
        self.max_shells_per_user = max_shells_per_user
        self.computer_name = computer_name
        self.strict = strict
        self.progress_record = progress_record
        self.wsl = wsl if wsl is not None else WslConfig()
        self.allow_unencrypted = allow_unencrypted
        #: refuse NTLM-sealed messages (401) after a successful NTLM handshake: a host or a proxy in
        #: between that does not take WinRM's message encryption (the password was right)
        self.refuse_sealing = False
        self.max_envelope_kb = max_envelope_kb
        self.refusals: list[str] = []  # "401 ..." / "413 ...": requests refused by the settings above
        self.largest_request = 0  # bytes of the largest request body received (as sent: sealed or not)
        self.largest_response = 0  # bytes of the largest SOAP response (before sealing)
        self.corruption: Corruption | None = None  # armed by corrupt()
        self.record_path = record
        self.calls: list[PwshCall] = []
        self.commands: list[str] = []
        self.files = FakeFiles()
        self.parse_errors: list[str] = []
        self.handler_errors: list[str] = []
        self.requests: list[str] = []  # action of every SOAP request, in order (Create, Command, ...)
        self.encrypted_requests = 0  # SOAP requests that arrived NTLM-sealed (multipart/encrypted)
        self.ca_file: Path | None = None
        self.endpoint = ""
        self._tls_dir = tls_dir
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._tls_files: TlsFiles | None = None
        self._cert_der: bytes | None = None
        self._shells: dict[str, Shell] = {}
        self._lock = threading.RLock()
        self._record_lock = threading.Lock()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._ntlm: _auth.NtlmAcceptor | None = None
        self._connections: set[socket.socket] = set()
        self._orphans: list[Command] = []  # wsl.exe commands ended while their Linux side ran
        self.instance = uuid.uuid4().hex[:12]
        #: the played Windows processes, with each shell's job, its MaxProcessesPerShell and
        #: MaxMemoryPerShellMB
        self.processes = ProcessTable(max_processes_per_shell, max_memory_per_shell_mb)
        self.processes.on_memory_exceeded = self._memory_exceeded
        self.cut_off = False  # cut_off_clients(): every connection closed as it comes

    def _memory_exceeded(self, job: str, used_mb: int) -> None:
        """The shell's processes passed MaxMemoryPerShellMB: the allocation fails with Windows' text
        and the remote operation is terminated (tests/winrm_server/processes.py)."""
        with self._lock:
            shell = self._shells.get(job)
        if shell is None:
            return
        for cmd in list(shell.commands.values()):
            if cmd.exit_code is None:
                cmd.emit("stderr", (MEMORY_MESSAGE + "\r\n").encode(shell.encoding(), "replace"))
                cmd.kill()

    def client_certificate(self, user: str | None = None) -> Path:
        """A PEM (certificate and key) the server maps to ``user`` (default: its user) for
        ``auth="certificate"``, as Windows maps a client certificate to a local account
        (``New-Item WSMan:\\localhost\\ClientCertificate``; here: by the subject's CN)."""
        if self._tls_dir is None:
            raise RuntimeError("start the server (with tls=True) first")
        return issue_client_certificate(self._tls_dir, user or self.username)

    @property
    def max_envelope_bytes(self) -> int:
        return self.max_envelope_kb * 1024

    def corrupt(self, stream: str, at: int = 1000) -> Corruption:
        """Arm a :class:`Corruption` of ``stream`` ("stdin" or "stdout") from byte ``at`` of the next
        command that gets that far; the returned object says where it struck."""
        if stream not in ("stdin", "stdout"):
            raise ValueError(f"stream must be stdin or stdout, not {stream!r}")
        self.corruption = Corruption(stream, at)
        return self.corruption

    def cut_off_clients(self) -> None:
        """What a controller that lost its network (or was killed) is to this host: its connections
        end and no request of it arrives any more. Shells and their commands go on."""
        with self._lock:
            self.cut_off = True
            conns = list(self._connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def refuse(self, reason: str) -> None:
        with self._lock:
            self.refusals.append(reason)
        self.record({"kind": "refused", "reason": reason})

    def adopt_orphan(self, cmd: Command) -> None:
        """A wsl.exe command ended while its Linux side ran (Command.end_wsl_exe): its processes are
        kept, the first one's stdin open."""
        with self._lock:
            self._orphans.append(cmd)

    def orphaned_pids(self) -> list[int]:
        """Every live Linux process (any session, any depth) started by a wsl.exe command that was
        ended by terminate or a shell Delete: what Windows would have left running."""
        with self._lock:
            tokens = {cmd.token for cmd in self._orphans}
        return sorted(pid for pid, token in _wsl_processes() if token in tokens)

    # lifecycle
    def __enter__(self) -> WinRMServer:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop()
        if self.strict and exc_type is None:
            self.assert_clean()

    def assert_clean(self) -> None:
        problems = [f"PowerShell that does not parse:\n{e}" for e in self.parse_errors]
        problems += [f"handler raised:\n{e}" for e in self.handler_errors]
        assert not problems, "\n".join(problems)

    def start(self) -> WinRMServer:
        if "ntlm" in self.auth_methods:
            self._ntlm = _auth.NtlmAcceptor(self.username, self.password, self.computer_name)
        server = self

        class _Handler(_RequestHandler):
            winrm = server

        httpd = _HTTPServer((self.host, self.port), _Handler, bind_and_activate=False)
        httpd.daemon_threads = True
        httpd.block_on_close = False
        httpd.allow_reuse_address = True
        httpd.server_bind()
        httpd.server_activate()
        self.port = httpd.server_address[1]
        host_text = f"[{self.host}]" if ":" in self.host else self.host
        if self.tls:
            if self._tls_dir is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="winrm-tls-")
                self._tls_dir = Path(self._tmp.name)
            self._tls_files = make_tls_files(self._tls_dir, self.host)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self._tls_files.cert_file, self._tls_files.key_file)
            if "certificate" in self.auth_methods:
                # clients may present a certificate of the test CA (WinRM's certificate authentication)
                ctx.verify_mode = ssl.CERT_OPTIONAL
                ctx.load_verify_locations(self._tls_files.ca_file)
            httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True, do_handshake_on_connect=False)
            self.ca_file = self._tls_files.ca_file
            self._cert_der = ssl.PEM_cert_to_DER_cert(self._tls_files.cert_file.read_text())
            self.endpoint = f"https://{host_text}:{self.port}/wsman"
        else:
            self.endpoint = f"http://{host_text}:{self.port}/wsman"
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"winrm-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._lock:
            shells = list(self._shells.values())
            self._shells.clear()
            conns = list(self._connections)
        for shell in shells:
            for cmd in shell.commands.values():
                cmd.kill()
        with self._lock:
            orphans, self._orphans = self._orphans, []
        # clean-up of this machine (on Windows they would run on): every process any of this server's
        # wsl.exe commands started, found by its token, whatever session it moved to
        for pid, token in _wsl_processes():
            if token.startswith(self.instance + "-"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        for cmd in orphans:
            proc = cmd.proc
            if proc is not None:
                with contextlib.suppress(OSError, ValueError):
                    if proc.stdin is not None:
                        proc.stdin.close()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.processes.close()
        if self._ntlm is not None:
            self._ntlm.close()
            self._ntlm = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def open_shells(self) -> list[str]:
        with self._lock:
            return list(self._shells)

    def running_pids(self) -> list[int]:
        """Process ids of the real processes of every open command (what Signal/Delete must end)."""
        with self._lock:
            return [
                c.proc.pid
                for s in self._shells.values()
                for c in s.commands.values()
                if c.proc is not None and c.proc.poll() is None
            ]

    def record(self, entry: dict[str, Any]) -> None:
        if self.record_path is None:
            return
        with self._record_lock, open(self.record_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")

    # -- SOAP dispatch
    def dispatch(self, body: bytes, user: str, client_ip: str) -> tuple[int, str]:
        try:
            req = soap.parse_request(body)
        except soap.BadRequest as exc:
            fault = soap.bad_request(str(exc))
            return fault.status, fault.render("uuid:00000000-0000-0000-0000-000000000000", self.machine)
        self.requests.append(req.action.rsplit("/", 1)[-1])
        try:
            text = self._dispatch(req, user, client_ip)
        except _FaultError as err:
            return err.fault.status, err.fault.render(req.message_id, self.machine)
        with self._lock:
            self.largest_response = max(self.largest_response, len(text.encode("utf-8")))
        return 200, text

    @property
    def machine(self) -> str:
        return self.host

    def _shell(self, req: soap.Request) -> Shell:
        shell_id = req.selectors.get("ShellId", "")
        with self._lock:
            shell = self._shells.get(shell_id.upper())
        if shell is None:
            raise _FaultError(soap.shell_not_found(shell_id))
        return shell

    def _dispatch(self, req: soap.Request, user: str, client_ip: str) -> str:
        if req.action == soap.ACTION_CREATE:
            return self._create(req, user, client_ip)
        if req.action == soap.ACTION_DELETE:
            shell = self._shell(req)
            with self._lock:
                self._shells.pop(shell.id, None)
            for cmd in shell.commands.values():
                cmd.kill()
            self.processes.terminate_job(shell.id)  # the shell's job object is closed
            return soap.delete_response(req)
        if req.action == soap.ACTION_COMMAND:
            return self._command(req, self._shell(req))
        if req.action == soap.ACTION_RECEIVE:
            return self._receive(req, self._shell(req))
        if req.action == soap.ACTION_SEND:
            shell = self._shell(req)
            for stream in req.findall("rsp:Send/rsp:Stream"):
                target = shell.commands.get((stream.get("CommandId") or "").upper())
                if target is None:
                    raise _FaultError(soap.command_not_found())
                data = base64.b64decode((stream.text or "").strip() or b"")
                target.send(data, (stream.get("End") or "").lower() == "true")
            return soap.send_response(req)
        if req.action == soap.ACTION_SIGNAL:
            shell = self._shell(req)
            sig = req.find("rsp:Signal")
            if sig is None:
                raise _FaultError(soap.invalid_parameter())
            cmd_id = (sig.get("CommandId") or "").upper()
            signalled = shell.commands.get(cmd_id)
            if signalled is None:
                raise _FaultError(soap.command_not_found())
            code_el = sig.find("rsp:Code", soap.NS)
            code = (code_el.text or "").strip() if code_el is not None else ""
            signalled.signal(code)
            if code == soap.SIGNAL_TERMINATE:
                shell.commands.pop(cmd_id, None)
            return soap.signal_response(req)
        raise _FaultError(soap.action_not_supported(req.action))

    def _create(self, req: soap.Request, user: str, client_ip: str) -> str:
        shell_el = req.find("rsp:Shell")
        if shell_el is None:
            raise _FaultError(soap.invalid_parameter())
        env = {
            v.get("Name", ""): v.text or "" for v in shell_el.findall("rsp:Environment/rsp:Variable", soap.NS)
        }
        wd = shell_el.find("rsp:WorkingDirectory", soap.NS)
        try:
            codepage = int(req.options.get("WINRS_CODEPAGE", "437"))
        except ValueError:
            codepage = 437
        ins = shell_el.find("rsp:InputStreams", soap.NS)
        outs = shell_el.find("rsp:OutputStreams", soap.NS)
        with self._lock:
            owned = sum(1 for s in self._shells.values() if s.owner.lower() == user.lower())
            if self.max_shells_per_user and owned >= self.max_shells_per_user:
                raise _FaultError(soap.shell_quota(self.max_shells_per_user))
            shell = Shell(str(uuid.uuid4()).upper(), user, env, wd.text if wd is not None else None, codepage)
            self._shells[shell.id] = shell
        streams = (
            (ins.text or "stdin") if ins is not None else "stdin",
            (outs.text or "stdout stderr") if outs is not None else "stdout stderr",
        )
        idle_el = shell_el.find("rsp:IdleTimeOut", soap.NS)
        idle = soap.parse_duration(idle_el.text or "") if idle_el is not None else None
        return soap.create_response(
            req, self.endpoint, shell.id, user, client_ip, streams, shell.cwd, idle, shell.env
        )

    def _receive(self, req: soap.Request, shell: Shell) -> str:
        stream = req.find("rsp:Receive/rsp:DesiredStream")
        if stream is None:
            raise _FaultError(soap.invalid_parameter())
        if not stream.get("CommandId"):  # Receive on the shell itself: Windows' cmd plugin refuses it
            raise _FaultError(soap.invalid_parameter())
        cmd = shell.commands.get((stream.get("CommandId") or "").upper())
        if cmd is None:
            raise _FaultError(soap.command_not_found())
        timeout = req.operation_timeout if req.operation_timeout is not None else 60.0
        # the response must fit the client's MaxEnvelopeSize, itself capped at MaxEnvelopeSizekb
        # (MS-WSMV 3.1.4.1.7); the streams are base64 (4/3) inside the envelope
        envelope = min(req.max_envelope or self.max_envelope_bytes, self.max_envelope_bytes)
        limit = max(1024, min(MAX_RESPONSE_BYTES, (envelope - RESPONSE_OVERHEAD) * 3 // 4))
        got = cmd.take(timeout, limit)
        if got is None:
            raise _FaultError(soap.timed_out())
        chunks, ended, exit_code = got
        return soap.receive_response(req, cmd.id, chunks, ended, exit_code)

    def _command(self, req: soap.Request, shell: Shell) -> str:
        line_el = req.find("rsp:CommandLine")
        command_el = line_el.find("rsp:Command", soap.NS) if line_el is not None else None
        if line_el is None or command_el is None:
            raise _FaultError(soap.invalid_parameter())
        parts = [(command_el.text or "").strip()]
        parts += [a.text or "" for a in line_el.findall("rsp:Arguments", soap.NS)]
        line = " ".join(p for p in parts if p)
        skip_cmd = req.options.get("WINRS_SKIP_CMD_SHELL", "FALSE").upper() == "TRUE"
        if len(line) > CREATE_PROCESS_LIMIT:
            raise _FaultError(soap.filename_too_long())
        if skip_cmd:
            # no cmd.exe to search PATH: WinRS hands argv[0] to CreateProcess as the application name, so a
            # bare "powershell.exe" is not found (recorded on real Windows; a full path works)
            first = cmdline.split_tokens(line)
            if not first or not re.match(r"^([A-Za-z]:)?[\\/]", first[0].value):
                raise _FaultError(soap.file_not_found())
        with self._lock:
            self.commands.append(line)
        self.record({"kind": "command", "command_line": line})
        cmd = Command(shell, line, self)
        shell.commands[cmd.id] = cmd
        if not skip_cmd:
            # WinRS's cmd.exe: in the shell's job like every process of the command (MaxProcessesPerShell
            # counts it), and the first to meet cmd.exe's limit, on the line as it wraps and expands it
            encoding = shell.encoding()
            try:
                cmd.cmd_exe = self.processes.create(
                    "cmd.exe", WINRS_WRAPPING + line, parent=None, job=shell.id
                )
            except QuotaExceeded as exc:
                cmd.emit("stderr", (str(exc) + "\r\n").encode(encoding, "replace"))
                cmd.finish(ps.QUOTA_EXIT)
                return soap.command_response(req, cmd.id)
            env = {**cmdexe.windows_env(shell.owner, self.computer_name), **shell.env}
            if len(WINRS_WRAPPING + cmdexe.expand(line, env)) > CMD_LINE_LIMIT:
                cmd.emit("stderr", b"The command line is too long.\r\n")
                cmd.finish(1)
                return soap.command_response(req, cmd.id)
        tokens = cmdline.split_tokens(line)
        program = _program(tokens)
        if program in ("cmd", "cmd.exe") and len(tokens) > 1 and tokens[1].value.lower() in ("/c", "/k"):
            # `cmd.exe /c REST`: REST is what runs (here through /bin/sh, like any other cmd line)
            line = line[tokens[1].end :].lstrip(" \t")
            tokens = cmdline.split_tokens(line)
            program = _program(tokens)
        if not skip_cmd and program in (*ps.POWERSHELL_NAMES, "wsl", "wsl.exe"):
            try:
                line = cmdexe.preprocess(
                    line, {**cmdexe.windows_env(shell.owner, self.computer_name), **shell.env}
                )
            except cmdexe.CmdSyntaxError as exc:
                with self._lock:
                    self.parse_errors.append(str(exc))
                self.record({"kind": "parse_error", "report": str(exc)})
                cmd.emit("stderr", f"{exc}\r\n".encode())
                cmd.finish(1)
                return soap.command_response(req, cmd.id)
            tokens = cmdline.split_tokens(line)
        if program in ps.POWERSHELL_NAMES:
            self._start_powershell(cmd, [t.value for t in tokens[1:]])
        elif program in ("wsl", "wsl.exe"):
            from tests.winrm_server.wsl import run_wsl

            run_wsl(self, cmd, line, tokens)
        else:
            cmd.spawn(["/bin/sh", "-c", line], _linux_cwd(shell.cwd), _env(shell.env))
        return soap.command_response(req, cmd.id)

    # -- powershell
    def _start_powershell(self, cmd: Command, argv: list[str]) -> None:
        encoding = cmd.shell.encoding()
        try:
            # cmd.exe's child (in its job), or WinRS's own when WINRS_SKIP_CMD_SHELL leaves cmd.exe out
            cmd.process = self.processes.create(
                "powershell.exe", cmd.command_line, parent=cmd.cmd_exe, job=cmd.shell.id
            )
        except QuotaExceeded as exc:
            cmd.emit("stderr", (str(exc) + "\r\n").encode(encoding, "replace"))
            cmd.finish(ps.QUOTA_EXIT)
            return
        try:
            inv = ps.parse_invocation(argv)
        except ps.PowerShellUsageError as exc:
            cmd.emit("stderr", (str(exc) + "\r\n").encode(encoding, "replace"))
            cmd.finish(exc.exit_code)
            return
        if inv.mode == "file":
            assert inv.file is not None
            try:
                inv.script = ps.decode_script_file(self.files[inv.file])
            except KeyError:
                self.record(
                    {
                        "kind": "powershell",
                        "command_line": cmd.command_line,
                        "file": inv.file,
                        "missing_file": True,
                    }
                )
                cmd.emit("stderr", ps.file_not_found_text(inv.file).encode(encoding, "replace"))
                cmd.finish(-196608)
                return

        def run() -> None:
            self._run_powershell(cmd, inv)

        cmd.deferred = run
        if inv.mode == "command" and inv.script.strip() == "-":
            cmd.wait_for_stdin = True  # the script is read from stdin: runs once stdin ends
        if cmd.stdin_closed:
            cmd.start_deferred()

    def _run_powershell(self, cmd: Command, inv: ps.Invocation) -> None:
        encoding = cmd.shell.encoding()
        if inv.mode == "command" and inv.script.strip() == "-":  # `powershell.exe -` : script on stdin
            inv.script = bytes(cmd.stdin).decode(encoding, "replace")
            inv.mode = "stdin"
        tree = pwsh.parse(inv.script)
        problems = pwsh.errors(tree)
        call = PwshCall(
            script=inv.script,
            tree=tree,
            commands=pwsh.commands(tree),
            stdin=bytes(cmd.stdin),
            command_line=cmd.command_line,
            file=inv.file,
            file_args=inv.file_args,
            env=dict(cmd.shell.env),
            cwd=cmd.shell.cwd,
            process=cmd.process,
        )
        with self._lock:
            self.calls.append(call)
        self.record(
            {
                "kind": "powershell",
                "command_line": cmd.command_line,
                "script": inv.script,
                "file": inv.file,
                "stdin": base64.b64encode(call.stdin).decode(),
                "parse_errors": problems,
            }
        )
        if problems:
            report = "\n".join(problems) + "\n--- script ---\n" + inv.script
            with self._lock:
                self.parse_errors.append(report)
            self.record({"kind": "parse_error", "report": report})
            cmd.emit(
                "stderr",
                ps.clixml_errors(ps.parse_error_text(problems), self.progress_record).encode(
                    encoding, "replace"
                ),
            )
            cmd.finish(1)
            return
        try:
            answer = self._answer(call)
            if answer is None:
                cmd.finish(0)
                return
            self.play(cmd, answer, clixml=True)
        except Exception:
            text = traceback.format_exc()
            with self._lock:
                self.handler_errors.append(text)
            self.record({"kind": "handler_error", "report": text})
            cmd.emit("stderr", ps.clixml_errors(text, self.progress_record).encode(encoding, "replace"))
            cmd.finish(1)

    def _answer(self, call: PwshCall) -> Answer | None:
        if self.on_powershell is not None:
            return self.on_powershell(call)
        for entry in self.answers:
            if re.search(entry["match"], call.script):
                return Answer(
                    stdout=entry.get("stdout", ""),
                    stderr=entry.get("stderr", ""),
                    exit_code=int(entry.get("exit_code", 0)),
                )
        return None

    def play(self, cmd: Command, answer: Answer, clixml: bool) -> None:
        """Write an Answer to the command's streams and end it. ``clixml``: the command is powershell.exe,
        whose error records (``answer.stderr``) become CLIXML; plain text (``console_stderr``, and all
        stderr of other programs) stays plain."""
        encoding = cmd.shell.encoding()

        def text(value: str | bytes) -> bytes:
            if isinstance(value, bytes):
                return value
            return re.sub(r"(?<!\r)\n", "\r\n", value).encode(encoding, "replace")

        if cmd.killed:
            return  # its processes were ended (terminated, a quota): they write nothing more
        cmd.emit("stdout", text(answer.stdout))
        for piece in answer.chunks or ():
            if cmd.killed:
                return
            cmd.emit("stdout", piece)
        console = text(answer.console_stderr)
        if answer.stderr and clixml:
            head, tail = ps.clixml_error_parts(answer.stderr, self.progress_record)
            if answer.console_stderr_inside:
                cmd.emit("stderr", head.encode(encoding, "replace"))
                cmd.emit("stderr", console)
            else:
                cmd.emit("stderr", console)
                cmd.emit("stderr", head.encode(encoding, "replace"))
            cmd.emit("stderr", tail.encode(encoding, "replace"))
        else:
            cmd.emit("stderr", console)
            cmd.emit("stderr", answer.stderr.encode(encoding, "replace"))
        cmd.finish(answer.exit_code)


class _FaultError(Exception):
    def __init__(self, fault: soap.Fault) -> None:
        super().__init__(fault.reason)
        self.fault = fault


def _program(tokens: list[cmdline.Token]) -> str:
    """argv[0]'s file name, lower case (``C:\\Windows\\System32\\wsl.exe`` -> ``wsl.exe``)."""
    return tokens[0].value.replace("/", "\\").rsplit("\\", 1)[-1].lower() if tokens else ""


def _wsl_processes() -> list[tuple[int, str]]:
    """(pid, token) of every live process carrying :data:`WSL_TOKEN_ENV`."""
    found = []
    needle = WSL_TOKEN_ENV.encode() + b"="
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read()
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state == b"Z":
            continue
        for item in environ.split(b"\0"):
            if item.startswith(needle):
                found.append((int(entry), item[len(needle) :].decode(errors="replace")))
                break
    return found


def _linux_cwd(path: str | None) -> str | None:
    return path if path and path.startswith("/") and os.path.isdir(path) else None


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


# -- HTTP -------------------------------------------------------------------------------------------------


class _HTTPServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a refused TLS handshake or a client gone: what tests provoke on purpose


class _RequestHandler(BaseHTTPRequestHandler):
    """One client connection (HTTP/1.1 keep-alive: NTLM authenticates the connection, not a request)."""

    winrm: WinRMServer
    protocol_version = "HTTP/1.1"
    server_version = "Microsoft-HTTPAPI/2.0"
    sys_version = ""

    def setup(self) -> None:
        if self.winrm.cut_off:
            self.request.close()  # a controller cut off: nothing of it arrives
            raise ConnectionAbortedError("cut off")
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(10)
            self.request.do_handshake()  # here, in the connection's thread (a slow client blocks no one)
            self.request.settimeout(None)
        super().setup()
        self.ntlm_context: Any = None
        self.ntlm_user: str | None = None
        with self.winrm._lock:
            self.winrm._connections.add(self.request)

    def finish(self) -> None:
        with self.winrm._lock:
            self.winrm._connections.discard(self.request)
        with contextlib.suppress(OSError):
            super().finish()

    def handle(self) -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
            super().handle()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(
        self,
        status: int,
        body: bytes = b"",
        content_type: str | None = None,
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _challenge(self, extra: Iterable[tuple[str, str]] = ()) -> None:
        headers = list(extra)
        if not headers:
            if "ntlm" in self.winrm.auth_methods:
                headers.append(("WWW-Authenticate", "Negotiate"))
            if "basic" in self.winrm.auth_methods:
                headers.append(("WWW-Authenticate", 'Basic realm="WSMAN"'))
        self._send(401, headers=headers)

    def do_GET(self) -> None:
        self._send(405)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path.split("?")[0].rstrip("/").lower() != "/wsman":
            self._send(404)
            return
        server = self.winrm
        header = self.headers.get("Authorization", "")
        scheme = header.split(" ", 1)[0].lower()
        user: str | None = None
        plain_http = not server.tls and not server.allow_unencrypted
        if scheme == "basic" and plain_http:
            # AllowUnencrypted=false: Basic over HTTP is refused whatever the password (pywinrm then
            # reports InvalidCredentialsError; users meet it until AllowUnencrypted is set, e.g. in
            # diyan/pywinrm#79; not recorded here)
            server.refuse("401 Basic over HTTP while AllowUnencrypted is false")
            self._challenge()
            return
        if header == CERTIFICATE_AUTH and "certificate" in server.auth_methods:
            # WinRM's certificate authentication: the TLS client certificate (checked against the CA
            # by the handshake) names the account; pywinrm sends this header with it
            peer = self.request.getpeercert() if isinstance(self.request, ssl.SSLSocket) else None
            subject: Any = (peer or {}).get("subject", ())
            names = [str(pair[1]) for rdn in subject for pair in rdn if pair[0] == "commonName"]
            if [n.lower() for n in names] != [server.username.lower()]:
                server.refuse("401 no client certificate mapped to a user")
                self._challenge()
                return
            user = server.username
        elif scheme == "basic" and "basic" in server.auth_methods:
            user = _auth.check_basic(header, server.username, server.password, server.computer_name)
            if user is None:
                self._challenge()
                return
        elif scheme in ("negotiate", "ntlm") and "ntlm" in server.auth_methods and server._ntlm is not None:
            token = base64.b64decode(header.split(" ", 1)[1].strip()) if " " in header else b""
            try:
                if token[:8] == b"NTLMSSP\x00" and token[8:9] == b"\x01":
                    self.ntlm_context = server._ntlm.new_context(server._cert_der)
                    self.ntlm_user = None
                if self.ntlm_context is None:
                    raise ValueError("NTLM message out of order")
                out = server._ntlm.step(self.ntlm_context, token)
            except Exception:
                self.ntlm_context = None
                self._challenge()
                return
            if not self.ntlm_context.complete:
                word = "Negotiate" if scheme == "negotiate" else "NTLM"
                self._challenge([("WWW-Authenticate", f"{word} {base64.b64encode(out or b'').decode()}")])
                return
            self.ntlm_user = str(self.ntlm_context.client_principal or server.username)
            user = self.ntlm_user
            if not body:  # pywinrm's empty message that sets up encryption
                self._send(200)
                return
        elif not header and self.ntlm_user is not None and self.ntlm_context is not None:
            user = self.ntlm_user
        else:
            self._challenge()
            return

        content_type = self.headers.get("Content-Type", "")
        encrypted = "multipart/encrypted" in content_type
        if plain_http and not encrypted:
            # a SOAP message in clear text over HTTP from an NTLM session that did not seal it: a
            # default host keeps answering 401 (jborean93's capture in hashicorp/packer#6205)
            server.refuse("401 an unencrypted message over HTTP while AllowUnencrypted is false")
            self._challenge()
            return
        with server._lock:
            server.largest_request = max(server.largest_request, len(body))
        if len(body) > server.max_envelope_bytes:
            # MaxEnvelopeSizekb also limits the requests the service accepts (MS-WSMV 2.2.4.10); Windows
            # answers HTTP 413 (ansible.windows#391 and #620: "Bad HTTP response returned from server.
            # Code 413" with MaxEnvelopeSizekb 500)
            limit = server.max_envelope_kb
            server.refuse(f"413 a request of {len(body)} bytes over MaxEnvelopeSizekb {limit}")
            self._send(413)
            return
        if encrypted:
            if self.ntlm_context is None:
                self._challenge()
                return
            if server.refuse_sealing:
                server.refuse("401 an NTLM-sealed message refused after a successful login")
                self._challenge()
                return
            try:
                body = _auth.decrypt(self.ntlm_context, body)
            except Exception:
                self._send(400)
                return
            with server._lock:
                server.encrypted_requests += 1
        user_name = user.split("\\")[-1]
        status, text = server.dispatch(body, user_name, self.client_address[0])
        payload = text.encode("utf-8")
        if encrypted:
            self._send(status, _auth.encrypt(self.ntlm_context, payload), _auth.ENCRYPTED_CONTENT_TYPE)
        else:
            self._send(status, payload, "application/soap+xml;charset=UTF-8")
