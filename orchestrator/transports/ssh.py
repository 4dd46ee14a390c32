"""``connection: ssh``: Linux nodes through fabric (ssh config, gateways) and paramiko channels.

Host keys are verified. fabric 3 installs ``AutoAddPolicy`` on every ``Connection`` (its gateways
included), which accepts any key silently; we replace that policy on each hop before it connects and
load known_hosts ourselves (fabric never does).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import select
import socket
import stat
import threading
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import paramiko
from fabric import Config, Connection

from orchestrator.errors import (
    AuthenticationError,
    ConnectError,
    HostKeyChangedError,
    HostKeyUnknownError,
    TransferError,
    UnreachableError,
)
from orchestrator.platforms import Platform
from orchestrator.transports.base import Deadline, LineSplitter, OnLine, Result, Transport
from orchestrator.transports.options import SSHOptions

#: one lock for every writer of a known_hosts file in this process (nodes connect in parallel)
_KNOWN_HOSTS_LOCK = threading.Lock()


def fingerprint(key: paramiko.PKey) -> str:
    """``SHA256:...`` exactly as ``ssh-keygen -lf`` and OpenSSH's prompts show it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _VerifyingPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]  # paramiko is untyped
    """Unknown key: refuse with its fingerprint, or record it when the user asked for that."""

    def __init__(self, node: str, known_hosts: Path, accept_new: bool) -> None:
        self.node = node
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.recorded: list[str] = []

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        fp = fingerprint(key)
        if not self.accept_new:
            raise HostKeyUnknownError(
                f"unknown {key.get_name()} host key for {hostname}, fingerprint {fp}; "
                f"it is not in {self.known_hosts}",
                node=self.node,
                hint="compare it with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` run on the node, "
                "then rerun with --accept-new-host-keys to record it",
                fingerprint=fp,
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
        self._closed = False
        config = Config(runtime_ssh_path=str(options.ssh_config)) if options.ssh_config else Config()
        connect_kwargs: dict[str, Any] = {}
        if key_file:
            connect_kwargs["key_filename"] = [os.path.expanduser(key_file)]
        if identities_only:  # prove that this one key works: no agent, no ~/.ssh/id_* guessing
            connect_kwargs.update(allow_agent=False, look_for_keys=False)
        self.conn = Connection(
            host,
            user=user,
            port=port,
            config=config,
            connect_timeout=int(options.connect_timeout),
            connect_kwargs=connect_kwargs,
        )

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

    def _secure(self, conn: Connection) -> _VerifyingPolicy:
        """Replace fabric's AutoAddPolicy on ``conn`` and every gateway hop before any of them opens."""
        known_hosts = self._known_hosts_path(conn)
        client = conn.client
        system = Path("/etc/ssh/ssh_known_hosts")
        if system.is_file():
            client.load_system_host_keys(str(system))
        if known_hosts.is_file():
            client.load_host_keys(str(known_hosts))
        policy = _VerifyingPolicy(self.node_name, known_hosts, self.options.accept_new_host_keys)
        client.set_missing_host_key_policy(policy)
        if isinstance(conn.gateway, Connection):
            self._secure(conn.gateway)
        return policy

    def connect(self) -> None:
        with self._lock:
            if self.conn.is_connected:
                return
            self._closed = False
            policy = self._secure(self.conn)
            password = self._password()
            if password is not None:
                self.conn.connect_kwargs["password"] = password
            try:
                self.conn.open()
            except ConnectError:
                self.conn.close()
                raise
            except Exception as exc:
                self.conn.close()
                raise self._explain(exc) from None
            finally:
                # the secret is needed only for the handshake; never keep it on a long-lived object
                self.conn.connect_kwargs.pop("password", None)
            self.recorded_host_keys = policy.recorded
            transport = self.conn.client.get_transport()
            assert transport is not None
            transport.set_keepalive(self.options.keepalive)

    def _explain(self, exc: BaseException) -> ConnectError:
        """One clear message per way SSH connection setup fails."""
        host, port, user = self.conn.host, self.conn.port, self.conn.user
        where = f"{host}:{port}"
        if isinstance(exc, paramiko.BadHostKeyException):
            return HostKeyChangedError(
                f"HOST KEY CHANGED for {exc.hostname}: known_hosts has {fingerprint(exc.expected_key)}, "
                f"the node offered {exc.key.get_name()} {fingerprint(exc.key)}. Someone may be "
                "intercepting the connection, or the node was reinstalled; refusing to connect",
                node=self.node_name,
                hint=f"if the node was reinstalled, remove the old key with "
                f"`ssh-keygen -R {exc.hostname if port == 22 else f'[{host}]:{port}'} "
                f"-f {self._known_hosts_path(self.conn)}` and rerun with --accept-new-host-keys",
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
                f"connection to {where} timed out after {self.options.connect_timeout:g}s",
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

    def run_raw(
        self,
        command: str,
        *,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        keep_lines: int | None = None,
    ) -> Result:
        self.connect()
        deadline = Deadline(timeout)
        transport = self.conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise UnreachableError("the SSH connection was lost", node=self.node_name)
        try:
            chan = transport.open_session(timeout=self.options.connect_timeout)
            # stdin stays open: closing it is how a timeout or a cancel stops the remote command
            chan.exec_command(self.platform.stop_on_hangup(command))
        except paramiko.SSHException as exc:
            raise UnreachableError(f"cannot start a command over SSH: {exc}", node=self.node_name) from exc
        out = LineSplitter("stdout", on_line, keep_lines)
        err = LineSplitter("stderr", on_line, keep_lines)
        timed_out = False
        try:
            while True:
                while chan.recv_ready():
                    out.feed(chan.recv(65536))
                while chan.recv_stderr_ready():
                    err.feed(chan.recv_stderr(65536))
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break  # exit-status follows all data on the wire: nothing more can arrive
                if chan.closed:
                    break
                if deadline.expired:
                    timed_out = True
                    chan.shutdown_write()  # EOF on stdin: the remote watcher kills the process group
                    break
                if chan.eof_received:
                    # stdout ended but the process has not exited: the pipe stays readable, so
                    # wait on the status event instead of spinning on select.
                    chan.status_event.wait(deadline.remaining(0.5))
                else:
                    select.select([chan], [], [], deadline.remaining(1.0))
        finally:
            out.close()
            err.close()
        exit_code: int | None = None
        if not timed_out and chan.exit_status_ready():
            exit_code = chan.recv_exit_status()
            if exit_code == -1:  # no exit-status message (killed by a signal without exit-signal)
                exit_code = None
        chan.close()
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

    def _sftp_client(self) -> paramiko.SFTPClient:
        self.connect()
        with self._lock:
            if self._sftp is None:
                self._sftp = self.conn.client.open_sftp()
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
        sftp.mkdir(directory)

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        sftp = self._sftp_client()
        path = self.platform.transfer_path(remote)
        try:
            self._makedirs(sftp, str(PurePosixPath(path).parent))
            sftp.put(str(local), path)
            if mode is not None:
                sftp.chmod(path, mode)
        except (OSError, paramiko.SSHException) as exc:
            raise TransferError(f"cannot copy {local} to {remote}: {exc}", node=self.node_name) from exc

    def get(self, remote: str, local: Path) -> None:
        sftp = self._sftp_client()
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
            sftp.get(self.platform.transfer_path(remote), str(local))
        except (OSError, paramiko.SSHException) as exc:
            raise TransferError(f"cannot copy {remote} to {local}: {exc}", node=self.node_name) from exc

    def close(self) -> None:
        self._closed = True
        sftp, self._sftp = self._sftp, None
        if sftp is not None:
            sftp.close()
        self.conn.close()
