"""``connection: ssh``: Linux nodes through fabric (ssh config, gateways) and paramiko channels.

Host keys are verified. fabric 3 installs ``AutoAddPolicy`` on every ``Connection`` (its gateways
included), which accepts any key silently; we replace that policy on each hop before it connects and
load known_hosts ourselves (fabric never does), through :mod:`.known_hosts`: a key listed as
``@revoked`` is refused on every path (unknown, known, changed), before any credential is offered.
"""

from __future__ import annotations

import errno
import os
import select
import shlex
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import paramiko
from fabric import Config, Connection

from orchestrator.errors import (
    AuthenticationError,
    CancelledError,
    ConnectError,
    HostKeyChangedError,
    HostKeyRevokedError,
    HostKeyUnknownError,
    TransferError,
    UnreachableError,
)
from orchestrator.platforms import Platform
from orchestrator.transports.base import Deadline, LineSplitter, OnLine, Result, Transport, log
from orchestrator.transports.known_hosts import (
    KnownHosts,
    Revocation,
    compare_command,
    fingerprint,
    host_key_file,
    lookup_name,
)
from orchestrator.transports.options import SSHOptions

__all__ = ["SSHTransport", "fingerprint"]

#: one lock for every writer of a known_hosts file in this process (nodes connect in parallel)
_KNOWN_HOSTS_LOCK = threading.Lock()


def revoked_error(node: str, name: str, key: paramiko.PKey, revoked: Revocation) -> HostKeyRevokedError:
    """The one message for a revoked host key, whichever path met it."""
    key_type = key.get_name()
    public = host_key_file(key_type)
    replace = (
        f"delete {public.removesuffix('.pub')} and {public} there and run `sudo ssh-keygen -A`"
        if public
        else "generate a new one there"
    )
    return HostKeyRevokedError(
        f"HOST KEY REVOKED: {name} offered the {key_type} key {fingerprint(key)}, which "
        f"{revoked.where} lists as @revoked; refusing to connect (--accept-new-host-keys never "
        "accepts a revoked key)",
        node=node,
        hint=f"the node needs a new {key_type} host key: {replace}, compare the new fingerprint "
        f"and record it with --accept-new-host-keys; if the revocation is a mistake, delete line "
        f"{revoked.line} of {revoked.path}",
    )


def _auth_failed(exc: BaseException) -> bool:
    """The server refused every credential offered (or none could be offered)."""
    return isinstance(exc, paramiko.AuthenticationException) or "No authentication methods" in str(exc)


def _limit_unacknowledged(sock: object, seconds: float) -> None:
    # paramiko's keepalives expect no answer: a node that vanished (power cut, cable, `ip link set
    # down`) would leave a command waiting for minutes (70-100 s with 15 s keepalives: issue 17).
    # TCP_USER_TIMEOUT makes the kernel drop the connection when sent data (keepalives, heartbeats)
    # stays unacknowledged this long.
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is not None and isinstance(sock, socket.socket):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, option, int(seconds * 1000))
        except OSError:
            pass


class _VerifyingPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]  # paramiko is untyped
    """Unknown key: refused when revoked (always); else refused with its fingerprint, or recorded when
    the user asked for that."""

    def __init__(
        self, node: str, known_hosts: Path, trust: KnownHosts, accept_new: bool, recorded: list[str]
    ) -> None:
        self.node = node
        self.known_hosts = known_hosts
        self.trust = trust
        self.accept_new = accept_new
        self.recorded = recorded  # shared by every hop and attempt of one transport

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        revoked = self.trust.revocation(hostname, key)
        if revoked is not None:  # first: no flag turns a revoked key into a new one
            raise revoked_error(self.node, hostname, key, revoked)
        fp = fingerprint(key)
        if not self.accept_new:
            raise HostKeyUnknownError(
                f"unknown {key.get_name()} host key for {hostname}, fingerprint {fp}; "
                f"it is not in {self.known_hosts}",
                node=self.node,
                hint=f"compare it with {compare_command(key.get_name())} run on the node (the "
                f"{key.get_name()} key it offered), then rerun with --accept-new-host-keys to record it",
                fingerprint=fp,
                host=hostname,
                key_type=key.get_name(),
                known_hosts=str(self.known_hosts),
            )
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _KNOWN_HOSTS_LOCK:
            self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self.known_hosts.open("a", encoding="utf-8") as fh:
                fh.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.recorded.append(f"{hostname} {key.get_name()} {fp}")


