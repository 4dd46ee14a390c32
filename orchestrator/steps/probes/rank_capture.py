"""Every line of every rank exactly once: per-rank capture on the node (issue 17).

torchrun's ``--tee`` copies each rank's log file line by line into one shared output and writes a
partial line at end of file with its prefix; ``print(x)`` under PYTHONUNBUFFERED is two writes (x,
then the newline), so under load one rank's line was cut and glued to another's. Here nothing is
shared until a line is complete:

``worker DIR CMD...``   torchrun starts this as each rank (``--no-python``): the rank's stdout and
                        stderr go to its own file ``DIR/rank-<label>-attempt-<n>.out`` (appended in
                        the order the rank wrote them), through a pipe that a drainer process
                        (DRAINER, see through_drainer) appends to the file, then the process
                        becomes CMD (exec: same pid and session, so torchrun's signals reach the
                        training process itself).
                        The label is LOCAL_RANK, or RANK when CB_RANK_LABEL=global (elastic runs,
                        where the rendezvous assigns global ranks).
``mux DIR CMD...``      runs CMD (torchrun) and writes to its own stdout, in one stream: torchrun's
                        lines as they come, and every rank file's complete lines, each as
                        ``[default<label>]:<line>``. A rank's last line without a newline is written
                        as a line of its own when that rank's attempt is over (a newer attempt
                        appeared, or torchrun ended, and its drainer has appended the last byte:
                        up to DRAIN_WAIT after torchrun), never glued to anything. Exits with
                        torchrun's code. TERM/INT/HUP do not end it early: torchrun gets the same
                        signal (one process group), stops its workers, and everything they wrote up
                        to then is still delivered.

A line goes out within IDLE_MAX (0.1 s) of being written, GATHER (2 ms) later than that at most
while ranks print fast: a pass carries every complete line found, in one write.

With CB_SAMPLE_NONCE set (``bootstrap launch`` sets it), ``mux`` also samples the node every
SAMPLE_SECONDS into the same stream, as framed records (orchestrator/records.py) of that nonce: one
``gpu`` record whose fields are nvidia-smi's CSV lines (index, utilization %, memory used and total
MiB) where nvidia-smi is on PATH and answers, else one ``cpu`` record (1-minute load average, CPU
count). Rank lines are all tagged, so no rank can print a record; the records go out between lines,
never inside one.

Standard library only, any Python 3 the node trains with. The rank files are kept in DIR.
"""

import os
import re

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None

import base64
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time

_RANK_FILE = re.compile(r"rank-(\d+)-attempt-(\d+)\.out\Z")
READ = 1 << 20
#: a "line" this long without a newline is written out anyway: a rank printing progress with "\r"
#: forever must not grow this process without bound
MAX_PARTIAL = 1 << 20
#: a line redrawn with "\r" and no newline yet (tqdm's bar, for a whole epoch): its newest state goes
#: out this often as a ``progress`` record (the sample nonce's: PROGRESS[0], set by mux), shown as
#: the rank's line of the moment; the line itself goes out once complete, as every line does
PROGRESS_EVERY = 5.0
PROGRESS = [""]
#: seconds between looks at the rank files when nothing arrived: IDLE after a line, doubling up to
#: IDLE_MAX while the ranks stay quiet (a training prints now and then; the node's CPU is its own)
IDLE = 0.01
IDLE_MAX = 0.1
#: seconds between looks for new rank files (a new rank or attempt) while lines keep coming
SCAN = 0.05
#: while ranks print fast, a pass that found less than BATCH bytes waits GATHER seconds before the
#: next one: each pass costs system calls whatever it carries, and ranks printing at full speed would
#: otherwise be read a few lines at a time (CPU the ranks themselves need on a busy node)
BATCH = 1 << 16
GATHER = 0.002
#: bytes of the pipe into our stdout: a pass's lines go out in one write instead of a wake-up of
#: the reader (tee, sshd) per 64 KiB page run
PIPE_SIZE = 1 << 20
#: seconds the mux waits, once torchrun has ended, for the ranks' drainers to append their last bytes
#: (at once, unless a process a rank started outlives it and still holds its output)
DRAIN_WAIT = 5.0
#: seconds between two samples of the node's GPUs (or CPU load); nvidia-smi is given SAMPLE_TIMEOUT
SAMPLE_SECONDS = 5.0
SAMPLE_TIMEOUT = 10.0
GPU_QUERY = [
    "--query-gpu=index,utilization.gpu,memory.used,memory.total",
    "--format=csv,noheader,nounits",
]
_NONCE = re.compile(r"cb-[0-9a-f]{12}\Z")
#: one writer at a time on stdout: a sample never lands between the pieces of a block's write
_WRITING = threading.Lock()


