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
- WinRS runs every command as ``cmd.exe /c LINE`` (unless WINRS_SKIP_CMD_SHELL is TRUE): that cmd.exe is
  a process of the job too, so a PowerShell command is two processes of the quota (the server creates
  both: tests/winrm_server/server.py).
- ``MaxMemoryPerShellMB`` (1024 by default) limits the memory of the job's processes together: "the
  maximum total amount of memory [...] that can be allocated by any active remote shell and all its
  child processes [...] the remote operation is terminated when a new allocation exceeds the specified
  quota" (the Windows Remote Shell group policy's text). Users report the allocation failing with
  ``The paging file is too small for this operation to complete.`` (ERROR_COMMITMENT_LIMIT; ansible
  issue 39327). Played here: the resident memory of the real Linux processes standing for the job's
  processes (and of everything they start), polled every :data:`MEMORY_POLL` seconds; over the limit,
  :attr:`ProcessTable.on_memory_exceeded` is called (the server writes that text and terminates the
  shell's commands). Documented and reported, not recorded here. Kinder than Windows: played
  processes without a Linux process (powershell.exe, cmd.exe) weigh nothing, and an allocation is
  noticed after it happened, not refused.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: what Process.Start throws when the job's active process limit is reached (ERROR_NOT_ENOUGH_QUOTA)
QUOTA_MESSAGE = "Not enough quota is available to process this command"
ERROR_NOT_ENOUGH_QUOTA = 1816
#: what an allocation over the job's memory limit fails with (ERROR_COMMITMENT_LIMIT, 1455), as users
#: of WinRS shells over MaxMemoryPerShellMB report it
MEMORY_MESSAGE = "The paging file is too small for this operation to complete."
#: seconds between two looks at the memory of the jobs' real processes
MEMORY_POLL = 0.05
_PAGE = os.sysconf("SC_PAGE_SIZE")
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

    def __init__(self, max_processes_per_shell: int = 25, max_memory_per_shell_mb: int = 1024) -> None:
        self.max_processes_per_shell = max_processes_per_shell
        self.max_memory_per_shell_mb = max_memory_per_shell_mb
        #: called with (job, MB in use) when a job's processes pass MaxMemoryPerShellMB
        self.on_memory_exceeded: Callable[[str, int], None] | None = None
        #: "JOB: MB" of every job found over its memory limit
        self.over_memory: list[str] = []
        self._watching = False
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
            if in_job is not None and self.max_memory_per_shell_mb:
                self._watch_memory()
        return proc

    # -- MaxMemoryPerShellMB ---------------------------------------------------------------------------

    def _watch_memory(self) -> None:
        with self.lock:
            if self._watching:
                return
            self._watching = True
        threading.Thread(target=self._memory_loop, name="winrm-job-memory", daemon=True).start()

    def _memory_loop(self) -> None:
        while True:
            with self.lock:
                jobs: dict[str, list[int]] = {}
                for p in self._all:
                    if p.alive and p.job is not None and p.linux is not None:
                        jobs.setdefault(p.job, []).append(p.linux.pid)
                if not jobs:
                    self._watching = False
                    return
            for job, sessions in jobs.items():
                used = resident_mb(sessions)
                if used > self.max_memory_per_shell_mb:
                    with self.lock:
                        self.over_memory.append(f"{job}: {used}")
                    if self.on_memory_exceeded is not None:
                        self.on_memory_exceeded(job, used)
                    self.terminate_job(job)  # whatever the callback left: the operation ends
            time.sleep(MEMORY_POLL)

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


def resident_mb(sessions: list[int]) -> int:
    """Resident memory, in MiB, of every Linux process in the given sessions (a played process' real
    process is a session leader: what it starts, a DataLoader worker say, is in its session)."""
    wanted = set(sessions)
    pages = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[3]) in wanted:  # session id
            pages += int(fields[21])  # rss, in pages
    return pages * _PAGE // (1024 * 1024)
