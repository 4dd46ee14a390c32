"""``connection: local``: the controller's own machine, through a subprocess."""

from __future__ import annotations

import os
import secrets
import selectors
import shutil
import signal
import subprocess
import threading
from pathlib import Path

from orchestrator import safefiles
from orchestrator.errors import CancelledError, TransferError
from orchestrator.platforms import Platform
from orchestrator.transports.base import Deadline, LineSplitter, OnLine, Result, Transport

#: bytes copied at a time by get(): a close between two blocks ends the copy
COPY_BLOCK = 1 << 20


class LocalTransport(Transport):
    kind = "local"

    def __init__(self, node_name: str, platform: Platform) -> None:
        super().__init__(node_name, platform)
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def connected(self) -> bool:
        return not self._closed

    def connect(self) -> None:
        if self._closed:  # closing is for good, as for every transport: a cancelled session starts nothing
            raise CancelledError("cancelled before the command could run", node=self.node_name)

    #: after the command exits, how long its output may still trail in (a child it left behind can
    #: hold the pipe open forever: then the group is stopped, as the SSH transport does)
    EOF_GRACE = 2.0
    #: after a timeout, how long the command's last output is still read while the watcher stops it
    #: (TERM, then KILL 5 s later: ``Platform.stop_on_hangup``)
    STOP_WAIT = 10.0

    def plan(self, script: str) -> str:
        """On POSIX, the command under the watcher the SSH transport's commands run under
        (``stop_on_hangup``): our pipe on its stdin closes when we cancel it, and when this process
        dies in any way (SIGKILL, OOM), so the command and everything it started (torchrun's
        workers in their own sessions, by the job's token) are stopped either way."""
        return self.platform.stop_on_hangup(script) if self.platform.as_posix() is not None else script

    def run_raw(
        self,
        script: str,
        *,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        keep_lines: int | None = None,
    ) -> Result:
        self.connect()
        deadline = Deadline(timeout)
        # Own session. Under the watcher (POSIX), the command runs in a group of its own that only the
        # watcher reaches: a timeout or a cancel closes its stdin, and our shell's group (the watcher
        # in it) is never killed. Otherwise a timeout or a cancel kills our shell's group.
        watched = self.platform.as_posix() is not None
        proc = subprocess.Popen(
            self.platform.local_argv(self.plan(script)),
            # in the home directory, as an SSH login starts: never in the directory bootstrap was
            # started from, whose modules another user may have put there for a node-side Python
            cwd=_home(),
            stdin=subprocess.PIPE if watched else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        with self._lock:
            self._procs.add(proc)
        if self._closed:  # closed while it started: close() did not see it
            self._stop(proc)
        out = LineSplitter("stdout", on_line, keep_lines)
        err = LineSplitter("stderr", on_line, keep_lines)
        timed_out = False
        stopping: Deadline | None = None  # after a timeout: the watcher stops it, its output still read
        grace: Deadline | None = None
        drain: Deadline | None = None
        assert proc.stdout is not None and proc.stderr is not None
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ, out)
                sel.register(proc.stderr, selectors.EVENT_READ, err)
                while sel.get_map():
                    if stopping is None and deadline.expired:
                        timed_out = True
                        if not watched:
                            break
                        self._stop(proc)  # what a TERM handler prints is still read, for STOP_WAIT
                        stopping = Deadline(self.STOP_WAIT)
                    if stopping is not None and stopping.expired:
                        break
                    if grace is None and proc.poll() is not None:
                        grace = Deadline(self.EOF_GRACE)
                    expired = grace is not None and grace.expired
                    if expired and drain is None:
                        drain = Deadline(1.0)  # a child still writing must not keep us forever
                    if drain is not None and drain.expired:
                        break
                    # past the grace period, only what is already in the pipes (a loaded machine may
                    # not have run this loop for a while: output written before the exit is never lost)
                    wait = 0.0 if expired else (grace or stopping or deadline).remaining(0.5)
                    ready = sel.select(wait)
                    if expired and not ready:
                        break
                    for key, _ in ready:
                        data = os.read(key.fd, 65536)
                        if not data:
                            sel.unregister(key.fileobj)
                            continue
                        key.data.feed(data)
            # the command is over (or being stopped): under the watcher, it stops what the command
            # left (TERM, KILL 5 s later) once its stdin closes; else our shell's group is killed
            self._stop(proc)
            if not watched:
                self._kill(proc)
            exit_code = proc.poll() if timed_out or self._closed else proc.wait()
        finally:
            with self._lock:
                self._procs.discard(proc)
            self._stop(proc)
            proc.stdout.close()
            proc.stderr.close()
        out.close()
        err.close()
        return Result(
            node=self.node_name,
            command=script,
            exit_code=None if timed_out or self._closed else exit_code,
            stdout=out.text,
            stderr=err.text,
            duration=deadline.elapsed,
            timed_out=timed_out,
        )

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        """End the command: under the watcher, close its stdin (it stops the command's whole tree,
        TERM then KILL 5 s later; after a normal end, what the command left in its group); else kill
        our shell's group."""
        if proc.stdin is None:
            self._kill(proc)
            return
        try:
            proc.stdin.close()
        except OSError:
            pass

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        self.connect()
        target = _at_home(remote)
        # a new file beside the target, renamed over it once whole, as the SFTP and shell uploads do:
        # a link planted at the target (a run's code can, in the code directory) is replaced, never
        # written through
        part = target.with_name(f".{target.name}.{secrets.token_hex(6)}.part")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with local.open("rb") as source:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                fd = os.open(part, flags, 0o600 if mode is not None else 0o666)
                try:
                    with os.fdopen(fd, "wb") as out:
                        if mode is not None:
                            os.fchmod(fd, mode)  # before the first byte
                        shutil.copyfileobj(source, out)
                    os.replace(part, target)
                except BaseException:
                    part.unlink(missing_ok=True)
                    raise
        except OSError as exc:
            raise TransferError(f"cannot copy {local} to {remote}: {exc}", node=self.node_name) from exc

    def get(self, remote: str, local: Path) -> None:
        self.connect()
        try:
            safefiles.private_dirs(local.parent)
            with open(_at_home(remote), "rb") as source, safefiles.replacing(local) as out:
                # block by block, so that a close (Ctrl-C) ends the copy as it ends an SFTP one: the
                # partial file goes, the copy here is not replaced
                for block in iter(lambda: source.read1(COPY_BLOCK), b""):
                    if self._closed:
                        raise CancelledError(f"copy of {remote} cancelled", node=self.node_name)
                    out.write(block)
                    out.flush()
        except OSError as exc:
            raise TransferError(f"cannot copy {remote} to {local}: {exc}", node=self.node_name) from exc

    def close(self) -> None:
        self._closed = True
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            self._stop(proc)

    def describe(self) -> str:
        return "local"


def _home() -> str:
    """Where commands run: the home directory, or ``/`` when it does not exist (sshd's choice too)."""
    home = os.path.expanduser("~")
    return home if os.path.isdir(home) else "/"


def _at_home(remote: str) -> Path:
    """A node path as an SSH node reads it: ``~`` expanded, a relative one below the home directory
    (where commands run), not below the directory bootstrap was started from."""
    return Path(_home()) / os.path.expanduser(remote)
