"""``connection: ssh``: Linux nodes through fabric (ssh config, gateways) and paramiko channels.

Host keys are verified. fabric 3 installs ``AutoAddPolicy`` on every ``Connection`` (its gateways
included), which accepts any key silently; we replace that policy on each hop before it connects and
load known_hosts ourselves (fabric never does), through :mod:`.known_hosts`: a key listed as
``@revoked`` is refused on every path (unknown, known, changed), before any credential is offered.

Files go over SFTP. A server without an sftp subsystem (hardened hosts leave the ``Subsystem sftp``
line out) refuses it ("Channel closed."): the transport then says so once (log and :attr:`notes`)
and moves files through the shell, as Ansible does: the platform's upload and download scripts over
the exec channel, base64 in chunks, SHA-256 checked and renamed into place (:mod:`.piped`).
"""

from __future__ import annotations

import errno
import os
import posixpath
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paramiko
from fabric import Config, Connection

import orchestrator.transports.piped as piped
import orchestrator.transports.sftp as sftp_files
from orchestrator.errors import (
    AuthenticationError,
    BootstrapError,
    CancelledError,
    ConnectError,
    HostKeyChangedError,
    TransferError,
    UnreachableError,
)
from orchestrator.platforms import Platform
from orchestrator.transports.base import Deadline, LineSplitter, OnLine, Result, Transport, log
from orchestrator.transports.known_hosts import (
    KnownHosts,
    VerifyingPolicy,
    compare_command,
    fingerprint,
    lookup_name,
    revoked_error,
)
from orchestrator.transports.options import SSHOptions
from orchestrator.transports.sockets import limit_unacknowledged, no_delay

__all__ = ["SSHTransport", "fingerprint"]


