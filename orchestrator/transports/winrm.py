"""``connection: winrm``: Windows nodes through WS-Management (pywinrm's low-level ``Protocol``).

Why the low-level protocol: ``Session.run_ps`` returns only when the command has ended, and the
product streams training logs line by line. Here each Receive round (one ``get_command_output_raw``)
hands its bytes to a :class:`LineSplitter` at once, so lines reach ``on_line`` while the command runs.

Shells are reused: a *lane* is one authenticated HTTP session plus one WinRS shell. A transport keeps
an idle lane for the next command; two commands running at the same time on one node get two lanes
(a shell runs one command at a time, and NTLM message encryption numbers every message of a session,
so two threads must never share one). Timeouts and cancellation terminate the command and delete its
shell: Windows ends every process the shell started (the shell's job object). Cancellation is noticed
between Receive rounds, which last at most :attr:`POLL_SECONDS`.

The job object holds Windows processes only: for a ``wsl.exe`` command Windows ends wsl.exe and
nothing else, and the Linux processes it started keep running. So before terminating a command whose
stdin is still open, the transport closes that stdin and gives the command
:attr:`WinRMTransport.STOP_GRACE` seconds to end on that end-of-file (:mod:`.winrm_command`).

Files go through stdin (WinRS ``Send``) of one command per file rather than one command per chunk:
a command line holds about 2 KiB of payload after base64 and UTF-16 encoding, a Send envelope about
80 KiB, and every command starts a new ``powershell.exe`` (hundreds of milliseconds on Windows). The
platform writes the receiving and sending scripts (:mod:`orchestrator.platforms.transfer`);
:mod:`.piped` streams the chunks and checks the SHA-256 both sides computed; files are written under a
temporary name and renamed only when the hashes agree.

On a WSL-mode node the platform is a :class:`~orchestrator.platforms.wsl.WslShell`: commands (and
file transfers) run in POSIX sh inside the distribution through ``wsl.exe``; ``run_windows`` runs
PowerShell on the Windows side of the same machine (the platform's ``host_shell``). Every shell is
opened with ``WSL_UTF8=1`` (wsl.exe's own messages in UTF-8), and what a wsl.exe command prints goes
through :class:`~orchestrator.platforms.wsl.WslOutput`, which decodes the UTF-16LE an older wsl.exe
writes.

CLIXML decoding lives in :mod:`.clixml`; the diagnosis of endpoints that cannot be used (settings,
refusals, faults, with the fix) in :mod:`.winrm_diagnose`; lanes, pywinrm's ``Protocol`` and the
limits of a WinRS command (command line, Send envelope) in :mod:`.winrm_shell`; one started command's
output, stdin and stopping in :mod:`.winrm_command`. This module keeps the transport: its lanes, and
each command from its start to its end.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from winrm.exceptions import InvalidCredentialsError, WinRMError, WinRMOperationTimeoutError
from winrm.protocol import Protocol

import orchestrator.transports.piped as piped
from orchestrator.errors import CancelledError, ConnectError, UnreachableError
from orchestrator.platforms import Platform
from orchestrator.platforms.wsl import WSL_SHELL_ENV
from orchestrator.transports.base import Deadline, OnLine, Result, Transport, log
from orchestrator.transports.clixml import ClixmlDecoder, decode_clixml, unescape_clixml
from orchestrator.transports.piped import PROGRESS_LOG_BYTES, Payload, Progress, plan_chunks
from orchestrator.transports.winrm_command import CommandOutput, TooLarge, WinRSCommand
from orchestrator.transports.winrm_diagnose import (
    Endpoint,
    auth_rejected,
    check_settings,
    explain,
    listener_fix,
    lost,
    offered_schemes,
    sealing_refused,
)
from orchestrator.transports.winrm_shell import (
    MAX_ENVELOPE,
    Lane,
    fits_command_line,
    line_limit,
    new_protocol,
    send_chunk_size,
    set_read_timeout,
)

if TYPE_CHECKING:
    from orchestrator.inventory import WinRMSettings

__all__ = [  # the names other modules (and tests) import from here
    "MAX_ENVELOPE",
    "PROGRESS_LOG_BYTES",
    "ClixmlDecoder",
    "Endpoint",
    "Progress",
    "WinRMTransport",
    "auth_rejected",
    "decode_clixml",
    "explain",
    "listener_fix",
    "plan_chunks",
    "send_chunk_size",
    "unescape_clixml",
]

# -- the transport ----------------------------------------------------------------------------------


class WinRMTransport(Transport):
    kind = "winrm"
    connect_timeout: float  # always set: these transports dial

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
        self.warnings: list[str] = check_settings(
            settings, self.endpoint, allow_insecure=allow_insecure, key_file=key_file
        )
        self._lock = threading.Lock()
        self._idle: list[Lane] = []
        self._busy: set[int] = set()  # id() of lanes running a command
        self._closed = False
        self._connected = False

    def describe(self) -> str:
        ep = self.endpoint
        who = f"{ep.user}@" if ep.user else ""
        return f"winrm {ep.scheme}://{who}{ep.where} ({ep.auth})"

    # -- lanes ----------------------------------------------------------------------------------

    def _cancelled(self) -> CancelledError:
        return CancelledError("cancelled before the command could run", node=self.node_name)

    def _new_protocol(self) -> Protocol:
        """A new authenticated HTTP session (it authenticates with its first request)."""
        try:
            password = None
            if self.settings.transport in ("ntlm", "basic", "credssp", "kerberos"):
                password = self._password()  # may raise SecretMissingError; cached by the resolver
            return new_protocol(
                self.settings,
                self.endpoint,
                password=password,
                key_file=self.key_file,
                connect_timeout=self.connect_timeout,
                operation_timeout=self.POLL_SECONDS,
                read_timeout=self.POLL_SECONDS + self.READ_MARGIN,
            )
        except WinRMError as exc:  # pywinrm refusing the settings (a missing library, a bad file)
            raise ConnectError(f"cannot set up WinRM: {exc}", node=self.node_name) from None

    def _renew_session(self, lane: Lane) -> None:
        """Give ``lane`` a new HTTP session for the same shell (a shell belongs to the user, not to
        the session). Needed after a request the host refused before reading it (HTTP 413): with
        message encryption (NTLM over HTTP) that request used up a sequence number the host never
        saw, and the host can decrypt nothing more of that session."""
        lane.protocol.transport.close_session()
        try:
            lane.protocol = self._new_protocol()
        except Exception as exc:  # best effort: the clean-up then fails and the host times the shell out
            log.debug("%s: a new WinRM session for the clean-up failed: %s", self.node_name, exc)

    def _open_lane(self) -> Lane:
        protocol = self._new_protocol()
        try:
            # WSL_UTF8=1: every wsl.exe this shell starts (commands in the distribution, and those
            # of PowerShell scripts) writes its own messages in UTF-8, not UTF-16LE
            shell_id = protocol.open_shell(codepage=65001, noprofile=True, env_vars=dict(WSL_SHELL_ENV))
        except Exception as exc:
            # the NTLM login (pywinrm's empty message) succeeded when the encryption context exists
            logged_in = protocol.transport.encryption is not None
            protocol.transport.close_session()
            if self._closed:
                raise self._cancelled() from None
            if isinstance(exc, InvalidCredentialsError) and logged_in:
                raise sealing_refused(self.endpoint) from None
            if isinstance(exc, InvalidCredentialsError):
                offered = offered_schemes(self.settings, self.endpoint, connect_timeout=self.connect_timeout)
                raise auth_rejected(self.endpoint, offered=offered) from None
            raise explain(exc, self.endpoint, connect_timeout=self.connect_timeout) from None
        return Lane(protocol, shell_id)

    def connect(self) -> None:
        with self._lock:
            if self._closed:
                raise self._cancelled()
            if self._connected:
                return
        for warning in self.warnings:
            log.warning("node %r: %s", self.node_name, warning)
        with self.dialling():
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

    def _acquire(self) -> Lane:
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

    def _release(self, lane: Lane, *, reusable: bool) -> None:
        with self._lock:
            self._busy.discard(id(lane))
            if reusable and not self._closed:
                self._idle.append(lane)
                return
        self._discard(lane)

    def _discard(self, lane: Lane) -> None:
        """Delete the lane's shell (Windows then ends every process it started) and its session."""
        set_read_timeout(lane.protocol, self.connect_timeout, self.STOP_TIMEOUT)
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
            f"{line_limit(self.platform)}: uploaded to a temporary file and run from there\n{script}"
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

    @property
    def reaches_windows_host(self) -> bool:
        return True  # a WSL node's host too: WinRM's shell is Windows' own

    def run_windows(
        self,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        keep_lines: int | None = None,
        become: bool = False,
    ) -> Result:
        """Run PowerShell ``command`` on the Windows side of the node, also when the node's platform is
        a WSL distribution (firewall, ``.wslconfig``, ``wsl --status``). ``run`` on a WSL node runs
        inside the distribution instead. ``become``: as ``run``'s on a native node, the script first
        checks that the session is elevated and exits 740 when it is not (Windows has no sudo)."""
        platform = self.platform.host_shell
        script = platform.wrap(command, env=env, cwd=cwd, become=become)
        first = command.strip().splitlines()[0] if command.strip() else ""
        log.info("%s: run (Windows) %s%s", self.node_name, first[:120], " (elevated)" if become else "")
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
        # POSIX (WSL): the script's process group stops when its stdin reaches end-of-file, which the
        # transport sends itself (_execute) before it terminates the command on a timeout or cancel.
        # Windows ending wsl.exe (terminate, shell deleted) does not stop it: the Linux processes are
        # no part of the shell's job object, and may keep their stdin open (docs/windows.md)
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
                stop_by_eof=platform.stops_on_stdin_eof,
            )
        finally:
            if uploaded is not None and not self._closed:
                self._remove(platform, uploaded)
        result.command = script
        return result

    def _from_file(self, platform: Platform, script: str, length: int) -> tuple[str, str]:
        """Upload ``script`` (as the platform writes it to a file: a ``.ps1`` in the Windows temp
        directory, or a private file in the distribution's /tmp, written from inside it) and return
        the command line that runs it, and the uploaded path."""
        file = platform.long_script(script)
        path = self._upload(
            platform, Payload(data=file.data), None, suffix=file.suffix, mode=file.mode, label="a long script"
        )
        log.info(
            "%s: a %d-character command line is over the limit: running the script from %s",
            self.node_name,
            length,
            path,
        )
        return platform.run_long_script(path, script), path

    def _remove(self, platform: Platform, path: str) -> None:
        """Delete an uploaded script (best effort: the run's own outcome matters more)."""
        line = platform.login_command(platform.remove_file(path))
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
        decoded).

        ``stdin``: the pieces to send (the last one closes stdin). ``stop_by_eof``: the command stops
        (its whole tree) when its stdin reaches end-of-file. A command that has not ended when it
        is given up on (timeout, cancel, a failure) gets that end-of-file first whenever its stdin
        is still open, and :attr:`STOP_GRACE` seconds to end on it, before it is terminated: Windows'
        terminate ends only wsl.exe of a WSL command, never the Linux processes behind it. A
        transfer cancelled while its data is still being sent then ends on its own: the receiving
        script sees a short input, fails its hash check and removes its part file."""
        lane, command_id = self._start(command_line, console_mode_stdin=stdin is None)
        protocol, shell = lane.protocol, lane.shell_id
        command = WinRSCommand(lane, command_id, self.node_name, self.connect_timeout, self.STOP_TIMEOUT)
        output = CommandOutput(command_line, on_line, keep_lines, decode_clixml=decode_clixml)
        timed_out = False
        exit_code: int | None = None
        healthy = False

        # our end of the command's stdin: open until the last piece of ``stdin`` was sent; a command
        # that stops on end-of-file (and gets no input) keeps it open until we close it
        stdin_open = stdin is not None or stop_by_eof
        reachable = True  # False once the node stopped answering: nothing more is asked of it

        try:
            if stdin is not None:
                try:
                    stdin_open = not command.send_stdin(
                        stdin, cancelled=lambda: self._closed, lost=self._lost
                    )
                except TooLarge as too_large:
                    if lane.protocol.transport.encryption is not None:
                        self._renew_session(lane)
                        protocol = lane.protocol
                    raise self._lost(too_large.error, "send input") from None
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
                    output.feed_out(stdout)
                if stderr:
                    output.feed_err(stderr)
                if done:
                    exit_code = code
                    break
            if exit_code is not None:
                if stdin_open and stop_by_eof:
                    # ended on its own: what still reads its stdin (the script's watcher) gets the
                    # end-of-file too, since the end of wsl.exe may not close it in the distribution
                    command.close_stdin()
                try:
                    protocol.cleanup_command(shell, command_id)
                    healthy = True
                except Exception as exc:
                    log.debug("%s: WinRM command clean-up failed: %s", self.node_name, exc)
        except UnreachableError:
            reachable = False
            raise
        finally:
            if exit_code is None and stdin_open and reachable:
                command.stop_by_eof(output, self.STOP_GRACE)
            output.close()
            if not healthy and exit_code is None:
                command.terminate()
            self._release(lane, reusable=healthy)
        return Result(
            node=self.node_name,
            command=command_line,
            exit_code=None if timed_out or (self._closed and exit_code is None) else exit_code,
            stdout=output.out.text,
            stderr=output.err.text,
            duration=deadline.elapsed,
            timed_out=timed_out,
        )

    def _start(self, command_line: str, *, console_mode_stdin: bool) -> tuple[Lane, str]:
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

    def _lost(self, exc: BaseException, doing: str) -> ConnectError:
        return lost(exc, self.endpoint, doing)

    # -- files ----------------------------------------------------------------------------------

    def put(
        self, local: Path, remote: str, *, mode: int | None = None, progress: Progress | None = None
    ) -> None:
        """Copy ``local`` to ``remote``: a Windows path on a native node (``mode`` has no meaning
        there), a path inside the distribution on a WSL node (``mode`` applied)."""
        payload = Payload(path=local, node=self.node_name)
        self._upload(self.platform, payload, remote, mode=mode, progress=progress, label=str(local))

    def _upload(
        self,
        platform: Platform,
        payload: Payload,
        remote: str | None,
        *,
        suffix: str = ".tmp",
        mode: int | None = None,
        progress: Progress | None = None,
        label: str = "a script",
    ) -> str:
        """Write ``payload`` to ``remote`` (None: a new file in the node's temporary directory),
        SHA-256 checked on the node; returns the full path the node reports."""
        return piped.upload(
            self._run_piped,
            platform,
            payload,
            remote,
            node=self.node_name,
            chunk=send_chunk_size(),
            cancelled=lambda: self._closed,
            mode=mode,
            suffix=suffix,
            progress=progress,
            label=label,
        )

    def get(self, remote: str, local: Path, *, progress: Progress | None = None) -> None:
        """Copy ``remote`` to ``local``: written as ``local.part`` and renamed once the SHA-256 matches.

        In a WSL distribution the sending script stops on end-of-file, like a command: a cancelled
        get does not leave it reading and encoding the rest of the file behind wsl.exe."""
        eof = self.platform.stops_on_stdin_eof
        piped.download(
            lambda line, stdin, on_line: self._run_piped(line, stdin, on_line, stop_by_eof=eof),
            self.platform,
            remote,
            local,
            node=self.node_name,
            cancelled=lambda: self._closed,
            progress=progress,
            stop_on_hangup=eof,
        )

    def _run_piped(
        self, line: str, stdin: Iterator[bytes] | None, on_line: OnLine | None, *, stop_by_eof: bool = False
    ) -> Result:
        """A file transfer's command: stdin streamed in Sends, no timeout. Its stdin is closed before
        it is given up on (see ``_execute``): the receiving script of a put then ends on its own."""
        return self._execute(
            line,
            deadline=Deadline(None),
            on_line=on_line,
            keep_lines=20,
            stdin=stdin,
            stop_by_eof=stop_by_eof,
        )

    def close(self) -> None:
        """Close for good (also from another thread). Idle shells are deleted now; a running command
        is terminated, and its shell deleted, at its next Receive round."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for lane in idle:
            self._discard(lane)
