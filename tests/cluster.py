"""A multi-host test cluster made of Linux network namespaces, one sshd per "host".

Layout (nothing is added to the root network namespace of the machine)::

    <prefix>-hub   a bridge ``br0``; one veth end per host plus one for the controller
    <prefix>-ctl   the controller: ``eth0`` = 198.18.N.1/24, where the CLI under test runs
    <prefix>-hK    host K: ``eth0`` = 198.18.N.(10+K)/24, sshd on port 22 in its own UTS
                   namespace (``hostname`` prints ``nodeK``), /etc/hosts and /etc/hostname
                   from /etc/netns/<prefix>-hK/

``prefix`` is ``cbt<pid % 10000>`` (``cbt<pid % 10000>x<k>`` for further clusters of the same
process) and the /24 lies in the benchmarking range 198.18.0.0/15, so concurrent runs do not
clash.  No namespace has a default route: traffic can only reach addresses of the cluster.

Everything created (namespaces, /etc/netns/<ns>/, processes running inside the namespaces,
users, sudoers files, temporary directories) is removed by :meth:`NamespaceCluster.stop`, which is
idempotent, never raises and also runs from ``atexit`` and on SIGTERM/SIGHUP.

The module only uses the standard library.  Import it as ``tests.cluster`` or, e.g. from
benchmarks, by path::

    spec = importlib.util.spec_from_file_location("cbt_cluster", ROOT / "tests" / "cluster.py")
    cluster = importlib.util.module_from_spec(spec)
    sys.modules["cbt_cluster"] = cluster
    spec.loader.exec_module(cluster)

Run it directly (as root) to time a start: ``python tests/cluster.py --hosts 16 [--hold]``.
"""

import atexit
import base64
import contextlib
import hashlib
import os
import pwd
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")
RUN_NETNS = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")
SUDOERS_DIR = Path("/etc/sudoers.d")
# sshd's StrictModes rejects an AuthorizedKeysFile below a group/world-writable directory such
# as /tmp (mode 1777), and non-root users must be able to traverse the path: /run is root 0755.
SSHD_STATE_PARENT = Path("/run")
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server")
BLACKHOLE_MAC = "02:00:5e:00:53:01"  # static neighbour for unused_addr: frames go nowhere
MAX_HOSTS = 200
SSHD_START_TIMEOUT = 20.0
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")


class ClusterError(RuntimeError):
    """The cluster could not be built or changed."""


@dataclass
class TestHost:
    """One simulated machine: a network namespace with its own sshd."""

    __test__ = False  # not a pytest test class, even when imported into a test module

    name: str  # "node1"...
    ns: str  # network namespace name
    addr: str  # IPv4 address of eth0
    hostname: str  # what `hostname` prints in an SSH session (== name)
    host_key_pub: Path  # sshd's ed25519 host public key
    sshd_config: Path | None = None
    sshd_log: Path | None = None  # everything sshd wrote to stderr (LogLevel VERBOSE)

    def host_key_line(self) -> str:
        """The public host key as ``ssh-ed25519 AAAA...`` (no comment)."""
        return " ".join(self.host_key_pub.read_text().split()[:2])

    def fingerprint(self) -> str:
        """``SHA256:...`` exactly as ``ssh-keygen -lf host_key_pub`` prints it."""
        blob = base64.b64decode(self.host_key_pub.read_text().split()[1])
        digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
        return f"SHA256:{digest}"


