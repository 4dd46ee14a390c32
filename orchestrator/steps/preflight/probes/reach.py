# Runs on a node, under the node's Python 3 (any 3.6+, standard library only): the network half of the
# preflight's reachability check (orchestrator/steps/preflight/reachability.py drives it).
#
#   python3 -I -c SCRIPT cbt-reach listen HOLD TOKEN MESH_COUNT [PORT PORT_COUNT]
#       Listens on every address of the node, port 0 (an ephemeral port, as gloo and NCCL do) and,
#       given PORT (the rendezvous port), on PORT too unless something on the node listens there
#       already. A connection counts when it delivers TOKEN and closes; *_COUNT say how many are
#       expected. Ends once every expected connection came, after HOLD seconds, or on SIGTERM.
#   python3 -I -c SCRIPT cbt-reach connect SRC TIMEOUT TOKEN TARGET...
#       Connects from SRC to every TARGET ("ADDR:PORT", "[V6]:PORT") at once, within TIMEOUT
#       seconds, and hands TOKEN to each listener it reached. Prints its wall clock first.
#
# Where the node has FIFOs (not native Windows), a listener also has an inbox: a FIFO in a private
# directory of its own, named by its "inbox PATH" line. One line "connect SRC TIMEOUT TOKEN TARGET..."
# written there makes the listener connect as a connector would, in its own process, and report the
# same way, ending with "connected" instead of "done complete": the controller then writes one line
# into that file instead of starting a second interpreter (two processes fewer per node and check).
# Such a listener is complete once that line came too. The directory is removed once the line came,
# or when the listener ends.
#
# Listening on every address (not the one the controller picked) lets the listener start before the
# node's facts are read: it runs at the end of the facts' round trip. Peers still dial the address
# training will use; a firewall sees the same packets either way.
#
# The "cbt-reach" tag only marks the process for `pgrep -af cbt-reach`. Output is one event a line,
# flushed at once (the controller reacts to "ready" while the listener keeps running); a connector
# prints its results in one write, at the end (thousands of lines on a large cluster):
#   listening on ADDR PORT mesh|rendezvous   busy PORT [HOLDER...]   range LOW HIGH   inbox PATH
#   ready PID   done complete|deadline|stopped   error TEXT
#   clock UNIX_TIME   result INDEX ok|refused|timeout|unreachable|error MS TARGET DETAIL   connected
#
# Imports are the probe's cost: it starts twice on every node of every check. The C modules under
# socket, signal and selectors (_socket, _signal, select) spare the Python layers' enum building:
# about 15 ms of CPU per process, a second per check at 64 nodes on two cores.
import _signal
import _socket as socket
import errno
import os
import select
import stat
import sys
import time

# connect() outcomes as the controller names them; anything else is reported as "error ERRNAME"
_OUTCOMES = {
    0: "ok",
    errno.ECONNREFUSED: "refused",
    errno.ECONNRESET: "refused",
    errno.ETIMEDOUT: "timeout",
    errno.EHOSTUNREACH: "unreachable",
    errno.ENETUNREACH: "unreachable",
    errno.EHOSTDOWN: "unreachable",
}
_IN_PROGRESS = (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN, errno.EALREADY)


READ, WRITE = 1, 2


class Poller:
    """What selectors.DefaultSelector gives, by hand: poll() where there is one, else select()
    (Windows, where a failed connect shows among the exceptional sockets)."""

    def __init__(self) -> None:
        self.poll = select.poll() if hasattr(select, "poll") else None
        self.entries = {}  # fd -> (events, data)

    def register(self, sock: socket.socket, events: int, data: object) -> None:
        fd = sock.fileno()
        self.entries[fd] = (events, data)
        if self.poll is not None:
            self.poll.register(fd, select.POLLIN if events == READ else select.POLLOUT)

    def unregister(self, sock: socket.socket) -> None:
        fd = sock.fileno()
        del self.entries[fd]
        if self.poll is not None:
            self.poll.unregister(fd)

    def select(self, timeout: float) -> "list[object]":
        """The data of every socket ready within ``timeout`` seconds."""
        timeout = max(timeout, 0.0)
        if self.poll is not None:
            ready = [fd for fd, _ in self.poll.poll(int(timeout * 1000) + 1)]
        else:
            reads = [fd for fd, (ev, _) in self.entries.items() if ev == READ]
            writes = [fd for fd, (ev, _) in self.entries.items() if ev == WRITE]
            r, w, x = select.select(reads, writes, writes, timeout)
            ready = list(set(r) | set(w) | set(x))
        return [self.entries[fd][1] for fd in ready if fd in self.entries]