class _Liveness:
    """Whether the node's SSH server still answers, while a command runs: one keepalive request
    (``keepalive@openssh.com``, a reply asked for: OpenSSH answers it with a failure, which is an
    answer) outstanding at a time, sent from a thread of its own (paramiko waits for the reply)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: float | None = None  # when the outstanding request was sent

    def ask(self, transport: paramiko.Transport | None) -> None:
        """Send a request unless one is outstanding."""
        if transport is None or not transport.is_active():
            return
        with self._lock:
            if self._asked is not None:
                return
            self._asked = time.monotonic()
        threading.Thread(target=self._wait, args=(transport,), name="ssh-liveness", daemon=True).start()

    def _wait(self, transport: paramiko.Transport) -> None:
        try:
            transport.global_request("keepalive@openssh.com", wait=True)
        except Exception as exc:  # a dead transport: the read loop says so itself
            log.debug("keepalive request failed: %r", exc)
        finally:
            with self._lock:
                self._asked = None

    def unanswered(self) -> float:
        """Seconds the outstanding request has waited for its reply (0: none outstanding)."""
        with self._lock:
            return 0.0 if self._asked is None else time.monotonic() - self._asked


def _direct_peer(sock: object) -> str | None:
    """The address a plain TCP socket is connected to (a ProxyCommand's pipe has none)."""
    if not isinstance(sock, socket.socket):
        return None
    try:
        return str(sock.getpeername()[0])
    except (OSError, IndexError):
        return None


def _auth_failed(exc: BaseException) -> bool:
    """The server refused every credential offered (or none could be offered)."""
    return isinstance(exc, paramiko.AuthenticationException) or "No authentication methods" in str(exc)


#: the longest command line a Linux node's login shell can be handed (MAX_ARG_STRLEN: 32 pages of 4 KiB)
MAX_LINE = 131072


class SSHTransport(Transport):
    kind = "ssh"
    connect_timeout: float  # always set: these transports dial

    #: after the exit status arrives, how long to wait for the output stream to end (sshd reports
    #: the exit before it has drained the pipe; a background child may hold it open forever)
    EOF_GRACE = 2.0

    #: SSH window of a command's channel: the most output that can be on its way from the node's
    #: sshd to here. A rank printing faster than this terminal takes it waits on it, so at full speed
    #: a line waits about window / throughput: paramiko's 2 MiB made that half a second at 4 MB/s per
    #: node (benchmarks/logs.py); 64 KiB keeps it under 100 ms, and still allows 32 MB/s per node at a
    #: 2 ms round trip. Files go over SFTP, on their own channel with the default window.
    COMMAND_WINDOW = 64 * 1024

    #: seconds between the bytes written to a running command's stdin (the node's sign of life; its
    #: watcher reads them with one bash, no process per heartbeat: stop_on_hangup)
    HEARTBEAT = 2.0
    #: seconds without a heartbeat after which the node stops the command (a controller cut off by
    #: the network leaves nothing running unseen for longer, plus the stop's 5 s KILL grace); far
    #: above HEARTBEAT, so a loaded controller or a short network stall never stops a training
    NODE_SILENCE = 15.0

    #: raw bytes per base64 line when files go through the shell (no SFTP): 64 KiB lines, far from
    #: any limit of the node's tools, and the most the controller holds of a file at once
    SHELL_CHUNK = 48 * 1024

    def __init__(
        self,
        node_name: str,
        platform: Platform,
        *,
        host: str,
        port: int | None,
        user: str | None,
        key_file: str | None,
        password: Callable[[], str | None],
        options: SSHOptions,
        identities_only: bool = False,
    ) -> None:
        super().__init__(node_name, platform)
        self.options = options
        self._password = password
        self._lock = threading.Lock()
        self._sftp: paramiko.SFTPClient | None = None
        self._no_sftp = False  # the server refused the sftp subsystem: files go through the shell
        self._trusts: dict[str, KnownHosts] = {}  # known_hosts as read for each hop (lookup name)
        self._closed = False  # sticky: a closed (cancelled) transport never reconnects
        # sticky too: credentials the node refused are never sent again by this transport (one typo
        # would otherwise count as a failed login per phase: pam_faillock locks after 3, fail2ban bans)
        self._refused: AuthenticationError | None = None
        self._liveness = _Liveness()
        config = Config(runtime_ssh_path=str(options.ssh_config)) if options.ssh_config else Config()
        self.conn = Connection(host, user=user, port=port, config=config)
        # Our own dict, never fabric's config object: fabric logs changes made to that one (a
        # password would reach the debug log) and would keep them.
        kwargs: dict[str, Any] = dict(self.conn.connect_kwargs)
        if key_file:
            kwargs["key_filename"] = [os.path.expanduser(key_file), *kwargs.get("key_filename", [])]
        if identities_only:  # prove that this one key works: no agent, no other identity
            kwargs.update(allow_agent=False, look_for_keys=False)
            kwargs["key_filename"] = [os.path.expanduser(key_file)] if key_file else []
        # --connect-timeout, else ssh config ConnectTimeout (fabric read it), else 10 s. Handed to
        # paramiko as a float: fabric's own setting truncates to whole seconds (0.5 -> no timeout).
        configured = self.conn.connect_timeout
        self.connect_timeout = float(
            options.connect_timeout if options.connect_timeout is not None else configured or 10.0
        )
        self.conn.connect_timeout = None
        kwargs["timeout"] = self.connect_timeout
        self._kwargs = kwargs

    # -- connection ---------------------------------------------------------------------------

    def describe(self) -> str:
        port = self.conn.port
        return f"ssh {self.conn.user}@{self.conn.host}" + (f":{port}" if port != 22 else "")

    def _known_hosts_path(self, conn: Connection) -> Path:
        if self.options.known_hosts is not None:
            return self.options.known_hosts
        configured = conn.ssh_config.get("userknownhostsfile")
        if configured:
            return Path(os.path.expanduser(str(configured).split()[0]))
        return Path(os.path.expanduser("~/.ssh/known_hosts"))

    def _trust(self, conn: Connection) -> KnownHosts:
        """What the known_hosts files say about ``conn``'s host (read once per hop and attempt)."""
        paths = [Path("/etc/ssh/ssh_known_hosts"), self._known_hosts_path(conn)]
        trust = KnownHosts.load(paths, node=self.node_name)
        self._trusts[lookup_name(conn.host, conn.port)] = trust
        return trust

    def _secure(self, conn: Connection) -> None:
        """Replace fabric's AutoAddPolicy on ``conn`` and every gateway hop before any of them opens;
        paramiko gets only the keys not revoked for that hop's host."""
        trust = self._trust(conn)
        client = conn.client
        keys = client.get_host_keys()
        keys._entries.extend(trust.trusted_for(lookup_name(conn.host, conn.port)))  # HostKeys.load's way
        policy = VerifyingPolicy(
            self.node_name,
            self._known_hosts_path(conn),
            trust,
            self.options.accept_new_host_keys,
            self.recorded_host_keys,
        )
        client.set_missing_host_key_policy(policy)
        if isinstance(conn.gateway, Connection):
            self._secure(conn.gateway)

    def _cancelled(self) -> CancelledError:
        return CancelledError("cancelled before the command could run", node=self.node_name)

    def _open(self, password: str | None) -> None:
        kwargs = dict(self._kwargs)
        if password is not None:
            kwargs["password"] = password
        self.conn.connect_kwargs = kwargs
        try:
            self.conn.open()
        finally:
            # the secret is needed only for the handshake; never keep it on a long-lived object
            self.conn.connect_kwargs = dict(self._kwargs)

    def _abort(self) -> None:
        """Drop a half-open connection (fabric's close() ignores one whose handshake failed)."""
        self.conn.client.close()
        self.conn.close()
        gateway = self.conn.gateway
        while isinstance(gateway, Connection):
            gateway.client.close()
            gateway = gateway.gateway

    @property
    def connected(self) -> bool:
        return not self._closed and bool(self.conn.is_connected)

    def connect(self) -> None:
        with self._lock:
            if self._closed:
                raise self._cancelled()
            if self.conn.is_connected:
                return
            if self._refused is not None:
                raise self._refused
            with self.dialling():
                self._dial()
            if self._closed:  # cancelled while the handshake ran
                self._abort()
                raise self._cancelled()
            self._refuse_revoked()
            transport = self.conn.client.get_transport()
            assert transport is not None
            log.info("%s: connected: %s", self.node_name, self.describe())
            transport.set_keepalive(self.options.keepalive)
            self.peer_address = _direct_peer(transport.sock) if self.conn.gateway is None else None
            limit_unacknowledged(transport.sock, self.options.unacknowledged)
            no_delay(transport.sock)

    def _dial(self) -> None:
        """One new connection attempt (under ``_lock``): keys and the agent, then a password."""
        self._client_fresh()
        self._secure(self.conn)
        try:
            try:
                # keys and the agent first: a password (env var or prompt) only when they fail
                self._open(password=None)
            except paramiko.SSHException as exc:
                if not _auth_failed(exc):
                    raise
                password = self._password()  # may raise SecretMissingError
                if password is None:
                    raise
                self._abort()
                self._client_fresh()
                self._secure(self.conn)
                self._open(password=password)
        except ConnectError as exc:
            self._abort()
            if isinstance(exc, AuthenticationError):
                self._refused = exc
            raise
        except Exception as exc:
            self._abort()
            if self._closed:
                raise self._cancelled() from None
            error = self._explain(exc)
            if isinstance(error, AuthenticationError):
                self._refused = error
            raise error from None

    def _refuse_revoked(self) -> None:
        """A last check on every hop once connected: revoked keys never reach paramiko's trusted keys
        (:meth:`_secure`), so this only fires if that ever stops being true."""
        hop: Any = self.conn
        while isinstance(hop, Connection):
            name = lookup_name(hop.host, hop.port)
            link = hop.client.get_transport()
            key = link.get_remote_server_key() if link is not None else None
            trust = self._trusts.get(name)
            revoked = trust.revocation(name, key) if trust is not None and key is not None else None
            if revoked is not None:
                self._abort()
                raise revoked_error(self.node_name, name, key, revoked)
            hop = hop.gateway

    def _client_fresh(self) -> None:
        """A new SSHClient for each attempt (a failed one keeps state), still verifying keys."""
        self.conn.client = paramiko.SSHClient()

    def _hop(self, hostname: str) -> Connection:
        """The connection (target or gateway) a host name belongs to."""
        hop: Any = self.conn
        while isinstance(hop, Connection):
            if hop.host == hostname:
                return hop
            hop = hop.gateway
        return self.conn

    def _explain(self, exc: BaseException) -> ConnectError:
        """One clear message per way SSH connection setup fails."""
        host, port, user = self.conn.host, self.conn.port, self.conn.user
        where = f"{host}:{port}"
        if isinstance(exc, paramiko.BadHostKeyException):
            hop = self._hop(exc.hostname)
            name = exc.hostname if hop.port == 22 else f"[{exc.hostname}]:{hop.port}"
            via = "" if hop is self.conn else " (a ProxyJump hop)"
            trust = self._trusts.get(name)
            revoked = trust.revocation(name, exc.key) if trust is not None else None
            if revoked is not None:
                return revoked_error(self.node_name, name + via, exc.key, revoked)
            offered = exc.key.get_name()
            return HostKeyChangedError(
                f"HOST KEY CHANGED for {name}{via}: known_hosts has {fingerprint(exc.expected_key)}, "
                f"the host offered {offered} {fingerprint(exc.key)}. Someone may be "
                "intercepting the connection, or the host was reinstalled; refusing to connect",
                node=self.node_name,
                hint=f"if it was reinstalled, compare {fingerprint(exc.key)} with {compare_command(offered)} "
                f"run on the node (the {offered} key it offered), remove the old key with `ssh-keygen -R "
                f"{shlex.quote(name)} -f {shlex.quote(str(self._known_hosts_path(hop)))}` and rerun with "
                "--accept-new-host-keys",
            )
        if isinstance(exc, paramiko.PasswordRequiredException):
            return AuthenticationError(
                f"the private key for {user}@{where} is encrypted and no passphrase is available",
                node=self.node_name,
                hint="load it into ssh-agent (ssh-add KEY) so bootstrap can use it",
            )
        if isinstance(exc, paramiko.AuthenticationException):
            return AuthenticationError(
                f"authentication as {user!r} on {where} failed: {exc}",
                node=self.node_name,
                hint="check user:, key_file: or password_env: for this node; for a node that accepts "
                "only passwords, run `bootstrap keys` once to install your public key",
            )
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            codes = {getattr(e, "errno", None) for e in exc.errors.values()}
            if codes <= {errno.ECONNREFUSED}:
                return UnreachableError(
                    f"connection refused on {where}: nothing listens on the SSH port",
                    node=self.node_name,
                    hint="start the SSH server on the node (`sudo systemctl enable --now ssh`), or set "
                    "`port:` on the node in the inventory when it listens on another port",
                )
            if codes and codes <= {errno.EHOSTUNREACH, errno.ENETUNREACH}:  # an ARP or route failure
                return UnreachableError(
                    f"no route to {where}: {os.strerror(codes.pop() or errno.EHOSTUNREACH)}",
                    node=self.node_name,
                    hint="is the node on this network and powered on? (its address answers nothing)",
                )
            return UnreachableError(f"cannot connect to {where}: {exc}", node=self.node_name)
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return UnreachableError(
                f"connection to {where} timed out after {self.connect_timeout:g}s",
                node=self.node_name,
                hint="is the node powered on and is the address right? A firewall dropping port "
                f"{port} looks the same; try `ping {host}`",
            )
        if isinstance(exc, socket.gaierror):
            return UnreachableError(
                f"cannot resolve host name {host!r}: {exc.strerror}",
                node=self.node_name,
                hint="fix host: in the inventory or add the name to DNS / /etc/hosts",
            )
        if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return UnreachableError(
                f"no route to {where}: {exc.strerror}",
                node=self.node_name,
                hint="is the node on this network and powered on?",
            )
        if isinstance(exc, paramiko.SSHException) and _no_greeting(exc):
            # the node's kernel took the connection, its SSH server never spoke (paramiko's own words,
            # "No existing session", point at keys)
            return UnreachableError(
                f"{where} accepted the connection, but its SSH server did not answer within "
                f"{self.connect_timeout:g}s: the machine may be frozen or overloaded (or what listens "
                "there is not an SSH server)",
                node=self.node_name,
                hint="--connect-timeout waits longer; check the node's console or load",
            )
        if isinstance(exc, paramiko.SSHException):
            return UnreachableError(f"SSH handshake with {where} failed: {exc}", node=self.node_name)
        if isinstance(exc, OSError):
            return UnreachableError(f"cannot connect to {where}: {exc}", node=self.node_name)
        return UnreachableError(
            f"cannot connect to {where}: {type(exc).__name__}: {exc}", node=self.node_name
        )

    # -- commands -----------------------------------------------------------------------------

    def plan(self, script: str) -> str:
        return self.platform.stop_on_hangup(script, silence=self.NODE_SILENCE)

    def run_raw(
        self,
        script: str,
        *,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        keep_lines: int | None = None,
    ) -> Result:
        line = self._login_line(self.plan(script))
        # stdin stays open: closing it is how a timeout or a cancel stops the remote command
        chan = self._exec(line, window=self.COMMAND_WINDOW)
        return self._collect(chan, script, Deadline(timeout), on_line, keep_lines, heartbeat=True)

    def run_brief_raw(self, script: str, *, timeout: float) -> Result:
        line = self._login_line(script)  # no stop_on_hangup: nothing to watch
        return self._collect(self._exec(line), script, Deadline(timeout), None, 20, heartbeat=False)

    def _login_line(self, script: str) -> str:
        line = self.platform.login_command(script)
        if len(line.encode()) >= MAX_LINE:  # the login shell could not start it: say why, here
            raise BootstrapError(
                f"a command of {len(line.encode()):,} bytes is longer than one command line holds on "
                f"a Linux node ({MAX_LINE:,} bytes): a bug, please report it with `bootstrap -vv`",
                node=self.node_name,
            )
        return line

    def _exec(self, line: str, *, window: int | None = None) -> paramiko.Channel:
        """A new channel running the command line ``line``."""
        self.connect()
        transport = self.conn.client.get_transport()
        if self._closed:
            raise self._cancelled()
        if transport is None or not transport.is_active():
            raise UnreachableError(f"the SSH connection to {self.conn.host} was lost", node=self.node_name)
        try:
            chan = transport.open_session(timeout=self.connect_timeout, window_size=window)  # None: default
            chan.exec_command(line)
        except paramiko.SSHException as exc:
            if self._closed:
                raise self._cancelled() from None
            raise UnreachableError(f"cannot start a command over SSH: {exc}", node=self.node_name) from exc
        return chan

    def _collect(
        self,
        chan: paramiko.Channel,
        command: str,
        deadline: Deadline,
        on_line: OnLine | None,
        keep_lines: int | None,
        *,
        heartbeat: bool,
    ) -> Result:
        """Read ``chan``'s output until the command ends (or ``deadline``), then close it.
        ``heartbeat``: write a byte to its stdin every :attr:`HEARTBEAT` seconds (stop_on_hangup)."""
        out = LineSplitter("stdout", on_line, keep_lines)
        err = LineSplitter("stderr", on_line, keep_lines)
        timed_out = False
        grace: Deadline | None = None
        beat = time.monotonic() + self.HEARTBEAT
        try:
            while True:
                if heartbeat and time.monotonic() >= beat and not chan.exit_status_ready():
                    # the node's watcher stops the command when these stop coming (a lost controller)
                    try:
                        chan.sendall(b"\n")
                    except OSError:
                        # the command ended and sshd closed the channel between the check and the
                        # write ("Socket is closed"): nothing to keep alive; read what is left
                        if not (chan.closed or chan.exit_status_ready()):
                            raise
                    beat = time.monotonic() + self.HEARTBEAT
                    # and the node must answer: a frozen sshd (or node) whose kernel still takes
                    # our bytes loses no connection, and its silence looked like a quiet rank
                    self._liveness.ask(chan.get_transport())
                    if self._liveness.unanswered() > self.NODE_SILENCE:
                        chan.close()
                        raise UnreachableError(
                            f"{self.conn.host} stopped answering: no reply from its SSH server for "
                            f"{self.NODE_SILENCE:.0f} s while the connection stayed up (the node, or its "
                            "sshd, is frozen or swamped)",
                            node=self.node_name,
                            hint="the node stops its part of the run by itself when it hears nothing "
                            "from here; its own log keeps what it did",
                        )
                while chan.recv_ready():
                    out.feed(chan.recv(65536))
                while chan.recv_stderr_ready():
                    err.feed(chan.recv_stderr(65536))
                if chan.closed or (chan.eof_received and chan.exit_status_ready()):
                    break
                if chan.exit_status_ready():
                    # sshd sends the exit status before it has drained the command's pipe: keep
                    # reading until end-of-file, or briefly when a left-behind child holds it open.
                    grace = grace or Deadline(self.EOF_GRACE)
                    if grace.expired:
                        break
                if deadline.expired:
                    timed_out = True
                    chan.shutdown_write()  # EOF on stdin: the remote watcher stops the process group
                    break
                wait = (
                    deadline.remaining(1.0)
                    if grace is None
                    else min(deadline.remaining(1.0), grace.remaining(1.0))
                )
                if chan.eof_received:
                    # the output pipe is readable for good now: wait on the status, not on select
                    chan.status_event.wait(wait)
                else:
                    select.select([chan], [], [], wait)
            while chan.recv_ready():
                out.feed(chan.recv(65536))
            while chan.recv_stderr_ready():
                err.feed(chan.recv_stderr(65536))
        except (EOFError, OSError, paramiko.SSHException) as exc:
            # the connection died under a read (paramiko raises EOFError from its window adjust)
            if self._closed:
                raise self._cancelled() from None
            raise UnreachableError(
                f"the connection to {self.conn.host} was lost while the command ran "
                f"({exc or type(exc).__name__})",
                node=self.node_name,
                hint="the node may have gone down or off the network; output so far is in the log",
            ) from exc
        finally:
            out.close()
            err.close()
        exit_code: int | None = None
        if not timed_out and chan.exit_status_ready():
            exit_code = chan.recv_exit_status()
            if exit_code == -1:  # no exit-status message (killed by a signal without exit-signal)
                exit_code = None
        chan.close()  # also tells the remote watcher to stop whatever the command left behind
        if exit_code is None and not timed_out and not self._closed:
            raise UnreachableError(
                f"the connection to {self.conn.host} was lost while the command ran",
                node=self.node_name,
                hint="the node may have gone down or off the network; output so far is in the log",
            )
        return Result(
            node=self.node_name,
            command=command,
            exit_code=exit_code,
            stdout=out.text,
            stderr=err.text,
            duration=deadline.elapsed,
            timed_out=timed_out,
        )

    # -- files --------------------------------------------------------------------------------

    def _sftp_client(self) -> paramiko.SFTPClient | None:
        """The connection's SFTP session; None when the server has no sftp subsystem (then files go
        through the shell, said once in the log and in :attr:`notes`)."""
        self.connect()
        with self._lock:
            if self._sftp is None and not self._no_sftp:
                try:
                    self._sftp = self.conn.client.open_sftp()
                except (EOFError, OSError, paramiko.SSHException) as exc:
                    if self._closed:  # cancelled (fail fast, Ctrl-C) while the channel opened
                        raise self._cancelled() from None
                    link = self.conn.client.get_transport()
                    if isinstance(exc, paramiko.ChannelException) or link is None or not link.is_active():
                        # no channel at all (MaxSessions) or no connection: the shell cannot help
                        raise TransferError(
                            f"cannot start SFTP: {exc or type(exc).__name__}", node=self.node_name
                        ) from exc
                    self._no_sftp = True
                    note = (
                        f"the SSH server refused SFTP ({exc or type(exc).__name__}: no sftp subsystem?): "
                        "files go through the shell (base64, SHA-256 checked)"
                    )
                    log.info("%s: %s", self.node_name, note)
                    self.notes.append(note)
            return self._sftp

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        sftp = self._sftp_client()
        path = self.platform.transfer_path(remote)
        if sftp is None:
            payload = piped.Payload(path=local, node=self.node_name)
            piped.upload(
                self._piped,
                self.platform,
                payload,
                path,
                node=self.node_name,
                chunk=self.SHELL_CHUNK,
                cancelled=lambda: self._closed,
                mode=mode,
                label=str(local),
            )
            return
        try:
            sftp_files.upload(sftp, local, path, mode=mode)
        except (EOFError, OSError, paramiko.SSHException) as exc:
            if self._closed:
                raise self._cancelled() from None
            said = str(exc)
            if isinstance(exc, OSError) and exc.errno is None:
                # SFTP's "Failure" (and a short write on a full disk) names no cause: the node's
                # shell says it (read-only, full, ...)
                said = self._why_not_written(remote) or said
            full = "No space left on device" in said
            raise TransferError(
                f"cannot write {remote} on the node: {said}",
                node=self.node_name,
                hint="free space there (`bootstrap clean --older-than 7d` removes old runs' files; their "
                "outputs stay unless --outputs), then run again"
                if full
                else None,
            ) from exc

    def _why_not_written(self, remote: str) -> str | None:
        """The reason the node's own shell gives for not writing a file beside ``remote`` (its
        errno's words: "Read-only file system", "No space left on device"), or None."""
        posix = self.platform.as_posix()
        if posix is None:
            return None
        try:
            ran = self.run(posix.try_writing_in(posixpath.dirname(remote) or "."), timeout=30)
        except BootstrapError:
            return None
        said = ran.stdout.strip().split("\n")  # lines end at \n only (node text)
        return said[-1].split(": ")[-1] if not ran.ok and said else None

    def get(self, remote: str, local: Path) -> None:
        sftp = self._sftp_client()
        if sftp is None:
            path = self.platform.transfer_path(remote)
            piped.download(
                self._piped, self.platform, path, local, node=self.node_name, cancelled=lambda: self._closed
            )
            return
        try:
            sftp_files.download(sftp, self.platform.transfer_path(remote), local)
        except (EOFError, OSError, paramiko.SSHException) as exc:
            if self._closed:
                raise self._cancelled() from None
            raise TransferError(f"cannot copy {remote} to {local}: {exc}", node=self.node_name) from exc

    # -- files through the shell (no sftp subsystem) ----------------------------------------------

    def _piped(self, line: str, stdin: Iterator[bytes] | None, on_line: OnLine | None) -> Result:
        """Run the command line ``line`` with ``stdin`` streamed into it, then closed, and wait for it.
        No heartbeat and no timeout: a transfer takes as long as its bytes need."""
        chan = self._exec(line)
        try:
            for piece in stdin or ():
                chan.sendall(piece)
            chan.shutdown_write()
        except (EOFError, OSError, paramiko.SSHException) as exc:
            if self._closed:
                raise self._cancelled() from None
            # the command ended before reading everything (its output says why), or the connection
            # is gone (reading tells): either way, what comes back is the answer
            log.debug("%s: the command stopped taking input: %s", self.node_name, exc)
        return self._collect(chan, line, Deadline(None), on_line, 20, heartbeat=False)

    def close(self) -> None:
        """Close for good (also from another thread, mid-handshake: cancellation relies on it)."""
        self._closed = True
        sftp, self._sftp = self._sftp, None
        if sftp is not None:
            sftp.close()
        self._abort()


def _no_greeting(exc: paramiko.SSHException) -> bool:
    """paramiko's ways of saying the server never completed its side of the greeting in time."""
    said = str(exc)
    return "No existing session" in said or "Error reading SSH protocol banner" in said
