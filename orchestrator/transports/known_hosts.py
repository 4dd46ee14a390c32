"""known_hosts files as OpenSSH reads them, for the SSH transport: host keys and their revocations.

One reader for every line of a file, markers included, so a line cannot be dropped by accident:

- plain and hashed (``|1|salt|hash``) entries are the trusted keys;
- ``@revoked`` lines are keys that are refused always: for a host their host field matches (plain
  names, ``*``/``?`` wildcards, ``!`` negations, hashed names, ``[host]:port``, as OpenSSH matches
  them), whatever else known_hosts says and even with ``--accept-new-host-keys``;
- ``@cert-authority`` lines are kept aside: host certificates are not supported, so such hosts
  count as unknown.

paramiko reads none of the markers (its ``HostKeys.load`` would even take a revoked key for a
trusted one), so the transport asks :meth:`KnownHosts.revocation` first and hands paramiko only
:meth:`KnownHosts.trusted_for` a host, never the raw entries; a key paramiko does not know goes to
:class:`VerifyingPolicy`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from orchestrator.errors import ConnectError, HostKeyRevokedError, HostKeyUnknownError

REVOKED = "@revoked"
CERT_AUTHORITY = "@cert-authority"

#: where sshd keeps the public host key of each type (Debian, Fedora, Arch, macOS, BSDs)
_HOST_KEY_FILES = {
    "ssh-ed25519": "/etc/ssh/ssh_host_ed25519_key.pub",
    "ecdsa-sha2-nistp256": "/etc/ssh/ssh_host_ecdsa_key.pub",
    "ecdsa-sha2-nistp384": "/etc/ssh/ssh_host_ecdsa_key.pub",
    "ecdsa-sha2-nistp521": "/etc/ssh/ssh_host_ecdsa_key.pub",
    "ssh-rsa": "/etc/ssh/ssh_host_rsa_key.pub",
    "ssh-dss": "/etc/ssh/ssh_host_dsa_key.pub",
}


def fingerprint(key: paramiko.PKey) -> str:
    """``SHA256:...`` exactly as ``ssh-keygen -lf`` and OpenSSH's prompts show it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def host_key_file(key_type: str) -> str | None:
    """Where sshd usually keeps its public host key of ``key_type`` (None: a type we cannot place)."""
    return _HOST_KEY_FILES.get(key_type)


def compare_command(key_type: str) -> str:
    """How to show, on the node, the fingerprint of its host key of ``key_type`` (the type the node
    offered: ``ssh-ed25519``, ``ecdsa-sha2-nistp256``, ``ssh-rsa``...)."""
    path = host_key_file(key_type)
    if path is None:
        return f"`ssh-keygen -lf` on the node's {key_type} host key (a HostKey in /etc/ssh/sshd_config)"
    return f"`ssh-keygen -lf {path}`"


def how_to_compare(key_types: Iterable[str]) -> str:
    """What to do about host keys seen for the first time, of ``key_types`` (the types the nodes
    offered): the command that shows each on its node (:func:`compare_command`), then the option that
    records them."""
    commands = {kind: compare_command(kind) for kind in key_types}
    how = " or ".join(f"{command} (for {kind})" for kind, command in sorted(commands.items()))
    return (
        f"Compare each fingerprint with {how} run on that node, "
        "then rerun with --accept-new-host-keys to record them."
    )


def lookup_name(host: str, port: int | None) -> str:
    """The name known_hosts records a host under: ``host``, or ``[host]:port`` off port 22."""
    return host if port in (None, 22) else f"[{host}]:{port}"


@dataclass(frozen=True)
class Revocation:
    """One ``@revoked`` line."""

    hosts: str  # the host field, as written
    key: paramiko.PKey
    path: Path
    line: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class _Entry:
    entry: paramiko.hostkeys.HostKeyEntry
    hosts: str
    where: str


def _wildcard(pattern: str) -> re.Pattern[str]:
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.DOTALL)


