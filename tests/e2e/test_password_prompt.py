"""A node with ``password_prompt: true`` is asked for its password once per run, on a real terminal
(issue 13: "a password-prompt node is prompted once"), before anything runs, although every phase of
the main pipeline uses that node.

The real ``bootstrap`` runs in the controller namespace with a pseudo-terminal as its stdin, stdout,
stderr and controlling terminal (getpass reads /dev/tty). The test reads the terminal as the output
comes, types the password when the prompt shows, and counts what node2's own sshd logged.

node2 is reached as a user who can log in with a password only (no authorised key) and who has
passwordless sudo (the firewall and time steps run as root). Python under /root is not readable by
other users, so every node runs one Python all users can read: Debian's interpreter in a venv that
sees the test venv's packages (torch).
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster import NamespaceCluster, TestHost
from tests.conftest import BOOTSTRAP, write_inventory

#: this machine's users are shared by every test process: a name no other test file uses
USER = "cbtpwprompt"
#: the whole pipeline (firewall, time, check, validate, launch) on a loaded machine: about a minute
PIPELINE_TIMEOUT = 600.0
PROMPT_TIMEOUT = 60.0
#: terminal control sequences (rich's live display, colours): dropped before reading the text
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


@dataclass
class Login:
    user: str
    password: str
    python: str


@pytest.fixture(scope="module")
def shared_python() -> Iterator[str]:
    """A Python with torch that every user can run: /usr/bin/python3 in a venv whose site-packages
    point (a .pth line) at a copy of the test venv's, all under a world-readable directory.

    A copy, not the test venv itself: the clone may live where only root can enter (a 0700
    ``mktemp -d``, or /root). Hard links make it cheap on the clone's file system; another file
    system gets real copies."""
    base = Path(tempfile.mkdtemp(prefix="cbt-pwprompt-py-"))
    try:
        base.chmod(0o755)
        venv = base / "py"
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
        ours = subprocess.run(
            [
                sys.executable,  # the test venv's (torch), under /root: root only
                "-c",
                "import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        copy = base / "site-packages"
        try:
            shutil.copytree(ours, copy, symlinks=True, copy_function=os.link)
        except (OSError, shutil.Error):  # EXDEV: another file system
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(ours, copy, symlinks=True)
        (site,) = venv.glob("lib/python3*/site-packages")
        (site / "cbt-test-venv.pth").write_text(f"{copy}\n")
        python = venv / "bin" / "python"
        probe = subprocess.run(
            ["runuser", "-u", "nobody", "--", str(python), "-c", "import torch.distributed"],
            capture_output=True,
            text=True,
        )
        if probe.returncode != 0:
            pytest.fail(f"no Python with torch readable by every user: {probe.stderr}", pytrace=False)
        yield str(python)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def login(cluster: NamespaceCluster, shared_python: str) -> Iterator[Login]:
    """USER logs in to node2 with a password only; it may run root commands with `sudo -n`."""
    password = "Pw-" + secrets.token_hex(8)  # a string no output could contain by chance
    host = cluster.host("node2")
    cluster.add_user(USER, password=password, authorized_key=False, sudo="nopasswd")
    try:
        cluster.set_password_auth(host, True)
        try:
            yield Login(USER, password, shared_python)
        finally:
            cluster.set_password_auth(host, False)
    finally:
        cluster.remove_user(USER)


class Terminal:
    """``argv`` on a new pseudo-terminal that is its controlling terminal (``setsid --ctty``)."""

    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: Path) -> None:
        master, slave = os.openpty()
        # a terminal window of 160x50 (a new pty is 0x0: rich would assume 80 columns)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
        self.master = master
        self.raw = bytearray()
        self.eof = False
        try:
            self.proc = subprocess.Popen(
                ["setsid", "--ctty", "--wait", *argv],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=env,
            )
        finally:
            os.close(slave)  # ours: the child's are its only ones (EOF when it is gone)

    @property
    def text(self) -> str:
        """Everything shown so far, as a user reads it (CRLF and control sequences gone)."""
        return _ANSI.sub("", self.raw.decode(errors="replace")).replace("\r\n", "\n")

    def _read(self, deadline: float) -> None:
        """One read (or nothing, at the deadline); sets ``eof`` when the terminal's other side is gone."""
        ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: every process holding the slave side has exited
            data = b""
        if data:
            self.raw += data
        else:
            self.eof = True

    def expect(self, pattern: re.Pattern[str], timeout: float, start: int = 0) -> re.Match[str]:
        """The first match of ``pattern`` after character ``start`` of :attr:`text`, awaited."""
        deadline = time.monotonic() + timeout
        while True:
            found = pattern.search(self.text, start)
            if found:
                return found
            if self.eof or time.monotonic() >= deadline:
                why = "the program ended" if self.eof else f"nothing for {timeout:.0f} s"
                raise AssertionError(f"{why} before {pattern.pattern!r} showed; the terminal:\n{self.text}")
            self._read(deadline)

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\r")  # Enter, as a keyboard sends it

    def finish(self, timeout: float, *, refuse: re.Pattern[str], seen: int) -> int:
        """Read until the program ends; its exit code. A further match of ``refuse`` (more than ``seen``:
        a second password prompt, which nobody would answer) fails at once instead of hanging."""
        deadline = time.monotonic() + timeout
        while not self.eof and time.monotonic() < deadline:
            self._read(deadline)
            again = len(refuse.findall(self.text))
            if again > seen:
                self.stop()
                raise AssertionError(f"asked again ({again} prompts); the terminal:\n{self.text}")
        if not self.eof:
            self.stop()
            raise AssertionError(f"still running after {timeout:.0f} s; the terminal:\n{self.text}")
        return self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: bootstrap stops what runs on the nodes (exit 143)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self) -> None:
        self.stop()
        os.close(self.master)


