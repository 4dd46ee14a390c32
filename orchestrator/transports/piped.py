"""Files through a command's stdin and stdout: the controller's half of the protocol whose scripts the
platform writes (:mod:`orchestrator.platforms.transfer`).

Used by the WinRM transport (it has no other way) and by the SSH transport when the server has no
sftp subsystem. An upload hashes the local file, then streams it as base64 lines into the platform's
``upload_script``, which renames it into place only when the node's SHA-256 matches. A download
writes the ``data`` lines to ``local.part`` as they arrive and renames it once the SHA-256 the node
printed equals the one of the bytes received. Files are read and written in chunks: a file of any
size never sits in memory, and no chunk comes near a command-line or message limit.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from orchestrator import safefiles
from orchestrator.errors import CancelledError, TransferError
from orchestrator.platforms import Platform
from orchestrator.platforms.transfer import GET_CHUNK
from orchestrator.transports.base import OnLine, Result, Stream, log

#: progress of a transfer: (bytes done, bytes in all)
Progress = Callable[[int, int], None]
#: how a transport runs one transfer command: (command line, stdin pieces or None, line handler or
#: None) -> its result, stdin closed after the last piece
Runner = Callable[[str, "Iterator[bytes] | None", "OnLine | None"], Result]
#: files larger than this report progress to the log even without a callback
PROGRESS_LOG_BYTES = 8 * 1024 * 1024
#: how much of a local file is read at once while hashing it
_READ = 1024 * 1024


def plan_chunks(size: int, chunk: int) -> list[tuple[int, int]]:
    """(offset, length) of each piece of a payload of ``size`` bytes; an empty one is one empty piece
    (the send that closes stdin)."""
    if size <= 0:
        return [(0, 0)]
    return [(offset, min(chunk, size - offset)) for offset in range(0, size, chunk)]


class Payload:
    """The bytes of one upload: in memory (a script) or a local file read chunk by chunk."""

    def __init__(self, *, data: bytes | None = None, path: Path | None = None, node: str = "") -> None:
        self.data = data
        self.path = path
        self.node = node
        digest = hashlib.sha256()
        if data is not None:
            digest.update(data)
            self.size = len(data)
        else:
            assert path is not None
            self.size = 0
            with self._open() as fh:
                while block := fh.read(_READ):
                    digest.update(block)
                    self.size += len(block)
        self.sha256 = digest.hexdigest()

    def _open(self) -> BinaryIO:
        assert self.path is not None
        try:
            return self.path.open("rb")
        except OSError as exc:
            raise TransferError(f"cannot read {self.path}: {exc.strerror}", node=self.node) from None

    def lines(self, chunk: int, report: Callable[[int], None]) -> Iterator[bytes]:
        """Each ``chunk`` bytes as one base64 line (``report`` told the bytes done after each); an
        empty payload is one empty piece (the send that closes stdin)."""
        if self.size == 0:
            yield b""
            return
        done = 0
        if self.data is not None:
            for offset, length in plan_chunks(self.size, chunk):
                yield base64.b64encode(self.data[offset : offset + length]) + b"\n"
                done += length
                report(done)
            return
        with self._open() as fh:
            while piece := fh.read(chunk):
                yield base64.b64encode(piece) + b"\n"
                done += len(piece)
                report(done)


def reporter(node: str, callback: Progress | None, total: int, label: str) -> Callable[[int], None]:
    """A reporter of bytes done: the callback, plus a log line per 10% for large files."""
    step = max(total // 10, 1)
    last = [0]

    def report(done: int) -> None:
        if callback is not None:
            callback(done, total)
        if total >= PROGRESS_LOG_BYTES and (done - last[0] >= step or done == total):
            last[0] = done
            log.info("%s: %s: %d%% of %d bytes", node, label, done * 100 // total, total)

    return report


def fields(stdout: str) -> dict[str, str]:
    """``key value`` lines of a transfer script's output (the last one of each key wins)."""
    found: dict[str, str] = {}
    for line in stdout.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            found[key] = value.strip()
    return found


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else ""


def check_upload(result: Result, digest: str, *, node: str, label: str, where: str, cancelled: bool) -> str:
    """The path the node reports for an upload that arrived whole; else why not, as an error."""
    if cancelled and result.exit_code is None:
        raise CancelledError(f"cancelled while copying {label} to {where}", node=node)
    found = fields(result.stdout)
    if result.exit_code == 0 and found.get("sha256") == digest:
        return found.get("path", "")
    reason = _last_line(result.stderr)
    if "sha256 mismatch" in result.stderr or (found.get("sha256") and found["sha256"] != digest):
        raise TransferError(
            f"copying {label} to {where} failed the SHA-256 check: the node received different "
            f"bytes ({reason or 'hash ' + found.get('sha256', '?')}); nothing was replaced",
            node=node,
            hint="retry; if it repeats, something on the path alters the data",
            result=result,
        )
    if not reason:
        reason = (
            f"exit code {result.exit_code}"
            if result.exit_code != 0
            else "the node did not confirm the copy (no sha256 line in its output)"
        )
    raise TransferError(f"cannot copy {label} to {where}: {reason}", node=node, result=result)