def host_matches(hosts: str, name: str) -> bool:
    """Does a known_hosts host field cover ``name`` (OpenSSH's rules: a hashed name, or a comma list
    of patterns where one negated match excludes the host; names compare case-insensitively)."""
    name = name.lower()
    if hosts.startswith("|1|"):
        try:
            return bool(paramiko.HostKeys.hash_host(name, hosts) == hosts)
        except (AssertionError, binascii.Error, ValueError, IndexError):
            return False  # a malformed hash matches nothing
    matched = False
    for pattern in hosts.lower().split(","):
        negated = pattern.startswith("!")
        if _wildcard(pattern[1:] if negated else pattern).fullmatch(name):
            if negated:
                return False
            matched = True
    return matched


@dataclass
class KnownHosts:
    """Every usable line of some known_hosts files, by kind."""

    entries: list[_Entry] = field(default_factory=list)
    revocations: list[Revocation] = field(default_factory=list)
    authorities: list[str] = field(default_factory=list)  # file:line of @cert-authority lines

    @classmethod
    def load(cls, paths: list[Path], *, node: str) -> KnownHosts:
        """Read ``paths`` (missing files are skipped); ConnectError naming file:line for a line that
        cannot be read (a revocation silently ignored would be worse than no connection)."""
        known = cls()
        for path in paths:
            try:
                st = path.stat()
            except OSError:
                continue  # missing (or unreadable: _read would say so, as before)
            if not path.is_file():
                continue
            # every node's transport reads the same files: each is parsed once per version of it
            # (parsing a key costs ~0.1 ms; 64 nodes asked 4,096 of them per command)
            version = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            with _PARSED_LOCK:
                parsed = _PARSED.get(version)
            if parsed is None:
                parsed = cls()
                parsed._read(path, node)
                with _PARSED_LOCK:
                    _PARSED[version] = parsed
            known.entries.extend(parsed.entries)
            known.revocations.extend(parsed.revocations)
            known.authorities.extend(parsed.authorities)
        return known

    def _read(self, path: Path, node: str) -> None:
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError as exc:
            raise ConnectError(f"cannot read known_hosts {path}: {exc.strerror}", node=node) from None
        for number, line in enumerate(lines, 1):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            marker = words[0] if words[0].startswith("@") else None
            if marker is not None:
                words = words[1:]
            if marker == CERT_AUTHORITY:
                self.authorities.append(f"{path}:{number}")
                continue
            if marker not in (None, REVOKED):
                raise ConnectError(
                    f"{path}:{number}: unknown known_hosts marker {marker!r}",
                    node=node,
                    hint="OpenSSH knows @revoked and @cert-authority only: fix or delete that line",
                )
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(" ".join(words), number)
            except (paramiko.SSHException, ValueError, TypeError) as exc:
                raise ConnectError(
                    f"{path}:{number}: unreadable known_hosts entry ({exc})",
                    node=node,
                    hint="fix or delete that line (ssh-keygen -R HOST removes a host's lines)",
                ) from None
            if entry is None:  # a key type paramiko cannot use: no server can make us accept it
                continue
            if marker == REVOKED:
                self.revocations.append(Revocation(words[0], entry.key, path, number))
            else:
                self.entries.append(_Entry(entry, words[0], f"{path}:{number}"))

    def revocation(self, name: str, key: paramiko.PKey) -> Revocation | None:
        """The ``@revoked`` line refusing ``key`` for host ``name`` (see :func:`lookup_name`), if any."""
        blob = key.asbytes()
        for revoked in self.revocations:
            if revoked.key.asbytes() == blob and host_matches(revoked.hosts, name):
                return revoked
        return None

    def trusted_for(self, name: str) -> list[paramiko.hostkeys.HostKeyEntry]:
        """Every entry except those whose key is revoked for ``name``: a revoked key listed as known
        too is refused, not trusted (OpenSSH does the same)."""
        # copies: paramiko updates the entries of a client's HostKeys in place (one per connection)
        return [
            paramiko.hostkeys.HostKeyEntry(list(e.entry.hostnames), e.entry.key)
            for e in self.entries
            if self.revocation(name, e.entry.key) is None
        ]


#: parsed known_hosts files by (path, inode, size, mtime, ctime): read-only once parsed
_PARSED: dict[tuple[str, int, int, int, int], KnownHosts] = {}
_PARSED_LOCK = threading.Lock()


# -- the policy paramiko asks about keys it does not know ------------------------------------------

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


class VerifyingPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]  # paramiko is untyped
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
