# Runs on a node, under the node's Python 3 (any 3.6+, standard library only): the network half of the
# preflight's reachability check (orchestrator/steps/preflight/reachability.py drives it).
#
#   python3 -I -c SCRIPT cbt-reach listen ADDR HOLD MESH_FROM [PORT PORT_FROM]
#       Listens on ADDR port 0 (an ephemeral port, as gloo and NCCL do) and, given PORT (the
#       rendezvous port), on ADDR:PORT once nothing else on the node listens there. *_FROM list the
#       source addresses expected to connect (comma separated, repeated for several, "-" for none).
#       Ends once every expected connection came and was closed by its peer, after HOLD seconds, or
#       on SIGTERM.
#   python3 -I -c SCRIPT cbt-reach connect SRC TIMEOUT TARGET...
#       Connects from SRC to every TARGET ("ADDR:PORT", "[V6]:PORT") at once, within TIMEOUT seconds.
#
# The "cbt-reach" tag only marks the process for `pgrep -af cbt-reach`. Output is one event a line,
# flushed at once (the controller reacts to "ready" while the listener keeps running):
#   listening on ADDR PORT mesh|rendezvous   busy PORT [HOLDER...]   range LOW HIGH   ready PID
#   accepted mesh|rendezvous SRC expected|unexpected   done complete|deadline|stopped
#   result INDEX ok|refused|timeout|unreachable|error MS TARGET DETAIL   error TEXT
import errno
import os
import re
import selectors
import signal
import socket
import subprocess
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
_SS_CANDIDATES = ("ss", "/usr/sbin/ss", "/sbin/ss", "/usr/bin/ss", "/bin/ss")


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


class Listener:
    def __init__(self, role: str, address: str, port: int, expected: "list[str]") -> None:
        self.role = role
        self.sock = socket.socket(family_of(address), socket.SOCK_STREAM)
        # a TIME_WAIT left by an earlier check (or a finished training run) must not block the bind
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, port))
        self.sock.listen(max(128, len(expected) + 16))
        self.sock.setblocking(False)
        self.address = address
        self.port = self.sock.getsockname()[1]
        self.waiting = list(expected)  # source addresses still to come (a multiset)


def port_holder(port: int) -> str:
    """Who listens on ``port``, as ``ss -ltnp`` tells it ("" when it cannot: no ss, not root)."""
    for ss in _SS_CANDIDATES:
        try:
            proc = subprocess.run(
                [ss, "-ltnp"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                universal_newlines=True,
                timeout=5,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        holders = []
        for line in proc.stdout.splitlines():
            cells = line.split()
            if len(cells) < 4 or not cells[3].endswith(":" + str(port)):
                continue
            for name, pid in re.findall(r'\("([^"]*)",pid=(\d+)', line):
                text = name + " (pid " + pid + ")"
                if text not in holders:
                    holders.append(text)
        return ", ".join(holders)
    return ""


def port_in_use(port: int) -> bool:
    """Would a wildcard bind of ``port`` fail? That is what TCPStore does, so a listener on any
    address of the node (loopback included) makes the rendezvous port unusable."""
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
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                # dual stack: conflicts with IPv4 listeners too
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            # bind alone conflicts with a listening socket, even with SO_REUSEADDR
            sock.bind((wildcard, port))
            return False
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            if family == socket.AF_INET6:
                continue  # IPv6 disabled: ask IPv4
            raise
        finally:
            sock.close()
    return False


def ephemeral_range() -> "tuple[int, int] | None":
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low, high = fh.read().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return None


def canonical(address: str) -> str:
    """The form accept() reports (IPv6 text has many spellings of one address)."""
    family = family_of(address)
    try:
        return socket.inet_ntop(family, socket.inet_pton(family, address))
    except (OSError, ValueError):
        return address


def sources(text: str) -> "list[str]":
    return [] if text == "-" else [canonical(a) for a in text.split(",") if a]


def listen(args: "list[str]") -> int:
    address, hold, mesh_from = args[0], float(args[1]), sources(args[2])
    deadline = time.monotonic() + hold
    listeners = []
    try:
        listeners.append(Listener("mesh", address, 0, mesh_from))
    except OSError as exc:
        emit("error", "cannot listen on " + address + ": " + (exc.strerror or str(exc)))
        return 2
    if len(args) >= 5:
        port, port_from = int(args[3]), sources(args[4])
        busy = False
        try:
            busy = port_in_use(port)
            if not busy:
                listeners.append(Listener("rendezvous", address, port, port_from))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:  # EACCES below 1024 without root, ...
                emit("error", "cannot listen on port " + str(port) + ": " + (exc.strerror or str(exc)))
                return 2
            busy = True  # taken between the check and our bind
        if busy:
            emit("busy", port, port_holder(port))
    for lst in listeners:
        emit("listening", "on", lst.address, lst.port, lst.role)
    span = ephemeral_range()
    if span is not None:
        emit("range", span[0], span[1])
    emit("ready", os.getpid())

    sel = selectors.DefaultSelector()
    for lst in listeners:
        sel.register(lst.sock, selectors.EVENT_READ, ("listener", lst))
    open_peers = 0  # accepted connections the client has not closed yet
    while True:
        if not open_peers and not any(lst.waiting for lst in listeners):
            emit("done", "complete")
            return 0
        left = deadline - time.monotonic()
        if left <= 0:
            emit("done", "deadline")
            return 0
        for key, _ in sel.select(left):
            kind, obj = key.data
            if kind == "listener":
                try:
                    conn, peer = obj.sock.accept()
                except OSError:  # reset before we took it, or a spurious wakeup
                    continue
                expected = peer[0] in obj.waiting
                emit("accepted", obj.role, peer[0], "expected" if expected else "unexpected")
                if not expected:
                    conn.close()  # a stray client (a torchrun retrying?) must not hold us
                    continue
                obj.waiting.remove(peer[0])
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ, ("peer", conn))
                open_peers += 1
            else:
                # Wait for the client's close, so the TIME_WAIT stays on its side and not on the
                # rendezvous port that torchrun binds next.
                try:
                    data = obj.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(obj)
                    obj.close()
                    open_peers -= 1


def split_target(target: str) -> "tuple[str, int]":
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)