class Download:
    """Receives a ``download_script``'s output into ``local.part`` (use as a context manager around
    the command, with :meth:`on_line` as its line handler), then :meth:`finish` checks and renames."""

    def __init__(self, node: str, remote: str, local: Path, progress: Progress | None = None) -> None:
        self.node, self.remote, self.local = node, remote, local
        self.part = local.with_name(local.name + ".part")
        self._progress = progress
        self._report: Callable[[int], None] = lambda done: None
        self._digest = hashlib.sha256()
        self._file: BinaryIO | None = None
        self.size: int | None = None
        self.done = 0
        self.sha256: str | None = None
        self.bad: str | None = None

    def __enter__(self) -> Download:
        try:
            # owner-only, never written through a link planted as the .part (safefiles.replacing)
            safefiles.private_dirs(self.local.parent)
            self.part.unlink(missing_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | safefiles.NOFOLLOW
            self._file = os.fdopen(os.open(self.part, flags, 0o600), "wb")
        except OSError as exc:
            raise TransferError(f"cannot write {self.part}: {exc.strerror}", node=self.node) from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()
        if exc[0] is not None and self.part.exists():
            self.part.unlink()

    def on_line(self, stream: Stream, line: str) -> None:
        if stream != "stdout":
            return
        kind, _, value = line.partition(" ")
        if kind == "data":
            try:
                piece = base64.b64decode(value, validate=True)
            except ValueError:
                self.bad = self.bad or f"undecodable data line at byte {self.done}"
                return
            assert self._file is not None
            self._file.write(piece)
            self._digest.update(piece)
            self.done += len(piece)
            self._report(self.done)
        elif kind == "size":
            self.size = int(value) if value.isdigit() else None
            self._report = reporter(self.node, self._progress, self.size or 0, self.remote)
        elif kind == "sha256":
            self.sha256 = value.strip()

    def finish(self, result: Result, *, cancelled: bool) -> None:
        """Rename ``local.part`` to ``local`` when everything arrived intact; else remove it and
        raise why."""
        if self._file is not None:
            self._file.close()
        try:
            if cancelled and result.exit_code is None:
                raise CancelledError(f"cancelled while copying {self.remote}", node=self.node)
            if result.exit_code != 0:
                reason = _last_line(result.stderr) or f"exit code {result.exit_code}"
                raise TransferError(
                    f"cannot copy {self.remote} from the node: {reason}", node=self.node, result=result
                )
            local_hash = self._digest.hexdigest()
            if self.bad or self.sha256 != local_hash:
                raise TransferError(
                    f"copying {self.remote} to {self.local} failed the SHA-256 check: the node hashed "
                    f"{self.sha256 or 'nothing'}, {local_hash} arrived"
                    + (f" ({self.bad})" if self.bad else "")
                    + f"; {self.local} was not written",
                    node=self.node,
                    hint="retry; if it repeats, something on the path alters the data",
                    result=result,
                )
            os.replace(self.part, self.local)
        finally:
            if self.part.exists():
                self.part.unlink()


def upload(
    run: Runner,
    platform: Platform,
    payload: Payload,
    remote: str | None,
    *,
    node: str,
    chunk: int,
    cancelled: Callable[[], bool],
    mode: int | None = None,
    suffix: str = ".tmp",
    progress: Progress | None = None,
    label: str = "a script",
) -> str:
    """Send ``payload`` to ``remote`` (None: a new file in the node's temporary directory, its name
    ending in ``suffix``) in base64 lines of ``chunk`` bytes; returns the path the node reports."""
    script = platform.upload_script(remote, payload.sha256, mode=mode, suffix=suffix)
    lines = payload.lines(chunk, reporter(node, progress, payload.size, label))
    result = run(platform.login_command(script), lines, None)
    where = remote or "a temporary file"
    return check_upload(result, payload.sha256, node=node, label=label, where=where, cancelled=cancelled())


def download(
    run: Runner,
    platform: Platform,
    remote: str,
    local: Path,
    *,
    node: str,
    cancelled: Callable[[], bool],
    chunk: int = GET_CHUNK,
    progress: Progress | None = None,
    stop_on_hangup: bool = False,
) -> None:
    """Copy ``remote`` to ``local`` (through ``local.part``, renamed once the SHA-256 matches).

    ``stop_on_hangup``: the node's script stops (its whole tree) when its stdin reaches end-of-file
    (``Platform.stop_on_hangup``), for a transport that closes that stdin to cancel it."""
    script = platform.download_script(remote, chunk)
    if stop_on_hangup:
        script = platform.stop_on_hangup(script)
    with Download(node, remote, local, progress) as received:
        result = run(platform.login_command(script), None, received.on_line)
        received.finish(result, cancelled=cancelled())
