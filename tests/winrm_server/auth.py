"""Server side of WinRM authentication: Basic, and NTLM (HTTP ``Negotiate`` carrying raw NTLM tokens,
as Windows accepts them) with WinRM message encryption ([MS-WSMV] 2.2.9.1.1: ``multipart/encrypted``,
``application/HTTP-SPNEGO-session-encrypted``), using pyspnego's NTLM acceptor."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import spnego
from spnego.channel_bindings import GssChannelBindings

BOUNDARY = b"--Encrypted Boundary"
PROTOCOL = b"application/HTTP-SPNEGO-session-encrypted"
ENCRYPTED_CONTENT_TYPE = (
    'multipart/encrypted;protocol="application/HTTP-SPNEGO-session-encrypted";boundary="Encrypted Boundary"'
)

# pyspnego's NTLM acceptor finds passwords only through the NTLM_USER_FILE environment variable (read when
# the context is made and at the Authenticate step): every acceptor call runs under this lock with the
# variable pointing at the calling server's own file, so servers in one process do not see each other's users.
_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _user_file(path: Path) -> Iterator[None]:
    with _ENV_LOCK:
        old = os.environ.get("NTLM_USER_FILE")
        os.environ["NTLM_USER_FILE"] = str(path)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("NTLM_USER_FILE", None)
            else:
                os.environ["NTLM_USER_FILE"] = old


def names_match(given: str, username: str, computer: str) -> bool:
    """Windows compares user names without case; ``.\\bob``, ``COMPUTER\\bob`` and ``bob`` are one user."""
    given = given.lower()
    for prefix in (".\\", computer.lower() + "\\"):
        if given.startswith(prefix):
            given = given[len(prefix) :]
    return given == username.lower()


def check_basic(header: str, username: str, password: str, computer: str) -> str | None:
    """The user name when ``Authorization: Basic ...`` carries the right credentials, else None."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, pw = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    if not sep or not names_match(user, username, computer) or pw != password:
        return None
    return user


class NtlmAcceptor:
    """The credentials an NTLM server accepts (a per-server NTLM_USER_FILE)."""

    def __init__(self, username: str, password: str, computer: str) -> None:
        if ":" in username or ":" in password or "\n" in username + password:
            raise ValueError("NTLM test credentials must not contain ':' or newlines (NTLM_USER_FILE format)")
        fd, name = tempfile.mkstemp(prefix="winrm-ntlm-", suffix=".txt")
        self.path = Path(name)
        lines = [f":{username}:{password}", f"{computer}:{username}:{password}", f".:{username}:{password}"]
        with os.fdopen(fd, "w") as fh:
            fh.write("\n".join(lines) + "\n")

    def close(self) -> None:
        self.path.unlink(missing_ok=True)

    def new_context(self, cert_der: bytes | None) -> Any:
        bindings = None
        if cert_der is not None:  # tls-server-end-point channel binding (RFC 5929), as requests-ntlm sends
            bindings = GssChannelBindings(
                application_data=b"tls-server-end-point:" + hashlib.sha256(cert_der).digest()
            )
        with _user_file(self.path):
            return spnego.server(protocol="ntlm", channel_bindings=bindings)

    def step(self, context: Any, token: bytes) -> bytes | None:
        with _user_file(self.path):
            out: bytes | None = context.step(token)
            return out


def decrypt(context: Any, body: bytes) -> bytes:
    """The SOAP message inside an encrypted request body; ValueError when it is not well formed."""
    header_end = body.find(b"\tContent-Type: application/octet-stream\r\n")
    if not body.startswith(BOUNDARY + b"\r\n") or header_end < 0:
        raise ValueError("not a multipart/encrypted WinRM body")
    header = body[:header_end]
    if PROTOCOL not in header or b"Length=" not in header:
        raise ValueError("encrypted body without the SPNEGO protocol or Length")
    length = int(header.split(b"Length=")[1].split(b"\r\n")[0])
    payload = body[header_end + len(b"\tContent-Type: application/octet-stream\r\n") :]
    end = payload.rfind(BOUNDARY + b"--\r\n")
    if end >= 0:
        payload = payload[:end]
    sig_len = struct.unpack("<I", payload[:4])[0]
    signature, sealed = payload[4 : 4 + sig_len], payload[4 + sig_len :]
    message: bytes = context.unwrap(signature + sealed).data
    if len(message) != length:
        raise ValueError(f"decrypted length {len(message)} != OriginalContent Length {length}")
    return message


def encrypt(context: Any, message: bytes) -> bytes:
    wrapped: bytes = context.wrap(message, encrypt=True).data
    signature, sealed = wrapped[:16], wrapped[16:]
    return (
        BOUNDARY + b"\r\n"
        b"\tContent-Type: " + PROTOCOL + b"\r\n"
        b"\tOriginalContent: type=application/soap+xml;charset=UTF-8;Length="
        + str(len(message)).encode()
        + b"\r\n"
        + BOUNDARY
        + b"\r\n"
        b"\tContent-Type: application/octet-stream\r\n"
        + struct.pack("<I", len(signature))
        + signature
        + sealed
        + BOUNDARY
        + b"--\r\n"
    )