def cluster_support_problems() -> list[str]:
    """Reasons why a cluster cannot be built on this machine (empty list: it can)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not running as root (network namespaces and sshd need root)")
    for tool in ("ip", "unshare", "ssh-keygen", "useradd", "userdel", "chpasswd", "visudo"):
        if shutil.which(tool) is None:
            problems.append(f"`{tool}` not found on PATH")
    if not os.access(SSHD, os.X_OK):
        problems.append(f"{SSHD} not found (install openssh-server)")
    if problems:
        return problems
    probe = f"cbtprobe{os.getpid()}"
    added = _run(["ip", "netns", "add", probe])
    if added.returncode != 0:
        return [f"`ip netns add` does not work: {added.stderr.strip()}"]
    try:
        inside = _run(["ip", "netns", "exec", probe, "true"])
        if inside.returncode != 0:
            problems.append(f"`ip netns exec` does not work: {inside.stderr.strip()}")
    finally:
        _run(["ip", "netns", "del", probe])
    return problems


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    opts = {"capture_output": True, "text": True, "check": False}
    if "stdout" in kwargs or "stderr" in kwargs:
        opts.pop("capture_output")
    opts.update(kwargs)
    return subprocess.run(argv, **opts)


def _check(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    res = _run(argv, **kwargs)
    if res.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def _run_parallel(commands: list[tuple[list[str], str | None]]) -> list[tuple[int, str]]:
    """Run (argv, stdin text) commands concurrently; return (returncode, stderr) for each."""
    procs = []
    for argv, stdin in commands:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append((proc, stdin))
    results = []
    for proc, stdin in procs:
        _, err = proc.communicate(stdin)
        results.append((proc.returncode, err))
    return results


def _check_parallel(commands: list[tuple[list[str], str | None]]) -> None:
    for (argv, _), (rc, err) in zip(commands, _run_parallel(commands), strict=True):
        if rc != 0:
            raise ClusterError(f"{' '.join(argv)} failed ({rc}): {err.strip()}")


def _keygen_argv(path: Path, comment: str) -> list[str]:
    return ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]


def _command(pid: int) -> str:
    """A process's command line, shortened (empty once it is gone)."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    return " ".join(w.decode("utf-8", "replace") for w in words if w)[:120]


def _wait_pids_gone(pids: Iterable[int], timeout: float) -> set[int]:
    """Wait until the processes exited (or became zombies); return those still alive."""
    fds = {}
    alive = set()
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
        except (AttributeError, OSError):  # no pidfd support: fall back to polling below
            alive.add(pid)
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        pending = dict(fds)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(left * 1000):
                poller.unregister(fd)
                pending.pop(fd, None)
        alive.update(pending.values())
    finally:
        for fd in fds:
            os.close(fd)
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:  # only without pidfd support
        alive = {p for p in alive if _pid_exists(p)}
        if alive:
            time.sleep(0.02)
    return {p for p in alive if _pid_exists(p)}


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # zombies are gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class _Sshd:
    """A running sshd listener; a thread copies its stderr into the log file."""

    def __init__(self, host: TestHost, private: dict[str, Path] | None = None) -> None:
        # private: directory on this machine -> the host's own copy, bind-mounted over it in a mount
        # namespace of the host's sshd (and so of every session): per-host /etc/chrony, /run/chrony...
        mounts = "".join(
            f"mkdir -p {shlex.quote(t)} && mount --bind {shlex.quote(str(s))} {shlex.quote(t)} && "
            for t, s in (private or {}).items()
        )
        inner = f"{mounts}hostname {host.hostname} && exec {SSHD} -D -e -f {host.sshd_config}"
        unshare = (
            ["unshare", "--uts", "--mount", "--propagation", "private"] if private else ["unshare", "--uts"]
        )
        argv = ["ip", "netns", "exec", host.ns, *unshare, "sh", "-c", inner]
        self.listening = threading.Event()
        self.done = threading.Event()  # stderr reached EOF or listening
        self.tail: deque[str] = deque(maxlen=40)
        # ip netns exec, unshare and `sh -c '... && exec'` all exec: this pid is sshd itself.
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._thread = threading.Thread(
            target=self._drain, args=(host.sshd_log,), name=f"sshd-log-{host.ns}", daemon=True
        )
        self._thread.start()

    def _drain(self, log_path: Path) -> None:
        assert self.proc.stderr is not None
        with open(log_path, "ab", buffering=0) as log:
            for raw in self.proc.stderr:
                log.write(raw)
                line = raw.decode(errors="replace").rstrip()
                self.tail.append(line)
                if line.startswith("Server listening on"):
                    self.listening.set()
                    self.done.set()
        self.done.set()

    def wait_listening(self, timeout: float) -> bool:
        self.done.wait(timeout)
        return self.listening.is_set()

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # session children inherit stderr: the pipe stays open while they live
        self._thread.join(0.5)


_ACTIVE: dict[int, "NamespaceCluster"] = {}
_ACTIVE_LOCK = threading.RLock()
_SIGNALS_INSTALLED = False


def _cleanup_all() -> None:
    with _ACTIVE_LOCK:
        clusters = list(_ACTIVE.values())
    for cluster in clusters:
        if cluster._owner_pid == os.getpid():  # never from a forked child
            cluster.stop()


def _on_fatal_signal(signum, frame) -> None:
    _cleanup_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_signal_handlers() -> None:
    global _SIGNALS_INSTALLED
    if _SIGNALS_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    _SIGNALS_INSTALLED = True
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _on_fatal_signal)