def write_all(fd, data):
    with _WRITING:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except InterruptedError:
                continue


# the encoder of orchestrator/records.py, as its PYTHON_ENCODER (a unit test keeps them the same)
def record(nonce: "str", kind: "str", *fields: "bytes | str") -> "str":
    """One record line, newline included. ``str`` fields travel as their UTF-8 bytes."""
    # the annotations are strings and only base64 is used: node-side Python (3.8 and later) runs this
    # very source (PYTHON_ENCODER)
    parts = ["@@" + nonce, kind]
    for value in fields:
        data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
        parts.append(":" + base64.b64encode(data).decode("ascii"))
    return " ".join(parts) + "\n"


def sample(nonce):
    """One sample of this node as a record: its GPUs when nvidia-smi answers, else its CPU load."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            done = subprocess.run(
                [smi, *GPU_QUERY],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                timeout=SAMPLE_TIMEOUT,
            )
            gpus = [
                line.strip() for line in done.stdout.decode("utf-8", "replace").split("\n") if line.strip()
            ]
            if done.returncode == 0 and gpus:
                return record(nonce, "gpu", *gpus)
        except (OSError, subprocess.SubprocessError):
            pass  # a wedged or broken driver: the CPU load instead
    try:
        load = "%.2f" % os.getloadavg()[0]
    except OSError:
        load = ""
    return record(nonce, "cpu", load, str(os.cpu_count() or ""))


def sampler(nonce, stop):
    """Every SAMPLE_SECONDS until ``stop`` is set, the first at once."""
    while True:
        line = sample(nonce).encode("ascii")
        if stop.is_set():
            return
        write_all(1, line)
        if stop.wait(SAMPLE_SECONDS):
            return


def worker(directory, argv):
    glob_rank = os.environ.get("CB_RANK_LABEL") == "global"
    label = os.environ.get("RANK" if glob_rank else "LOCAL_RANK", "0")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    path = os.path.join(directory, "rank-%s-attempt-%s.out" % (int(label), int(attempt)))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
    out = through_drainer(fd)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    if out != fd:
        os.close(fd)  # the drainer keeps the file (and its lock)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        write_all(2, ("cannot start %s: %s\n" % (argv[0], exc)).encode())
        os._exit(127)


#: the drainer (see through_drainer): fd 0, the rank's pipe, appended to fd 1, its file. Its own
#: few lines, not this module: a Python with nothing but os, signal and time starts in a third of the
#: CPU, once per rank and attempt
DRAINER = """\
import os, signal, time
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)
while True:
    data = os.read(0, %d)
    if not data:
        break
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]
    if len(data) < %d:
        time.sleep(%r)  # let a fast rank fill the pipe: one append per many lines