def connect(args: "list[str]") -> int:
    source, timeout, targets = args[0], float(args[1]), args[2:]
    sel = selectors.DefaultSelector()
    started = time.monotonic()
    deadline = started + timeout

    def report(index: int, outcome: str, detail: str, begun: float) -> None:
        ms = (time.monotonic() - begun) * 1000
        emit("result", index, outcome, f"{ms:.1f}", targets[index], detail or "-")

    for index, target in enumerate(targets):
        address, port = split_target(target)
        sock = socket.socket(family_of(address), socket.SOCK_STREAM)
        sock.setblocking(False)
        begun = time.monotonic()
        try:
            if source != "-":
                # from the node's cluster address, as gloo does: source-scoped rules see the truth
                sock.bind((source, 0))
            code = sock.connect_ex((address, port))
        except OSError as exc:
            code = exc.errno or errno.EINVAL
        if code in _IN_PROGRESS:
            sel.register(sock, selectors.EVENT_WRITE, (index, begun, sock))
            continue
        sock.close()
        outcome = _OUTCOMES.get(code, "error")
        report(index, outcome, "" if outcome == "ok" else errname(code), begun)
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for key, _ in sel.select(left):
            index, begun, sock = key.data
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            sel.unregister(sock)
            sock.close()  # we close first: the TIME_WAIT stays on this side
            outcome = _OUTCOMES.get(code, "error")
            report(index, outcome, "" if outcome == "ok" else errname(code), begun)
    for key in list(sel.get_map().values()):
        index, begun, sock = key.data
        sock.close()
        report(index, "timeout", "", begun)
    emit("done", "complete")
    return 0


def main(argv: "list[str]") -> int:
    if len(argv) >= 2 and argv[0] == "cbt-reach":
        argv = argv[1:]
    if argv and argv[0] == "listen" and len(argv) in (4, 6):
        signal.signal(signal.SIGTERM, on_sigterm)
        try:
            return listen(argv[1:])
        except Stopped:
            emit("done", "stopped")
            return 0
    if argv and argv[0] == "connect" and len(argv) >= 3:
        return connect(argv[1:])
    sys.stderr.write("usage: cbt-reach listen ADDR HOLD MESH_FROM [PORT PORT_FROM]\n")
    sys.stderr.write("       cbt-reach connect SRC TIMEOUT ADDR:PORT...\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