atexit.register(_cleanup_all)


class NamespaceCluster:
    """``n_hosts`` SSH-reachable hosts plus a controller namespace; see the module docstring.

    ``workdir`` (if given) receives the client key and sshd logs and is left in place (the
    caller owns it); by default a temporary directory is used and removed by :meth:`stop`.
    sshd configs, host keys and authorized_keys always live in a root-owned directory below
    /run (sshd's StrictModes), removed by :meth:`stop`.
    """

    def __init__(
        self,
        n_hosts: int,
        workdir: Path | None = None,
        password_auth: bool = False,
        private_dirs: Iterable[str] = (),
        sftp: bool = True,
    ) -> None:
        """``private_dirs``: absolute directories (e.g. /etc/chrony, /run/chrony) each host gets its own
        empty copy of (bind mounts in the host's mount namespace; the copies live in the workdir, see
        :meth:`private_dir`). Created on this machine when missing (empty), never written to.
        ``sftp``: False leaves the ``Subsystem sftp`` line out of every sshd_config (a hardened host:
        SFTP refused with "Channel closed."); :meth:`set_sftp` changes one host."""
        if not 1 <= n_hosts <= MAX_HOSTS:
            raise ValueError(f"n_hosts must be between 1 and {MAX_HOSTS}, got {n_hosts}")
        self.private_dirs = tuple(private_dirs)
        for d in self.private_dirs:
            if not d.startswith("/") or d.rstrip("/") in ("", "/etc", "/run", "/var", "/usr", "/tmp"):
                raise ValueError(f"private_dirs: {d!r} must be a specific absolute directory")
        self.n_hosts = n_hosts
        self.password_auth = password_auth
        self._given_workdir = Path(workdir) if workdir is not None else None
        self._owner_pid = os.getpid()
        self._lock = threading.RLock()
        self._started = False
        self.hosts: list[TestHost] = []
        self.prefix = ""
        self.hub_ns = ""
        self.controller_ns = ""
        self.controller_addr = ""
        self.unused_addr = ""
        self.subnet = ""  # "198.18.N.0/24"
        self.client_key = Path()
        self.workdir = Path()
        self.sshd_dir = Path()
        self.start_seconds: float | None = None
        self._password_auth_by_host: dict[str, bool] = {}
        self._session_env: dict[str, dict[str, str]] = {}  # host -> sshd SetEnv for its sessions
        self.sftp = sftp
        self._sftp_by_host: dict[str, bool] = {}  # host -> sftp subsystem offered (default: self.sftp)
        # everything below is what stop() undoes; entries are removed once undone
        self._namespaces: list[str] = []
        self._etc_dirs: list[Path] = []
        self._sshd: dict[str, _Sshd] = {}
        self._users: list[str] = []
        self._sudoers: list[Path] = []
        self._tmpdirs: list[Path] = []

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> "NamespaceCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "NamespaceCluster":
        """Build namespaces and network, start every sshd and wait until each accepts."""
        with self._lock:
            if self._started:
                return self
            with _ACTIVE_LOCK:
                _ACTIVE[id(self)] = self
            _install_signal_handlers()
            t0 = time.monotonic()
            try:
                self._start()
            except BaseException:
                self.stop()
                raise
            self._started = True
            self.start_seconds = time.monotonic() - t0
            return self

    def _start(self) -> None:
        problems = cluster_support_problems()
        if problems:
            raise ClusterError("cannot build a namespace cluster: " + "; ".join(problems))
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        self._claim_prefix()
        self._make_dirs()

        self.hosts = []  # (a stopped cluster may be started again)
        names = [f"node{i}" for i in range(1, self.n_hosts + 1)]
        base = self.controller_addr.rsplit(".", 1)[0]  # "198.18.N"
        for i, name in enumerate(names, start=1):
            hdir = self.sshd_dir / name
            hdir.mkdir(mode=0o755)
            self.hosts.append(
                TestHost(
                    name=name,
                    ns=f"{self.prefix}-h{i}",
                    addr=f"{base}.{10 + i}",
                    hostname=name,
                    host_key_pub=hdir / "ssh_host_ed25519_key.pub",
                    sshd_config=hdir / "sshd_config",
                    sshd_log=self.workdir / f"sshd-{name}.log",
                )
            )
            self._password_auth_by_host[name] = self.password_auth

        # keys (parallel), client key authorised for root
        self.client_key = self.workdir / "id_ed25519"
        keygen = [(_keygen_argv(self.client_key, f"cluster-client@{self.prefix}"), None)]
        keygen += [(_keygen_argv(self._host_key(h), f"{h.name}@{self.prefix}"), None) for h in self.hosts]
        _check_parallel(keygen)
        self._write_authorized_key("root")

        # namespaces (the hub already exists), then the wiring: one batch per namespace
        self._add_namespaces([self.controller_ns] + [h.ns for h in self.hosts])
        hub_cmds = ["link add br0 type bridge", "link set br0 up"]
        for i, h in enumerate(self.hosts, start=1):
            hub_cmds += [
                f"link add h{i} type veth peer name eth0 netns {h.ns}",
                f"link set h{i} master br0 up",
            ]
        hub_cmds += [
            f"link add ctl type veth peer name eth0 netns {self.controller_ns}",
            "link set ctl master br0 up",
        ]
        _check(["ip", "-n", self.hub_ns, "-batch", "-"], input="\n".join(hub_cmds) + "\n")
        per_ns = [(self.controller_ns, self.controller_addr)] + [(h.ns, h.addr) for h in self.hosts]
        _check_parallel(
            [
                (
                    ["ip", "-n", ns, "-batch", "-"],
                    "link set lo up\n"
                    f"addr add {addr}/24 dev eth0\n"
                    "link set eth0 up\n"
                    f"neigh replace {self.unused_addr} lladdr {BLACKHOLE_MAC} dev eth0 nud permanent\n",
                )
                for ns, addr in per_ns
            ]
        )

        # per-namespace /etc files
        self._write_etc(self.controller_ns, hostname=None)
        for h in self.hosts:
            self._write_etc(h.ns, hostname=h.hostname)
            self._write_sshd_config(h)

        # sshd everywhere, then prove the path controller -> every sshd
        for h in self.hosts:
            self._sshd[h.name] = _Sshd(h, self._private_mounts(h))
        for h in self.hosts:
            self._await_sshd(h)
        self._probe_from_controller([h.addr for h in self.hosts])

    def _claim_prefix(self) -> None:
        """Pick a prefix whose hub namespace we can create (O_EXCL: acts as the lock)."""
        pid = os.getpid()
        for k in range(64):
            prefix = f"cbt{pid % 10000}" + (f"x{k}" if k else "")
            hub = f"{prefix}-hub"
            res = _run(["ip", "netns", "add", hub])
            if res.returncode == 0:
                self._namespaces.append(hub)
                self.prefix, self.hub_ns = prefix, hub
                self.controller_ns = f"{prefix}-ctl"
                n = (pid + 131 * k) % 512
                base = f"198.{18 + n // 256}.{n % 256}"
                self.subnet = f"{base}.0/24"
                self.controller_addr = f"{base}.1"
                self.unused_addr = f"{base}.254"
                return
            if "exists" not in res.stderr:
                raise ClusterError(f"ip netns add {hub} failed: {res.stderr.strip()}")
        raise ClusterError("no free namespace prefix (stale cbt* namespaces? see `ip netns list`)")

    def _make_dirs(self) -> None:
        if self._given_workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
            self._tmpdirs.append(self.workdir)
        else:
            self.workdir = self._given_workdir
            self.workdir.mkdir(parents=True, exist_ok=True)
        self.sshd_dir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-sshd-", dir=SSHD_STATE_PARENT))
        self._tmpdirs.append(self.sshd_dir)
        self.sshd_dir.chmod(0o755)
        (self.sshd_dir / "authorized_keys").mkdir(mode=0o755)

    def _add_namespaces(self, names: list[str]) -> None:
        results = _run_parallel([(["ip", "netns", "add", ns], None) for ns in names])
        errors = []
        for ns, (rc, err) in zip(names, results, strict=True):
            if rc == 0:
                self._namespaces.append(ns)
            else:
                errors.append(f"ip netns add {ns}: {err.strip()}")
        if errors:
            raise ClusterError("; ".join(errors))

    def _write_etc(self, ns: str, hostname: str | None) -> None:
        d = ETC_NETNS / ns
        for _ in range(5):  # a concurrent run may rmdir an empty /etc/netns meanwhile
            try:
                ETC_NETNS.mkdir(mode=0o755, exist_ok=True)
                d.mkdir(mode=0o755, exist_ok=True)
                break
            except FileNotFoundError:
                continue
        self._etc_dirs.append(d)
        lines = [
            "127.0.0.1\tlocalhost",
            "::1\tlocalhost ip6-localhost ip6-loopback",
            f"{self.controller_addr}\tcontroller",
        ]
        lines += [f"{h.addr}\t{h.name}" for h in self.hosts]
        (d / "hosts").write_text("\n".join(lines) + "\n")
        if hostname is not None:
            (d / "hostname").write_text(hostname + "\n")

    @staticmethod
    def _host_key(host: TestHost) -> Path:
        return host.host_key_pub.with_suffix("")

    def _write_sshd_config(self, host: TestHost) -> None:
        sftp = next((p for p in SFTP_SERVERS if os.access(p, os.X_OK)), "internal-sftp")
        pw = "yes" if self._password_auth_by_host[host.name] else "no"
        text = f"""\
# generated by tests/cluster.py for {host.name} ({host.ns})
ListenAddress {host.addr}
Port 22
HostKey {self._host_key(host)}
PidFile {host.sshd_config.parent / "sshd.pid"}
AuthorizedKeysFile {self.sshd_dir / "authorized_keys"}/%u .ssh/authorized_keys
StrictModes yes
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication {pw}
PermitEmptyPasswords no
KbdInteractiveAuthentication no
LogLevel VERBOSE
MaxStartups 100:30:200
MaxSessions 50
PrintMotd no
PrintLastLog no
X11Forwarding no
"""
        if self._sftp_by_host.get(host.name, self.sftp):
            text += f"Subsystem sftp {sftp}\n"
        # A host stands for a fresh machine, whose login shell starts in a millisecond. Commands run
        # through root's bash, which sources ~/.bashrc when sshd starts it (Debian builds bash so),
        # and this machine's /root/.bashrc runs `pyenv init`: 0.1 s of CPU per command, paid by every
        # host on this machine's 2 cores in turn, not in parallel as separate nodes would. SHLVL=1
        # makes bash a nested shell, which leaves ~/.bashrc alone (nothing in it is the product's).
        env = {"SHLVL": "1", **self._session_env.get(host.name, {})}
        text += "SetEnv " + " ".join(f'"{k}={v}"' for k, v in env.items()) + "\n"
        host.sshd_config.write_text(text)

    def _write_authorized_key(self, user: str) -> None:
        pub = self.client_key.with_suffix(".pub").read_text()
        path = self.sshd_dir / "authorized_keys" / user
        path.write_text(pub)
        path.chmod(0o644)

    def _await_sshd(self, host: TestHost) -> None:
        sshd = self._sshd[host.name]
        if not sshd.wait_listening(SSHD_START_TIMEOUT):
            # stderr ends a moment before the exit status can be collected: await it briefly
            with contextlib.suppress(subprocess.TimeoutExpired):
                sshd.proc.wait(timeout=2)
            tail = "\n  ".join(sshd.tail)
            state = "exited" if sshd.proc.poll() is not None else "still not listening"
            raise ClusterError(f"sshd of {host.name} ({host.ns}) {state}; stderr:\n  {tail}")

    def _probe_from_controller(self, addrs: list[str], timeout: float = 10.0) -> None:
        """Await an SSH banner from each address, connecting from the controller namespace."""
        script = (
            "import socket,sys,time\n"
            "deadline=time.monotonic()+float(sys.argv[1])\n"
            "for a in sys.argv[2:]:\n"
            "    while True:\n"
            "        try:\n"
            "            with socket.create_connection((a,22),timeout=2) as s:\n"
            "                if s.recv(8)==b'SSH-2.0-': break\n"
            "        except OSError as e:\n"
            "            err=e\n"
            "        if time.monotonic()>deadline: sys.exit(f'{a}: no SSH banner: {err}')\n"
            "        time.sleep(0.02)\n"
        )
        res = self.ns_run(
            self.controller_ns, [sys.executable, "-I", "-S", "-c", script, str(timeout), *addrs]
        )
        if res.returncode != 0:
            raise ClusterError(f"controller cannot reach sshd: {res.stderr.strip()}")

    def stop(self) -> None:
        """Remove everything the cluster created. Idempotent; never raises."""
        with self._lock:
            self._started = False
            for step in (
                self._stop_processes,
                self._remove_users,
                self._remove_namespaces,
                self._remove_dirs,
            ):
                try:
                    step()
                except Exception as exc:  # keep going: later steps must still run
                    print(f"tests/cluster.py: {step.__name__} failed: {exc!r}", file=sys.stderr)
            leftovers = (
                self._namespaces,
                self._etc_dirs,
                self._sshd,
                self._users,
                self._sudoers,
                self._tmpdirs,
            )
            if not any(leftovers):
                with _ACTIVE_LOCK:
                    _ACTIVE.pop(id(self), None)

    def _stop_processes(self) -> None:
        pids: set[int] = set()
        for ns in self._namespaces:
            res = _run(["ip", "netns", "pids", ns])
            pids.update(int(p) for p in res.stdout.split() if p.isdigit())
        pids.discard(os.getpid())
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            pids = _wait_pids_gone(pids, wait)
            if not pids:
                break
        for name in list(self._sshd):
            self._sshd.pop(name).stop(timeout=2.0)
        if pids:
            raise ClusterError(f"processes survived SIGKILL: {sorted(pids)}")

    def _remove_users(self) -> None:
        while self._sudoers:
            self._sudoers[-1].unlink(missing_ok=True)
            self._sudoers.pop()
        for name in list(self._users):
            self._delete_user(name)

    def _delete_user(self, name: str) -> None:
        res = _run(["userdel", "-r", name])
        if res.returncode not in (0, 6):  # 6: no such user
            res = _run(["userdel", "-r", "-f", name])
        if self.sshd_dir != Path():
            (self.sshd_dir / "authorized_keys" / name).unlink(missing_ok=True)
        if name in self._users:
            self._users.remove(name)
        if res.returncode not in (0, 6, 12):  # 12: home could not be removed
            raise ClusterError(f"userdel {name}: {res.stderr.strip()}")

    def _remove_namespaces(self) -> None:
        if self._namespaces:
            # hosts and controller first; their veth peers in the hub disappear with them
            batch = "".join(f"netns del {ns}\n" for ns in reversed(self._namespaces))
            _run(["ip", "-force", "-batch", "-"], input=batch)
            left = [ns for ns in self._namespaces if (RUN_NETNS / ns).exists()]
            self._namespaces = left
            if left:
                raise ClusterError(f"namespaces not deleted: {left}")

    def _remove_dirs(self) -> None:
        for d in list(self._etc_dirs):
            shutil.rmtree(d, ignore_errors=True)
            if not d.exists():
                self._etc_dirs.remove(d)
        with contextlib.suppress(OSError):
            ETC_NETNS.rmdir()  # only succeeds when empty (i.e. nobody else uses it)
        for d in list(self._tmpdirs):
            shutil.rmtree(d, ignore_errors=True)
            if not d.exists():
                self._tmpdirs.remove(d)

    # ----------------------------------------------------------------- running things

    def ns_run(self, ns: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """``ip netns exec NS argv`` (capture_output, text, check=False unless overridden).

        Note: this gets the namespace's network and /etc/hosts, not the host's UTS namespace
        (``hostname`` prints the machine's name); use SSH for the host's view.
        """
        return _run(["ip", "netns", "exec", ns, *argv], **kwargs)

    def host_run(self, host: TestHost, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Run argv "on" the host without SSH: its network, /etc files and hostname (the UTS
        namespace of its running sshd). Same defaults as ns_run."""
        sshd = self._sshd.get(host.name)
        if sshd is None or sshd.proc.poll() is not None:
            raise ClusterError(f"sshd of {host.name} is not running (host_run joins its UTS namespace)")
        join = ["--uts", "--mount"] if self.private_dirs else ["--uts"]
        return self.ns_run(host.ns, ["nsenter", *join, "-t", str(sshd.proc.pid), *argv], **kwargs)

    def private_dir(self, host: TestHost, path: str) -> Path:
        """This machine's path of ``host``'s own copy of ``path`` (one of ``private_dirs``)."""
        if path not in self.private_dirs:
            raise KeyError(f"{path} is not one of private_dirs {self.private_dirs}")
        return self.workdir / "private" / host.name / path.strip("/").replace("/", "_")

    def _private_mounts(self, host: TestHost) -> dict[str, Path]:
        mounts = {}
        for path in self.private_dirs:
            copy = self.private_dir(host, path)
            copy.mkdir(parents=True, exist_ok=True)
            mounts[path] = copy
        return mounts

    def controller_argv(self, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        """argv that runs ``argv`` in the controller namespace, with ``env`` added to the
        inherited environment."""
        assignments = []
        for key, value in (env or {}).items():
            if not key or "=" in key:
                raise ValueError(f"bad environment variable name {key!r}")
            assignments.append(f"{key}={value}")
        return ["ip", "netns", "exec", self.controller_ns, "env", "--", *assignments, *argv]

    # ----------------------------------------------------------------- client-side files

    def known_hosts_text(self, hosts: Iterable[TestHost] | None = None) -> str:
        """Plain known_hosts lines ``ADDR ssh-ed25519 AAAA...`` for ``hosts`` (default all)."""
        chosen = self.hosts if hosts is None else list(hosts)
        return "".join(f"{h.addr} {h.host_key_line()}\n" for h in chosen)

    def ssh_config_text(self) -> str:
        """An ~/.ssh/config with one ``Host nodeK`` alias per host."""
        blocks = []
        for h in self.hosts:
            blocks.append(
                f"Host {h.name}\n"
                f"    HostName {h.addr}\n"
                "    Port 22\n"
                "    User root\n"
                f"    IdentityFile {self.client_key}\n"
                "    IdentitiesOnly yes\n"
            )
        return "\n".join(blocks)

    def host(self, name: str) -> TestHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    # ----------------------------------------------------------------- changing hosts

    def stop_sshd(self, host: TestHost) -> None:
        """Stop the host's sshd listener (connections refused); open sessions keep running,
        like ``systemctl stop ssh``. Idempotent."""
        with self._lock:
            sshd = self._sshd.pop(host.name, None)
            if sshd is not None:
                sshd.stop()

    def start_sshd(self, host: TestHost) -> None:
        """Start the host's sshd (if stopped) and wait until it accepts connections."""
        with self._lock:
            if host.name in self._sshd and self._sshd[host.name].proc.poll() is None:
                return
            self._sshd.pop(host.name, None)
            self._sshd[host.name] = _Sshd(host, self._private_mounts(host))
            self._await_sshd(host)
            self._probe_from_controller([host.addr])

    def restart_sshd(self, host: TestHost) -> None:
        self.stop_sshd(host)
        self.start_sshd(host)

    def rotate_host_key(self, host: TestHost) -> None:
        """Give the host a new ed25519 host key; sshd is restarted and listening again."""
        with self._lock:
            self.stop_sshd(host)
            key = self._host_key(host)
            key.unlink(missing_ok=True)
            host.host_key_pub.unlink(missing_ok=True)
            _check(_keygen_argv(key, f"{host.name}@{self.prefix}-{time.time_ns()}"))
            self.start_sshd(host)

    def set_password_auth(self, host: TestHost, enabled: bool) -> None:
        """Switch PasswordAuthentication for one host (sshd restarted if it was running)."""
        with self._lock:
            self._password_auth_by_host[host.name] = enabled
            self._write_sshd_config(host)
            if host.name in self._sshd:
                self.restart_sshd(host)

    def set_sftp(self, host: TestHost, enabled: bool) -> None:
        """Offer the sftp subsystem on ``host`` or not (sshd restarted if it was running)."""
        with self._lock:
            self._sftp_by_host[host.name] = enabled
            self._write_sshd_config(host)
            if host.name in self._sshd:
                self.restart_sshd(host)

    def set_session_env(self, host: TestHost, env: dict[str, str] | None) -> None:
        """Environment sshd gives every session on ``host`` (``SetEnv``), e.g. LD_PRELOAD=libfaketime
        to skew that host's clock for its sessions only; None restores the default. sshd restarts."""
        with self._lock:
            if env:
                self._session_env[host.name] = dict(env)
            else:
                self._session_env.pop(host.name, None)
            self._write_sshd_config(host)
            if host.name in self._sshd:
                self.restart_sshd(host)

    def run_processes(self, marker: str = "CLUSTER_BOOTSTRAP_RUN") -> dict[int, str]:
        """Every live process on the hosts that belongs to a run (it carries the product's run marker,
        ``CLUSTER_BOOTSTRAP_RUN=<run-id>/<node>/<launch>``; a Slurm job's: ``CB_RUN_ID``): pid ->
        marker."""
        found: dict[int, str] = {}
        prefix = marker.encode() + b"="
        for host in self.hosts:
            res = _run(["ip", "netns", "pids", host.ns])
            for pid in (int(p) for p in res.stdout.split() if p.isdigit()):
                try:
                    environ = Path(f"/proc/{pid}/environ").read_bytes()
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:  # gone meanwhile
                    continue
                for entry in environ.split(b"\0"):
                    if entry.startswith(prefix) and state != "Z":
                        found[pid] = entry.split(b"=", 1)[1].decode("utf-8", "replace")
        return found

    def end_run_processes(self, grace: float = 20.0, marker: str = "CLUSTER_BOOTSTRAP_RUN") -> dict[int, str]:
        """Await the end of every run's processes on the hosts (``grace`` seconds), then kill those
        left: what a test left running. Returns them (pid -> marker and command; empty: none was)."""
        left = self.run_processes(marker)
        if not left:
            return {}
        alive = _wait_pids_gone(left, grace)
        said = {pid: f"{left[pid]} {_command(pid)}" for pid in alive}
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_pids_gone(alive, 3.0)
        return said

    def kill_host_processes(self, host: TestHost) -> None:
        """Kill every process in the host's namespace (sshd and sessions): a crashed host."""
        with self._lock:
            res = _run(["ip", "netns", "pids", host.ns])
            pids = {int(p) for p in res.stdout.split() if p.isdigit()} - {os.getpid()}
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _wait_pids_gone(pids, 3.0)
            self.stop_sshd(host)

    def add_user(
        self,
        name: str,
        password: str | None = None,
        authorized_key: bool = True,
        sudo: Literal["none", "nopasswd", "password"] = "none",
    ) -> None:
        """Create a user (on this machine, hence on every host); removed again by stop().

        Without ``password`` the account is unlocked with ``*`` (key login only); with it the
        password is set via chpasswd (hosts need password_auth for password logins).
        ``authorized_key`` authorises :attr:`client_key`; ``sudo`` adds a rule in
        /etc/sudoers.d/<prefix>-<name>.
        """
        if not _USER_RE.match(name):
            raise ValueError(f"invalid user name {name!r}")
        if sudo not in ("none", "nopasswd", "password"):
            raise ValueError(f"sudo must be 'none', 'nopasswd' or 'password', not {sudo!r}")
        with self._lock:
            if self.sshd_dir == Path():
                raise ClusterError("start() the cluster before add_user()")
            try:
                pwd.getpwnam(name)
            except KeyError:
                pass
            else:
                raise ClusterError(f"user {name!r} already exists on this machine; not touching it")
            _check(["useradd", "-m", "-s", "/bin/bash", name])
            self._users.append(name)
            if password is None:
                _check(["usermod", "-p", "*", name])
            else:
                _check(["chpasswd"], input=f"{name}:{password}\n")
            if authorized_key:
                self._write_authorized_key(name)
            if sudo != "none":
                rule = f"{name} ALL=(ALL:ALL) {'NOPASSWD: ' if sudo == 'nopasswd' else ''}ALL\n"
                target = SUDOERS_DIR / f"{self.prefix}-{name}"
                tmp = SUDOERS_DIR / f".{self.prefix}-{name}.tmp"  # sudo ignores names with '.'
                tmp.write_text(rule)
                tmp.chmod(0o440)
                try:
                    _check(["visudo", "-c", "-q", "-f", str(tmp)])
                    self._sudoers.append(target)
                    os.replace(tmp, target)
                finally:
                    tmp.unlink(missing_ok=True)

    def remove_user(self, name: str) -> None:
        """Remove a user created by add_user (and its sudoers file)."""
        with self._lock:
            target = SUDOERS_DIR / f"{self.prefix}-{name}"
            if target in self._sudoers:
                target.unlink(missing_ok=True)
                self._sudoers.remove(target)
            if name in self._users:
                self._delete_user(name)

    def sshd_log(self, host: TestHost) -> str:
        """What the host's sshd logged so far (useful in assertion messages)."""
        try:
            return host.sshd_log.read_text(errors="replace") if host.sshd_log else ""
        except FileNotFoundError:
            return ""


def _main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Start a namespace cluster and time it.")
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--hold", action="store_true", help="keep it up until Enter / Ctrl-C")
    args = parser.parse_args()
    with NamespaceCluster(args.hosts) as cluster:
        print(f"started {args.hosts} hosts in {cluster.start_seconds:.2f}s (subnet {cluster.subnet})")
        print(
            f"controller: {cluster.controller_ns} {cluster.controller_addr}; client key {cluster.client_key}"
        )
        for h in cluster.hosts:
            print(f"  {h.name:8} {h.ns:14} {h.addr:15} {h.fingerprint()}")
        if args.hold:
            with contextlib.suppress(KeyboardInterrupt, EOFError):
                input("press Enter to stop\n")
        t0 = time.monotonic()
    print(f"stopped in {time.monotonic() - t0:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