class SSHTransport(Transport):
    kind = "ssh"

    #: after the exit status arrives, how long to wait for the output stream to end (sshd reports
    #: the exit before it has drained the pipe; a background child may hold it open forever)
    EOF_GRACE = 2.0

    #: SSH window of a command's channel: the most output that can be on its way from the node's
    #: sshd to here. A rank printing faster than this terminal takes it waits on it, so at full speed
    #: a line waits about window / throughput: paramiko's 2 MiB made that half a second at 4 MB/s per
    #: node (benchmarks/logs.py); 64 KiB keeps it under 100 ms, and still allows 32 MB/s per node at a
    #: 2 ms round trip. Files go over SFTP, on their own channel with the default window.
    COMMAND_WINDOW = 64 * 1024

    #: seconds between the bytes written to a running command's stdin: the node stops the command
    #: after three missed ones (PosixShell.stop_on_hangup), so a controller cut off by the network
    #: leaves nothing running unseen for more than 15 s
    HEARTBEAT = 5.0

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
        self._trusts: dict[str, KnownHosts] = {}  # known_hosts as read for each hop (lookup name)
        self._closed = False  # sticky: a closed (cancelled) transport never reconnects
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
        policy = _VerifyingPolicy(
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

    def connect(self) -> None:
        with self._lock:
            if self._closed:
                raise self._cancelled()
            if self.conn.is_connected:
                return
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
            except ConnectError:
                self._abort()
                raise
            except Exception as exc:
                self._abort()
                if self._closed:
                    raise self._cancelled() from None
                raise self._explain(exc) from None
            if self._closed:  # cancelled while the handshake ran
                self._abort()
                raise self._cancelled()
            self._refuse_revoked()
            transport = self.conn.client.get_transport()
            assert transport is not None
            log.info("%s: connected: %s", self.node_name, self.describe())
            transport.set_keepalive(self.options.keepalive)
            _limit_unacknowledged(transport.sock, 3 * self.options.keepalive)

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
                    hint="start the SSH server on the node (`sudo systemctl enable --now ssh`) "
                    "or set the node's port:",
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
        if isinstance(exc, paramiko.SSHException):
            return UnreachableError(f"SSH handshake with {where} failed: {exc}", node=self.node_name)
        if isinstance(exc, OSError):
            return UnreachableError(f"cannot connect to {where}: {exc}", node=self.node_name)
        return UnreachableError(
            f"cannot connect to {where}: {type(exc).__name__}: {exc}", node=self.node_name
        )

    # -- commands -----------------------------------------------------------------------------

    def plan(self, script: str) -> str:
        return self.platform.stop_on_hangup(script, heartbeat=self.HEARTBEAT)

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
        transport = self.conn.client.get_transport()
        if self._closed:
            raise self._cancelled()
        if transport is None or not transport.is_active():
            raise UnreachableError(f"the SSH connection to {self.conn.host} was lost", node=self.node_name)
        try:
            chan = transport.open_session(timeout=self.connect_timeout, window_size=self.COMMAND_WINDOW)
            # stdin stays open: closing it is how a timeout or a cancel stops the remote command
            chan.exec_command(self.platform.login_command(self.plan(script)))
        except paramiko.SSHException as exc:
            if self._closed:
                raise self._cancelled() from None
            raise UnreachableError(f"cannot start a command over SSH: {exc}", node=self.node_name) from exc
        out = LineSplitter("stdout", on_line, keep_lines)
        err = LineSplitter("stderr", on_line, keep_lines)
        timed_out = False
        grace: Deadline | None = None
        beat = time.monotonic() + self.HEARTBEAT
        try:
            while True:
                if time.monotonic() >= beat and not chan.exit_status_ready():
                    # the node's watcher stops the command when these stop coming (a lost controller)
                    chan.sendall(b"\n")
                    beat = time.monotonic() + self.HEARTBEAT
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
            command=script,
            exit_code=exit_code,
            stdout=out.text,
            stderr=err.text,
            duration=deadline.elapsed,
            timed_out=timed_out,
        )

    # -- files --------------------------------------------------------------------------------

    def _sftp_client(self) -> paramiko.SFTPClient:
        self.connect()
        with self._lock:
            if self._sftp is None:
                try:
                    self._sftp = self.conn.client.open_sftp()
                except (EOFError, OSError, paramiko.SSHException) as exc:
                    if self._closed:  # cancelled (fail fast, Ctrl-C) while the channel opened
                        raise self._cancelled() from None
                    raise TransferError(
                        f"cannot start SFTP: {exc or type(exc).__name__}", node=self.node_name
                    ) from exc
            return self._sftp

    def _makedirs(self, sftp: paramiko.SFTPClient, directory: str) -> None:
        if directory in ("", ".", "/"):
            return
        try:
            if stat.S_ISDIR(sftp.stat(directory).st_mode or 0):
                return
        except FileNotFoundError:
            pass
        self._makedirs(sftp, str(PurePosixPath(directory).parent))
        try:
            sftp.mkdir(directory)
        except OSError:
            # SFTP reports EEXIST as a bare "Failure": another node sharing this file system (an
            # NFS home) may have made it since our stat; only a directory that is still missing fails
            if not stat.S_ISDIR(sftp.stat(directory).st_mode or 0):
                raise

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        sftp = self._sftp_client()
        path = self.platform.transfer_path(remote)
        try:
            self._makedirs(sftp, str(PurePosixPath(path).parent))
            sent = 0
            with local.open("rb") as source, sftp.open(path, "wb") as target:
                if mode is not None:
                    # before the first byte: opened "wb", the file is empty now, so its content is
                    # never readable under the server's default mode (0644 with umask 022)
                    target.chmod(mode)
                target.set_pipelined(True)
                while block := source.read(32768):
                    target.write(block)
                    sent += len(block)
            size = sftp.stat(path).st_size
            if size != sent:
                raise OSError(f"{path} holds {size} bytes after sending {sent}")
        except (EOFError, OSError, paramiko.SSHException) as exc:
            if self._closed:
                raise self._cancelled() from None
            raise TransferError(f"cannot copy {local} to {remote}: {exc}", node=self.node_name) from exc

    def get(self, remote: str, local: Path) -> None:
        sftp = self._sftp_client()
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
            sftp.get(self.platform.transfer_path(remote), str(local))
        except (EOFError, OSError, paramiko.SSHException) as exc:
            if self._closed:
                raise self._cancelled() from None
            raise TransferError(f"cannot copy {remote} to {local}: {exc}", node=self.node_name) from exc

    def close(self) -> None:
        """Close for good (also from another thread, mid-handshake: cancellation relies on it)."""
        self._closed = True
        sftp, self._sftp = self._sftp, None
        if sftp is not None:
            sftp.close()
        self._abort()