def _inventory(cluster: NamespaceCluster, login: Login, path: Path, **cluster_settings: object) -> Path:
    nodes: list[dict[str, object]] = []
    for h in cluster.hosts:
        node: dict[str, object] = {"name": h.name, "host": h.addr, "user": "root", "python": login.python}
        if h.name == "node2":
            node.update(user=login.user, password_prompt=True)
        nodes.append(node)
    # firewall and time are managed (the defaults, said here as the test depends on them): those
    # steps run as root, so USER's `sudo -n` is used on node2
    return write_inventory(
        path,
        nodes,
        name="pwprompt",
        master="node1",
        backend="gloo",
        firewall={"manage": True},
        time={"manage": True},
        **cluster_settings,
    )


def _count(host: TestHost, text: str) -> int:
    assert host.sshd_log is not None
    return host.sshd_log.read_text(errors="replace").count(text) if host.sshd_log.exists() else 0


#: one line per login (sshd at LogLevel VERBOSE also says "Accepted key ... found at" before it)
_LOGIN = re.compile(r"^Accepted (?:publickey|password|keyboard-interactive\S*) for ", re.M)


def _logins(cluster: NamespaceCluster) -> dict[str, int]:
    """Logins each host's sshd accepted so far."""
    return {h.name: len(_LOGIN.findall(cluster.sshd_log(h))) for h in cluster.hosts}


def _prompt(login: Login, host: TestHost) -> re.Pattern[str]:
    return re.compile(rf"Password for {re.escape(login.user)}@{re.escape(host.addr)} \(node 'node2'\): ")


#: any question for a password (the resolver's prompts all begin so; getpass's own default is "Password: ")
ANY_PROMPT = re.compile(r"Password for |^Password: ", re.M)