""" % (READ, BATCH, GATHER)


def through_drainer(fd):
    """A pipe whose bytes a drainer process appends to ``fd`` (the rank's file), or ``fd`` itself
    when that cannot be set up. The rank's print()s then cost a pipe write each, not a file append
    (about a third less CPU per line), and the drainer appends them in large writes.

    The drainer holds an exclusive flock on the file until it has appended the last byte (the mux
    waits for that before it calls a rank's file complete) and outlives the rank whatever ends it:
    a session of its own (torchrun's killpg of the rank's group does not reach it), TERM/INT/HUP
    ignored, and no environment (not the run marker a stop signals every process by). It ends at
    end of file: once the rank and every process that inherited its output have exited."""
    if fcntl is None or not hasattr(os, "fork") or not sys.executable:
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        read_end, write_end = os.pipe()
    except OSError:  # no locks here (a network file system without them), no fds: the file itself
        return fd
    try:
        fcntl.fcntl(write_end, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
    except OSError:
        pass  # over the user's pipe limit: the default size, the drainer only wakes more often
    started_r, started_w = os.pipe()  # closed unwritten by the drainer's exec: it started
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; the tests exercise it through the processes
        try:
            os.setsid()
            if os.fork():  # the drainer is not the rank's child: the rank's wait() never reaps it
                os._exit(0)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(read_end, 0)
            os.dup2(fd, 1)
            os.dup2(null, 2)  # not torchrun's stderr: the mux sees its end when torchrun ends
            os.execve(sys.executable, [sys.executable, "-I", "-S", "-c", DRAINER], {})
        except BaseException:
            os.write(started_w, b"!")
        finally:
            os._exit(127)
    for end in (read_end, started_w):
        os.close(end)
    _, status = os.waitpid(pid, 0)
    failed = os.read(started_r, 1)
    os.close(started_r)
    if status != 0 or failed:  # no drainer: the rank writes into its file itself, nothing lost
        os.close(write_end)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return fd
    return write_end


def newest(line):
    """What a terminal shows of a line being redrawn with "\r": its last state."""
    states = [state for state in line.split(b"\r") if state]
    return states[-1] if states else b""


class RankFile:
    def __init__(self, path, label, attempt):
        self.path = path
        self.prefix = b"[default" + label.encode() + b"]:"
        self.label = label
        self.attempt = attempt
        self.fd = None
        self.partial = b""
        self.done = False
        self.drawn_at = 0.0  # when the newest state of a line redrawn with "\r" went out

    def read(self):
        """Complete lines read since the last call, prefixed, as one bytes object."""
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY)
            except OSError:
                return b""
        chunks = []
        while True:
            data = os.read(self.fd, READ)
            if not data:
                break
            chunks.append(data)
            if len(data) < READ:
                break
        if not chunks:
            return b""
        data = self.partial + b"".join(chunks)
        end = data.rfind(b"\n") + 1
        self.partial = data[end:]
        complete = data[:end]
        pieces = b""
        while len(self.partial) > MAX_PARTIAL:  # cut into lines of MAX_PARTIAL, each with its label
            pieces += self.prefix + self.partial[:MAX_PARTIAL] + b"\n"
            self.partial = self.partial[MAX_PARTIAL:]
        if PROGRESS[0] and b"\r" in self.partial and time.monotonic() - self.drawn_at >= PROGRESS_EVERY:
            state = newest(self.partial)  # a bar drawn with "\r": where it is now, as a record
            if state:  # (not a line: the line itself comes once it is complete, every byte of it)
                pieces += record(PROGRESS[0], "progress", self.label, state).encode()
                self.drawn_at = time.monotonic()
        if not complete:
            return pieces
        # one C-level replace prefixes every line of the block
        return self.prefix + complete[:-1].replace(b"\n", b"\n" + self.prefix) + b"\n" + pieces

    def written(self):
        """Whether every byte of the rank is in the file: no drainer holds its lock any more (files
        the rank wrote itself have none). A file not opened yet is opened to ask: seen only beside
        a newer attempt (both appeared between two scans), its drainer may still be appending."""
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY)
            except OSError:  # gone: nothing more will come from it
                return True
        try:
            fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except (OSError, AttributeError):  # no locks here: nor did the worker take one
            return True
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        return True

    def finish(self):
        """Everything left, the last line newline-terminated; the file is closed."""
        out = self.read()
        if self.partial:
            out += self.prefix + self.partial + b"\n"
            self.partial = b""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.done = True
        return out


class Streams:
    """torchrun's own stdout/stderr, forwarded a complete line at a time (its partial lines too are
    never glued to a rank's)."""

    def __init__(self, proc):
        self.sel = selectors.DefaultSelector()
        self.partial = {}
        for pipe in (proc.stdout, proc.stderr):
            os.set_blocking(pipe.fileno(), False)
            self.sel.register(pipe.fileno(), selectors.EVENT_READ)
            self.partial[pipe.fileno()] = b""

    @property
    def open(self):
        return bool(self.partial)

    def read(self, timeout):
        out = []
        for key, _ in self.sel.select(timeout) if self.partial else ():
            fd = key.fd
            try:
                data = os.read(fd, READ)
            except BlockingIOError:
                continue
            if not data:
                self.sel.unregister(fd)
                rest = self.partial.pop(fd)
                os.close(fd)
                if rest:
                    out.append(rest + b"\n")
                continue
            data = self.partial[fd] + data
            end = data.rfind(b"\n") + 1
            self.partial[fd] = data[end:]
            out.append(data[:end])
        return b"".join(out)


def scan(directory, files):
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name in files:
            continue
        match = _RANK_FILE.match(name)
        if match:
            files[name] = RankFile(os.path.join(directory, name), match.group(1), int(match.group(2)))


def drain(files, final):
    out = []
    latest = {}
    for f in files.values():
        latest[f.label] = max(latest.get(f.label, -1), f.attempt)
    for name in sorted(files, key=lambda n: (files[n].label, files[n].attempt)):
        f = files[name]
        if f.done:
            continue
        # an attempt is over once a newer one of the same rank exists (elastic restart) and its
        # drainer has appended the last of it
        over = final or (f.attempt < latest[f.label] and f.written())
        out.append(f.finish() if over else f.read())
    return b"".join(out)


def widen_stdout():
    """Best effort: a larger pipe behind stdout (Linux; not a pipe, or over the user's limit: kept)."""
    setpipe = getattr(fcntl, "F_SETPIPE_SZ", 1031) if fcntl is not None else None
    if setpipe is None:
        return
    try:
        fcntl.fcntl(1, setpipe, PIPE_SIZE)
    except OSError:
        pass


def mux(directory, argv):
    try:
        os.makedirs(directory, 0o700)
    except OSError:
        if not os.path.isdir(directory):
            raise
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # torchrun, in our process group, got the same signal: keep delivering until it has ended
        signal.signal(sig, lambda *_: stopping.append(1))
    try:
        pipe = subprocess.PIPE
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe)
    except OSError as exc:
        write_all(2, ("cannot start %s: %s\n" % (argv[0], exc)).encode())
        return 127
    widen_stdout()
    stop_sampling = threading.Event()
    nonce = os.environ.get("CB_SAMPLE_NONCE", "")
    if _NONCE.match(nonce):
        threading.Thread(target=sampler, args=(nonce, stop_sampling), daemon=True).start()
        PROGRESS[0] = nonce
    streams = Streams(proc)
    files = {}
    idle = IDLE
    scanned = 0.0
    while True:
        got = streams.read(0) if streams.open else b""
        now = time.monotonic()
        if now - scanned >= SCAN or idle > IDLE:  # quiet a while: look at once
            scan(directory, files)
            scanned = now
        got += drain(files, final=False)
        if got:
            write_all(1, got)
            idle = IDLE
            if len(got) < BATCH:
                if streams.open:
                    more = streams.read(GATHER)  # torchrun's own lines end the wait early
                    if more:
                        write_all(1, more)
                else:
                    time.sleep(GATHER)
            continue
        if proc.poll() is not None and not streams.open:
            break
        if streams.open:
            more = streams.read(idle)
            if more:
                write_all(1, more)
                idle = IDLE
                continue
        else:
            time.sleep(idle)
        idle = min(idle * 2, IDLE_MAX)
    # torchrun has ended, so have its workers; their drainers append the last bytes they read
    stop_sampling.set()
    deadline = time.monotonic() + DRAIN_WAIT
    while True:
        scan(directory, files)
        got = drain(files, final=False)
        if got:
            write_all(1, got)
        elif all(f.done or f.written() for f in files.values()) or time.monotonic() > deadline:
            break
        else:
            time.sleep(IDLE)
    write_all(1, drain(files, final=True))
    code = proc.returncode
    return 128 - code if code < 0 else code


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("worker", "mux"):
        sys.stderr.write("usage: rank_capture.py worker|mux DIR COMMAND...\n")
        return 2
    mode, directory, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    if mode == "worker":
        worker(directory, argv)
        return 127
    return mux(directory, argv)


if __name__ == "__main__":
    sys.exit(main())