class Stopped(Exception):
    """SIGTERM: the controller has seen every connection that is going to come."""


def emit(*words: object) -> None:
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def family_of(address: str) -> int:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def errname(code: int) -> str:
    return errno.errorcode.get(code, str(code))


def on_sigterm(signum: int, frame: object) -> None:
    raise Stopped()


def wildcard_socket(port: int) -> socket.socket:
    """A listening socket on every address of the node: IPv6 and IPv4 at once where the node has
    IPv6 (as TCPStore binds), else IPv4 only. EADDRINUSE when anything listens on ``port`` already,
    whichever address it holds (a wildcard bind conflicts with all of them)."""
    attempts = []
    if socket.has_ipv6:
        attempts.append((socket.AF_INET6, "::"))
    attempts.append((socket.AF_INET, "0.0.0.0"))
    for family, wildcard in attempts:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 in this kernel
        try:
            if os.name != "nt":
                # a TIME_WAIT left by an earlier check or run must not block the bind (Windows'
                # SO_REUSEADDR would let us share a port in use instead: not there)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((wildcard, port))
            sock.listen(512)
            sock.setblocking(False)
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE or family != socket.AF_INET6:
                raise
            # IPv6 disabled on this node: IPv4 only
    raise OSError(errno.EAFNOSUPPORT, "no IPv4 or IPv6 socket")


class Listener:
    def __init__(self, role: str, port: int, expected: int) -> None:
        self.role = role
        self.sock = wildcard_socket(port)
        self.address = self.sock.getsockname()[0]
        self.port = self.sock.getsockname()[1]
        self.waiting = expected  # connections still to come with the token


