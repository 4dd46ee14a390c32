"""Windows processes as the test server plays them: ids, creation times, parents, and the job object
of the WinRS shell that holds each one (or none), with the shell's ``MaxProcessesPerShell`` quota.

What the model takes from Windows (documented, not recorded here):

- WinRS starts every command of a shell inside the shell's job object; a process a job's process
  creates is in the same job (no breakaway). Deleting the shell closes the job: every process in it
  ends (TerminateProcess). A WinRS terminate signal ends the command's process and what it started.
- ``MaxProcessesPerShell`` (``winrm/config/winrs``, 25 by default) limits the processes of that job:
  "the maximum number of processes allowed per shell, including the shell's child processes"
  (Microsoft's "Quota Management for Remote Shells"). Windows enforces it as the job's active process
  limit: a process that would be one too many is not created, and its creator gets
  ERROR_NOT_ENOUGH_QUOTA (1816, "Not enough quota is available to process this command.") as
  ``Process.Start`` reports it. That text and code come from the job object's documented behaviour,
  not from a recording of a WinRS shell over its quota.
- ``Win32_Process`` Create (the WMI service) creates a process in no job of ours: a WinRS shell's
  quota does not count it and deleting the shell does not end it.
- A process is known by its id and creation time (a FILETIME): ids are reused, the pair is not.

A played process may stand for a real Linux process (``linux``: a rank runs as a real Python
process): terminating the played process kills the real one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

#: what Process.Start throws when the job's active process limit is reached (ERROR_NOT_ENOUGH_QUOTA)
QUOTA_MESSAGE = "Not enough quota is available to process this command"
ERROR_NOT_ENOUGH_QUOTA = 1816
#: FILETIME of the Unix epoch (100 ns ticks since 1601-01-01)
_EPOCH_TICKS = 116444736000000000


class QuotaExceeded(Exception):
    """The job is at MaxProcessesPerShell: the process was not created."""


@dataclass(eq=False)
class WinProcess:
    pid: int
    ticks: int  # creation time, FILETIME
    parent: int  # 0: none of ours (WMI, the WinRS service)
    job: str | None  # the WinRS shell whose job holds it; None: outside every shell's job
    image: str
    command_line: str = ""
    linux: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    terminated: bool = False  # ended by TerminateProcess (a job closed, Stop-Process, taskkill)
    ended: threading.Event = field(default_factory=threading.Event)

    @property
    def alive(self) -> bool:
        return not self.ended.is_set()

    @property
    def identity(self) -> str:
        """What the run scripts record: "PID TICKS"."""
        return f"{self.pid} {self.ticks}"


class ProcessTable:
    """Every played Windows process of one test server."""

    def __init__(self, max_processes_per_shell: int = 25) -> None:
        self.max_processes_per_shell = max_processes_per_shell
        self.lock = threading.RLock()
        self._all: list[WinProcess] = []
        self._pids = itertools.count(4104, 4)  # Windows hands out multiples of 4
        self._last_ticks = 0
        #: "JOB: IMAGE" of every process refused by the quota
        self.refused: list[str] = []

    def _ticks(self) -> int:
        ticks = int(time.time() * 10_000_000) + _EPOCH_TICKS
        self._last_ticks = max(ticks, self._last_ticks + 1)  # a later process is created later
        return self._last_ticks

    def create(
        self,
        image: str,
        command_line: str = "",
        *,
        parent: WinProcess | None,
        job: str | None = None,
        argv: list[str] | None = None,
        **popen: Any,
    ) -> WinProcess:
        """A new process, child of ``parent`` and in its job (``parent`` None: in ``job``, None for
        ``Win32_Process`` Create). ``argv``: the real Linux process standing for it (started here,
        its own process group). Raises QuotaExceeded when its job is full."""
        in_job = parent.job if parent is not None else job
        with self.lock:
            if in_job is not None and self.max_processes_per_shell:
                members = [p for p in self._all if p.job == in_job and p.alive]
                if len(members) >= self.max_processes_per_shell:
                    self.refused.append(f"{in_job}: {image}")
                    raise QuotaExceeded(f"{QUOTA_MESSAGE} ({image}: MaxProcessesPerShell reached)")
            proc = WinProcess(
                next(self._pids), self._ticks(), parent.pid if parent else 0, in_job, image, command_line
            )
            if argv is not None:
                proc.linux = subprocess.Popen(argv, start_new_session=True, **popen)
            self._all.append(proc)
        if proc.linux is not None:
            threading.Thread(target=self._reap, args=(proc,), daemon=True).start()
        return proc

    def _reap(self, proc: WinProcess) -> None:
        assert proc.linux is not None
        code = proc.linux.wait()
        self.exited(proc, code if code >= 0 else 1)

    def exited(self, proc: WinProcess, code: int) -> None:
        """The process ended by itself with ``code``."""
        with self.lock:
            if proc.alive:
                proc.exit_code = code
                proc.ended.set()

    def terminate(self, proc: WinProcess, code: int = 1) -> bool:
        """TerminateProcess: ends at once, whatever it was doing (no clean-up of its own)."""
        with self.lock:
            if not proc.alive:
                return False
            proc.terminated = True
            proc.exit_code = code
            proc.ended.set()
        if proc.linux is not None and proc.linux.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.linux.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.linux.wait(10)
        return True

    def descendants(self, proc: WinProcess) -> list[WinProcess]:
        """Live processes below ``proc``: children by parent id, created after their parent."""
        with self.lock:
            found: list[WinProcess] = []
            known = {proc.pid: proc.ticks}
            grew = True
            while grew:
                grew = False
                for p in self._all:
                    if p.alive and p not in found and p.parent in known and p.ticks >= known[p.parent]:
                        if p.pid in known:
                            continue
                        found.append(p)
                        known[p.pid] = p.ticks
                        grew = True
            return found

    def terminate_tree(self, proc: WinProcess) -> list[WinProcess]:
        """``proc`` and every descendant (taskkill /T /F; a WinRS terminate signal)."""
        ended = [p for p in [proc, *self.descendants(proc)] if self.terminate(p)]
        return ended

    def terminate_job(self, job: str) -> list[WinProcess]:
        """The shell's job is closed: every process in it ends."""
        with self.lock:
            members = [p for p in self._all if p.job == job and p.alive]
        return [p for p in members if self.terminate(p)]

    def find(self, pid: int, ticks: int | None = None) -> WinProcess | None:
        """The live process with that id (and creation time)."""
        with self.lock:
            for p in self._all:
                if p.pid == pid and p.alive and (ticks is None or p.ticks == ticks):
                    return p
        return None

    def by_identity(self, line: str) -> WinProcess | None:
        """The live process a "PID TICKS" line names, as Get-CbLive finds it."""
        words = line.split()
        if len(words) < 2 or not words[0].isdigit() or not words[1].isdigit():
            return None
        return self.find(int(words[0]), int(words[1]))

    def live(self) -> list[WinProcess]:
        with self.lock:
            return [p for p in self._all if p.alive]

    def all(self) -> list[WinProcess]:
        with self.lock:
            return list(self._all)

    def in_job(self, job: str) -> list[WinProcess]:
        with self.lock:
            return [p for p in self._all if p.job == job and p.alive]

    def close(self) -> None:
        """Clean-up of this machine when the server stops: every real process standing for one."""
        for p in self.live():
            self.terminate(p)