def _run_on_terminal(
    cluster: NamespaceCluster, home: Path, cwd: Path, login: Login, typed: str, *args: str
) -> tuple[int, str, dict[str, int]]:
    """``bootstrap ARGS`` on a terminal; the one password prompt answered with ``typed``. Returns the
    exit code, what the terminal showed, and the logins each host's sshd accepted meanwhile."""
    node2 = cluster.host("node2")
    env = {
        **os.environ,
        "HOME": str(home),
        "NO_COLOR": "1",
        "TERM": "xterm",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    before = _logins(cluster)
    term = Terminal(cluster.controller_argv([BOOTSTRAP, *args]), env=env, cwd=cwd)
    try:
        prompt = term.expect(_prompt(login, node2), PROMPT_TIMEOUT)
        # asked before anything runs: no node has been logged in to yet
        assert _logins(cluster) == before, term.text
        term.type(typed)
        seen = len(ANY_PROMPT.findall(term.text))
        code = term.finish(PIPELINE_TIMEOUT, refuse=ANY_PROMPT, seen=seen)
        shown = term.text
        assert shown.count("Password for") == 1 and prompt.start() == shown.find("Password for"), shown
    finally:
        term.close()
    after = _logins(cluster)
    return code, shown, {name: after[name] - before[name] for name in after}


def test_whole_pipeline_asks_node2_password_once(
    cluster: NamespaceCluster, trusted_home: Path, login: Login, tmp_path: Path
) -> None:
    node2 = cluster.host("node2")
    # the training: each rank says who runs it (uploaded from here into each node's code directory)
    (tmp_path / "rank.py").write_text(
        "import getpass, os\n"
        "rank, world = os.environ['RANK'], os.environ['WORLD_SIZE']\n"
        "print('rank', rank, 'of', world, 'as', getpass.getuser(), flush=True)\n"
    )
    inv = _inventory(cluster, login, tmp_path / "hosts.yaml", train={"script": "rank.py"})
    accepted = f"Accepted password for {login.user} "
    before = _count(node2, accepted)
    code, shown, logins = _run_on_terminal(
        cluster, trusted_home, tmp_path, login, login.password, "-i", str(inv)
    )
    assert code == 0, shown
    assert login.password not in shown
    # the firewall and time steps ran (as root through USER's sudo on node2), then the preflight
    assert "ready to train" in shown and "NOT ready" not in shown, shown
    # validation and training ran on every node, node2 included (as USER, over its one login)
    assert "3 of 3 rank(s) joined" in shown and "all_reduce result correct" in shown, shown
    assert re.search(rf"^\[node2:1\] rank 1 of 3 as {login.user}\r?$", shown, re.M), shown
    assert re.search(r"^│ node2 +│ ok +│", shown, re.M), shown  # the run's summary row
    assert _count(node2, accepted) - before == 1, cluster.sshd_log(node2)
    assert logins == {"node1": 1, "node2": 1, "node3": 1}, (logins, shown)


def _wrong_password_run(
    cluster: NamespaceCluster, home: Path, login: Login, tmp_path: Path
) -> tuple[int, str, dict[str, int], int]:
    """``--until check`` with a wrong password typed at the one prompt: the exit code, the terminal,
    the logins accepted, and the failed password logins node2's sshd logged."""
    node2 = cluster.host("node2")
    inv = _inventory(cluster, login, tmp_path / "hosts.yaml")
    wrong = "Wrong-" + secrets.token_hex(8)
    failed = f"Failed password for {login.user} "
    before = _count(node2, failed)
    code, shown, logins = _run_on_terminal(
        cluster, home, tmp_path, login, wrong, "-i", str(inv), "--until", "check"
    )
    assert wrong not in shown and login.password not in shown, shown
    return code, shown, logins, _count(node2, failed) - before


def _auth_errors(shown: str, login: Login) -> list[str]:
    """The error lines (not the progress display's) that say node2 refused the login."""
    return [
        line
        for line in shown.splitlines()
        if line.startswith(f"error: node 'node2': authentication as '{login.user}'")
    ]


def test_a_wrong_password_fails_node2_once_without_asking_again(
    cluster: NamespaceCluster, trusted_home: Path, login: Login, tmp_path: Path
) -> None:
    """One prompt (the wrong answer is not asked for again, and nothing waits for a second one), an
    error naming node2 and its login, the other nodes checked, exit 3 (docs/cli.md: a node could not
    be authenticated, "wrong user or password").

    And what a user expects: the password typed once is sent once (the transport keeps the refusal:
    later phases meet it without asking the node again), and said once. Each failed login counts
    against the account where pam_faillock locks it (deny=3 by default) and against the controller's
    address where fail2ban watches sshd (maxretry=5 by default)."""
    code, shown, logins, failed = _wrong_password_run(cluster, trusted_home, login, tmp_path)
    assert code == 3, shown
    errors = _auth_errors(shown, login)
    assert len(errors) == 1, shown
    assert f"on {cluster.host('node2').addr}:22 failed" in errors[0], shown
    assert failed == 1, (failed, shown)
    assert logins == {"node1": 1, "node2": 0, "node3": 1}, (logins, shown)
    assert "2/3 nodes reachable" in shown and "NOT ready to train" in shown, shown
