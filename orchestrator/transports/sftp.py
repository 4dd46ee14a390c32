"""Files over SFTP (paramiko's client), for the SSH transport: whole files or none, on either side.

An upload is written beside its target under a name of its own, then renamed over it: a reader never
sees half a file, and nodes that share the directory (an NFS home) each put a whole one there. A
download is written to ``<local>.part`` (owner-only, never through a link) and renamed once whole.
Errors are raised as they come (``OSError``, ``EOFError``, ``paramiko.SSHException``); the
transport names the node and the file.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path, PurePosixPath

import paramiko

from orchestrator import safefiles

__all__ = ["download", "makedirs", "upload"]

_ERRORS = (EOFError, OSError, paramiko.SSHException)


def makedirs(sftp: paramiko.SFTPClient, directory: str) -> None:
    """Make ``directory`` and every missing parent, over SFTP."""
    if directory in ("", ".", "/"):
        return
    try:
        if stat.S_ISDIR(sftp.stat(directory).st_mode or 0):
            return
    except FileNotFoundError:
        pass
    makedirs(sftp, str(PurePosixPath(directory).parent))
    try:
        sftp.mkdir(directory)
    except OSError:
        # SFTP reports EEXIST as a bare "Failure": another node sharing this file system (an
        # NFS home) may have made it since our stat; only a directory that is still missing fails
        if not stat.S_ISDIR(sftp.stat(directory).st_mode or 0):
            raise


def upload(sftp: paramiko.SFTPClient, local: Path, path: str, *, mode: int | None) -> None:
    """``local`` to the node's ``path`` (its directories made), with ``mode`` from the first byte."""
    where = PurePosixPath(path)
    # the target's name first: a name the code sync reserves for itself (its upload bundle) stays
    # reserved, so another node scanning a shared code directory meanwhile leaves it alone
    part = str(where.with_name(f"{where.name}.{secrets.token_hex(4)}.part"))
    try:
        makedirs(sftp, str(where.parent))
        sent = 0
        with local.open("rb") as source, sftp.open(part, "wb") as target:
            if mode is not None:
                # before the first byte: opened "wb", the file is empty now, so its content is
                # never readable under the server's default mode (0644 with umask 022)
                target.chmod(mode)
            target.set_pipelined(True)
            while block := source.read(32768):
                target.write(block)
                sent += len(block)
        size = sftp.stat(part).st_size
        if size != sent:
            raise OSError(f"{path} holds {size} bytes after sending {sent}")
        sftp.posix_rename(part, path)
    except _ERRORS:
        try:
            sftp.remove(part)
        except _ERRORS:
            pass  # never written, or the connection is gone: the error being raised says what matters
        raise


def download(sftp: paramiko.SFTPClient, path: str, local: Path) -> None:
    """The node's ``path`` to ``local``: its missing directories made owner-only, the file 0600,
    written to ``local.part`` (never through a link) and renamed once whole (safefiles.replacing)."""
    safefiles.private_dirs(local.parent)
    with safefiles.replacing(local) as fh:
        size = sftp.getfo(path, fh)
        fh.flush()
        held = os.fstat(fh.fileno()).st_size
        if held != size:
            raise OSError(f"{local}.part holds {held} bytes, the node sent {size}")