#: the variable every process of a bootstrap run carries (orchestrator/runs/layout.py RUN_MARKER_ENV)
RUN_MARKER = b"CLUSTER_BOOTSTRAP_RUN="
#: a run id as `--run-id` takes it (orchestrator/runs/ids.py): anything else in a process's
#: environment is not reported (it would go into a command the user is told to type)
RUN_ID_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def run_of(pid: str) -> str:
    """The run of bootstrap the process belongs to (its environment carries the run's marker,
    ``RUN-ID/NODE/TOKEN``), when that is a well-formed run id and the process is ours (another
    user's may carry any run id, to have us stop a run of ours); else ""."""
    try:
        if os.stat("/proc/" + pid).st_uid != os.getuid():
            return ""
        with open("/proc/" + pid + "/environ", "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        return ""
    for entry in env:
        if entry.startswith(RUN_MARKER):
            run = entry[len(RUN_MARKER) :].split(b"/")[0]
            fine = 0 < len(run) <= 128 and run[:1] not in b"._-" and set(run) <= RUN_ID_CHARS
            return run.decode("ascii") if fine and run != b"latest" else ""
    return ""


def port_holder(port: int) -> "tuple[str, str]":
    """Who listens on ``port``: the processes holding a listening TCP socket on it, found through
    /proc (the kernel's socket table, then each process's descriptors; a name is never read out of
    another program's text, where a process could name itself ``x",pid=1``), as ``NAME (pid N, run
    R)``; and the runs of bootstrap among them (comma-separated run ids, "-" for none). "" when /proc
    cannot tell: another user's process, seen without root."""
    sockets = set()  # type: set[str]
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                for line in fh:
                    cells = line.split()
                    if len(cells) > 9 and cells[3] == "0A" and cells[1].endswith(":%04X" % port):
                        sockets.add("socket:[" + cells[9] + "]")
        except OSError:
            continue
    holders, runs = [], []  # type: list[str], list[str]
    for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int) if sockets else []:
        try:
            fds = os.listdir("/proc/" + pid + "/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                held = os.readlink("/proc/" + pid + "/fd/" + fd) in sockets
            except OSError:
                continue
            if held:
                try:
                    with open("/proc/" + pid + "/comm", "rb") as fh:
                        name = fh.read().rstrip(b"\n").decode("utf-8", "replace")
                except OSError:
                    name = "?"
                # the process chose its name: it goes into a line of ours, so none of its characters
                # may end that line or start another (a name "x\nerror ..." faked a probe error)
                name = "".join(c if c.isprintable() else "?" for c in name)
                run = run_of(pid)
                holders.append(name + " (pid " + pid + (", run " + run if run else "") + ")")
                if run and run not in runs:
                    runs.append(run)
                break
    return ", ".join(holders), ",".join(runs) or "-"


def ephemeral_range() -> "tuple[int, int] | None":
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low, high = fh.read().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return None


class Inbox:
    """A FIFO only this user can reach (a directory of its own, 0700, in the temporary directory):
    where the controller writes the connector's arguments. Opened for writing too, by us, so that it
    never reads as closed before the controller wrote."""

    def __init__(self) -> None:
        base = os.environ.get("TMPDIR") or "/tmp"
        if os.urandom(1)[0] < 16:  # one listener in 16: listing a busy /tmp costs a few ms every check
            sweep_inboxes(base)
        # "cbt-reach-" PID (8 hex digits) RANDOM (16): whose it is, once it was left behind
        self.dir = os.path.join(base, "cbt-reach-%08x%s" % (os.getpid(), os.urandom(8).hex()))
        self.path = os.path.join(self.dir, "inbox")
        self.fds = []  # type: list[int]
        self.got = bytearray()
        os.mkdir(self.dir, 0o700)  # fails when the name exists: nobody else's directory is used
        try:
            os.mkfifo(self.path, 0o600)
            self.fds.append(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK))
            self.fds.append(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))  # never EOF
        except OSError:
            self.close()
            raise
        self.fd = self.fds[0]

    def fileno(self) -> int:
        return self.fd

    def read(self) -> "list[str] | None":
        """The words of the line once it is whole; None before that."""
        try:
            self.got.extend(os.read(self.fd, 65536))
        except BlockingIOError:
            return None
        if b"\n" not in self.got:
            return None
        return self.got.split(b"\n", 1)[0].decode("ascii", "replace").split()

    def remove(self) -> None:
        for remove, path in ((os.unlink, self.path), (os.rmdir, self.dir)):
            try:
                remove(path)
            except OSError:
                pass

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.remove()


#: seconds after which an inbox directory whose listener's pid is gone is removed
INBOX_STALE = 3600


