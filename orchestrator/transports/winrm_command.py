"""One WinRS command of the WinRM transport, once started in a lane: its output turned into lines,
its stdin sent, and how it is stopped.

Output (:class:`CommandOutput`): the shell runs with code page 65001 (UTF-8); Windows programs end
lines with CRLF; a ``wsl.exe`` command's streams go through
:class:`~orchestrator.platforms.wsl.WslOutput`, which decodes the UTF-16LE an older wsl.exe writes
for its own messages; PowerShell's stderr is CLIXML, decoded to the text a person reads.

Stdin and stopping (:class:`WinRSCommand`): the job object of the shell holds Windows processes only:
for a ``wsl.exe`` command Windows ends wsl.exe and nothing else, and the Linux processes it started
keep running. What stops them is the transport itself: before terminating a command whose stdin is
still open (a script that stops on end-of-file, or a transfer whose data was still being sent), it
closes that stdin (a Send with ``End="true"``) and gives the command
:attr:`~orchestrator.transports.winrm.WinRMTransport.STOP_GRACE` seconds to end on that end-of-file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from winrm.exceptions import WinRMOperationTimeoutError, WinRMTransportError, WSManFaultError

from orchestrator.errors import ConnectError
from orchestrator.platforms.wsl import WslOutput, is_wsl_command
from orchestrator.transports.base import Deadline, LineSplitter, OnLine, log
from orchestrator.transports.clixml import ClixmlDecoder
from orchestrator.transports.winrm_shell import Crlf, Lane, set_read_timeout, utf8_decoder


class TooLarge(Exception):
    """A Send the host refused as larger than its MaxEnvelopeSizekb (HTTP 413)."""

    def __init__(self, error: WinRMTransportError) -> None:
        super().__init__(str(error))
        self.error = error


class CommandOutput:
    """The two streams of one command as lines: stdout and stderr each through a
    :class:`~orchestrator.transports.base.LineSplitter` (``on_line``, the kept lines)."""

    def __init__(
        self, command_line: str, on_line: OnLine | None, keep_lines: int | None, *, decode_clixml: bool
    ) -> None:
        self.out = LineSplitter("stdout", on_line, keep_lines)
        self.err = LineSplitter("stderr", on_line, keep_lines)
        self._clixml = ClixmlDecoder() if decode_clixml else None
        self._err_text = utf8_decoder()
        self._out_crlf, self._err_crlf = Crlf(), Crlf()
        wsl = is_wsl_command(command_line)
        self._out_wsl: WslOutput | None = WslOutput() if wsl else None
        self._err_wsl: WslOutput | None = WslOutput() if wsl else None

    def feed_out(self, data: bytes, final: bool = False) -> None:
        if self._out_wsl is not None:
            data = self._out_wsl(data, final=final)
        self.out.feed(self._out_crlf(data, final=final))

    def feed_err(self, data: bytes, final: bool = False) -> None:
        if self._err_wsl is not None:
            data = self._err_wsl(data, final=final)
        text = self._err_text.decode(data, final=final)
        if self._clixml is not None:
            text = self._clixml.feed(text) + (self._clixml.close() if final else "")
        if text or final:
            self.err.feed(self._err_crlf(text.encode("utf-8"), final=final))

    def close(self) -> None:
        """The end of both streams: what the decoders held back, then each stream's last line."""
        self.feed_err(b"", final=True)
        self.feed_out(b"", final=True)
        self.out.close()
        self.err.close()


@dataclass
class WinRSCommand:
    """A command running in ``lane``'s shell, seen from our end: its stdin, and how it is stopped.
    Clean-up requests wait at most ``stop_timeout`` seconds for an answer (the host may be gone)."""

    lane: Lane
    command_id: str
    node: str
    connect_timeout: float
    stop_timeout: float

    def send_stdin(
        self,
        chunks: Iterator[bytes],
        *,
        cancelled: Callable[[], bool],
        lost: Callable[[BaseException, str], ConnectError],
    ) -> bool:
        """Send every chunk, the last one closing stdin; False when sending stopped before that
        (cancelled: stdin is still open). A command that has already exited (it failed early)
        refuses more input: stop sending; its output tells why. A request over the host's
        MaxEnvelopeSizekb (HTTP 413) is an error (:class:`TooLarge`): the command would wait for
        that input for ever."""
        protocol, shell, command_id = self.lane.protocol, self.lane.shell_id, self.command_id
        pending = next(chunks, b"")
        while True:
            if cancelled():
                return False
            following = next(chunks, None)
            try:
                protocol.send_command_input(shell, command_id, pending, end=following is None)
            except (WSManFaultError, WinRMTransportError) as exc:
                if isinstance(exc, WinRMTransportError) and exc.code == 413:
                    raise TooLarge(exc) from None
                log.debug("%s: stdin refused (the command ended?): %s", self.node, exc)
                return True
            except Exception as exc:
                if cancelled():
                    return False
                raise lost(exc, "send input") from None
            if following is None:
                return True
            pending = following

    def close_stdin(self) -> bool:
        """Send the command's end-of-file (an empty Send with ``End="true"``); False when refused."""
        protocol = self.lane.protocol
        set_read_timeout(protocol, self.connect_timeout, self.stop_timeout)
        try:
            protocol.send_command_input(self.lane.shell_id, self.command_id, b"", end=True)
        except Exception as exc:  # the command ended meanwhile, or the host is going away
            log.debug("%s: closing stdin failed: %s", self.node, exc)
            return False
        return True

    def stop_by_eof(self, output: CommandOutput, grace_seconds: float) -> None:
        """Close the command's stdin and give it ``grace_seconds`` to end, reading its output.

        A POSIX script in WSL stops its own process group when its stdin reaches end-of-file (the
        platform's ``stop_on_hangup``, as over SSH), and a transfer's receiving script ends when its
        input does. Terminating the command or deleting the shell only ends ``wsl.exe`` on the
        Windows side and leaves the Linux processes running: this end-of-file is what reaches them."""
        if not self.close_stdin():
            return
        protocol = self.lane.protocol
        grace = Deadline(grace_seconds)
        while not grace.expired:
            protocol.operation_timeout_sec = 1
            try:
                stdout, stderr, _code, done = protocol.get_command_output_raw(
                    self.lane.shell_id, self.command_id
                )
            except WinRMOperationTimeoutError:
                continue
            except Exception as exc:
                log.debug("%s: reading after end-of-file failed: %s", self.node, exc)
                return
            if stdout:
                output.feed_out(stdout)
            if stderr:
                output.feed_err(stderr)
            if done:
                return

    def terminate(self) -> None:
        """Signal terminate; the lane is then discarded (its shell deleted) by the transport."""
        set_read_timeout(self.lane.protocol, self.connect_timeout, self.stop_timeout)
        try:
            self.lane.protocol.cleanup_command(self.lane.shell_id, self.command_id)
        except Exception as exc:
            log.debug("%s: WinRM terminate signal failed: %s", self.node, exc)