def sweep_inboxes(base: str) -> None:
    """Remove the inbox directories this user's listeners left when they were killed outright
    (SIGKILL, OOM: no ``finally`` ran): those in ``base`` named with a process id that no longer
    exists, an hour old at least, that are this user's directories (not links), holding at most
    the FIFO."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if not name.startswith("cbt-reach-") or len(name) != 34:
            continue
        try:
            os.kill(int(name[10:18], 16), 0)
            continue  # alive (or reused): not ours to judge
        except ProcessLookupError:
            pass
        except (OSError, ValueError):  # another user's process, or not our name
            continue
        directory = os.path.join(base, name)
        try:
            info = os.lstat(directory)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            # an hour old at least: no listener lives that long, so a TMPDIR shared with other
            # machines or containers (whose pids mean nothing here) never loses a live inbox
            if time.time() - info.st_mtime < INBOX_STALE:
                continue
            fifo = os.path.join(directory, "inbox")
            if os.path.lexists(fifo) and stat.S_ISFIFO(os.lstat(fifo).st_mode):
                os.unlink(fifo)
            os.rmdir(directory)  # fails when anything else is in it: then it stays
        except OSError:
            pass


def open_inbox() -> "Inbox | None":
    if not hasattr(os, "mkfifo"):
        return None
    try:
        return Inbox()
    except OSError:  # no writable temporary directory: the controller starts a connector instead
        return None


def listen(args: "list[str]") -> int:
    inbox = open_inbox()
    try:
        return _listen(args, inbox)
    finally:
        if inbox is not None:
            inbox.close()


def _listen(args: "list[str]", inbox: "Inbox | None") -> int:
    hold, token, mesh_count = float(args[0]), args[1].encode("ascii"), int(args[2])
    deadline = time.monotonic() + hold
    listeners = []
    # the rendezvous port first: the mesh listener's port 0 could otherwise be that very port (one
    # in the ephemeral range), which would then read as busy
    if len(args) >= 5:
        port, port_count = int(args[3]), int(args[4])
        try:
            listeners.append(Listener("rendezvous", port, port_count))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:  # EACCES below 1024 without root, ...
                emit("error", "cannot listen on port " + str(port) + ": " + (exc.strerror or str(exc)))
                return 2
            holder, runs = port_holder(port)
            emit("busy", port, runs, holder)
    try:
        listeners.insert(0, Listener("mesh", 0, mesh_count))
    except OSError as exc:
        emit("error", "cannot listen: " + (exc.strerror or str(exc)))
        return 2
    for lst in listeners:
        emit("listening", "on", lst.address, lst.port, lst.role)
    span = ephemeral_range()
    if span is not None:
        emit("range", span[0], span[1])
    if inbox is not None:
        emit("inbox", inbox.path)
    emit("ready", os.getpid())

    sel = Poller()
    for lst in listeners:
        sel.register(lst.sock, READ, ("listener", lst, None, None))
    if inbox is not None:
        sel.register(inbox, READ, ("inbox", None, None, None))
    waiting_inbox = inbox is not None  # its connections are part of this listener's work
    conns = None  # type: Connections | None
    while True:
        if conns is not None and conns.over:
            conns.write()
            conns = None
        if not waiting_inbox and conns is None and not any(lst.waiting > 0 for lst in listeners):
            emit("done", "complete")
            return 0
        left = deadline - time.monotonic()
        if left <= 0:
            if conns is not None:
                conns.write()
            emit("done", "deadline")
            return 0
        if conns is not None:
            left = min(left, conns.deadline - time.monotonic())
        for data in sel.select(left):
            kind, lst, got, conn = data
            if kind == "connect":
                assert conns is not None
                conns.ready(data)
                continue
            if kind == "inbox":
                words = inbox.read()
                if words is None:
                    continue
                sel.unregister(inbox)
                inbox.close()
                waiting_inbox = False
                if len(words) >= 4 and words[0] == "connect":
                    # connecting while accepting: one poller for both
                    conns = Connections(words[1:], sel, "connected")
                else:
                    emit("error", "the inbox got no connect line")
                continue
            if kind == "listener":
                try:
                    fd, _peer = lst.sock._accept()
                except OSError:  # reset before we took it, or a spurious wakeup
                    continue
                conn = socket.socket(lst.sock.family, socket.SOCK_STREAM, 0, fd)
                conn.setblocking(False)
                sel.register(conn, READ, ("peer", lst, bytearray(), conn))
                continue
            # A peer: it sends the token, then closes. Waiting for its close keeps the TIME_WAIT
            # on its side, not on the rendezvous port that torchrun binds next.
            try:
                data = conn.recv(64)
            except OSError:
                data = b""
            got.extend(data)
            if data and len(got) <= len(token):
                continue
            sel.unregister(conn)
            conn.close()
            if bytes(got) == token:
                lst.waiting -= 1
            # anything else (a stray client, a torchrun retrying) does not count


def split_target(target: str) -> "tuple[str, int]":
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)


class Connections:
    """Connections from SRC to every TARGET at once, each in ``sel`` (a poller the process may share
    with its listening sockets: a listener keeps accepting while it connects); the results are
    written in one go by :meth:`write`, ended by ``last``."""

    def __init__(self, args: "list[str]", sel: Poller, last: str) -> None:
        emit("clock", "%.6f" % time.time())  # first: its arrival time on the controller dates it
        self.source, timeout, self.token = args[0], float(args[1]), args[2].encode("ascii")
        self.targets = args[3:]
        self.sel, self.last = sel, last
        self.deadline = time.monotonic() + timeout
        self.lines = []  # type: list[str]
        self.pending = {}  # fd -> socket still connecting
        for index, target in enumerate(self.targets):
            address, port = split_target(target)
            sock = socket.socket(family_of(address), socket.SOCK_STREAM)
            sock.setblocking(False)
            begun = time.monotonic()
            try:
                if self.source != "-":
                    # from the node's cluster address, as gloo does: source-scoped rules see the truth
                    sock.bind((self.source, 0))
                code = sock.connect_ex((address, port))
            except OSError as exc:
                code = exc.errno or errno.EINVAL
            if code in _IN_PROGRESS:
                self.pending[sock.fileno()] = sock
                sel.register(sock, WRITE, ("connect", index, begun, sock))
                continue
            self.finish(sock, code, index, begun)

    def report(self, index: int, outcome: str, detail: str, begun: float) -> None:
        ms = (time.monotonic() - begun) * 1000
        self.lines.append(
            "result %d %s %.1f %s %s" % (index, outcome, ms, self.targets[index], detail or "-")
        )

    def finish(self, sock: socket.socket, code: int, index: int, begun: float) -> None:
        outcome = _OUTCOMES.get(code, "error")
        self.report(index, outcome, "" if outcome == "ok" else errname(code), begun)
        if outcome == "ok":
            try:
                sock.send(self.token)  # a few bytes into an empty send buffer: never blocks
            except OSError:
                pass
        sock.close()  # we close first: the TIME_WAIT stays on this side

    def ready(self, data: "tuple[str, int, float, socket.socket]") -> None:
        """One of our sockets is writable: its connection is made or refused."""
        _kind, index, begun, sock = data
        self.sel.unregister(sock)
        del self.pending[sock.fileno()]
        self.finish(sock, sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR), index, begun)

    @property
    def over(self) -> bool:
        return not self.pending or time.monotonic() >= self.deadline

    def write(self) -> None:
        """Every result (what is still connecting timed out), then ``last``, in one write."""
        for fd, sock in list(self.pending.items()):
            _events, (_kind, index, begun, _sock) = self.sel.entries[fd]
            self.sel.unregister(sock)
            sock.close()
            self.report(index, "timeout", "", begun)
        self.pending = {}
        self.lines.append(self.last)
        sys.stdout.write("\n".join(self.lines) + "\n")
        sys.stdout.flush()


def connect(args: "list[str]") -> int:
    sel = Poller()
    conns = Connections(args, sel, "done complete")
    while not conns.over:
        for data in sel.select(conns.deadline - time.monotonic()):
            conns.ready(data)
    conns.write()
    return 0


def main(argv: "list[str]") -> int:
    if len(argv) >= 2 and argv[0] == "cbt-reach":
        argv = argv[1:]
    if argv and argv[0] == "listen" and len(argv) in (4, 6):
        _signal.signal(_signal.SIGTERM, on_sigterm)
        try:
            return listen(argv[1:])
        except Stopped:
            emit("done", "stopped")
            return 0
    if argv and argv[0] == "connect" and len(argv) >= 4:
        return connect(argv[1:])
    sys.stderr.write("usage: cbt-reach listen HOLD TOKEN MESH_COUNT [PORT PORT_COUNT]\n")
    sys.stderr.write("       cbt-reach connect SRC TIMEOUT TOKEN ADDR:PORT...\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
