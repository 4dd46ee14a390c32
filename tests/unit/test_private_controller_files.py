"""What the controller keeps of a run (issue 27, finding 6) is this user's alone: directories under
``runs/`` and the state directory are created 0700, files 0600, whatever the umask, and a download
never writes through a link planted where its ``.part`` goes."""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import safefiles
from orchestrator.platforms import PosixShell
from orchestrator.runs.layout import write_record
from orchestrator.transports import sftp
from orchestrator.transports.local import LocalTransport


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    """The most permissive umask: modes are the product's own, not the environment's."""
    old = os.umask(0)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


class _FakeSFTP:
    """paramiko's SFTPClient as download uses it: getfo writes the remote bytes into a file."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def getfo(self, path: str, fh: io.BufferedWriter) -> int:
        fh.write(self.data)
        return len(self.data)


def _planted(tmp_path: Path, local: Path) -> Path:
    """A file of someone else's, and a link to it where the download's .part goes."""
    victim = tmp_path / "victim"
    victim.write_text("not yours\n")
    safefiles.private_dirs(local.parent)  # (a parent others could write to is refused: its own test)
    os.symlink(victim, local.with_name(local.name + ".part"))
    return victim


def test_a_fetched_file_and_its_directories_are_private(tmp_path: Path) -> None:
    local = tmp_path / "runs" / "r1" / "node1" / "launch.sh"
    sftp.download(_FakeSFTP(b"export MY_TOKEN=secret\n"), "launch.sh", local)  # type: ignore[arg-type]
    assert local.read_bytes() == b"export MY_TOKEN=secret\n"
    assert _mode(local) == 0o600
    for directory in (tmp_path / "runs", tmp_path / "runs" / "r1", local.parent):
        assert _mode(directory) == 0o700, directory


def test_a_download_never_writes_through_a_planted_part(tmp_path: Path) -> None:
    local = tmp_path / "here" / "launch.sh"
    victim = _planted(tmp_path, local)
    sftp.download(_FakeSFTP(b"new\n"), "launch.sh", local)  # type: ignore[arg-type]
    assert victim.read_text() == "not yours\n"
    assert local.read_bytes() == b"new\n" and not local.is_symlink()
    assert not local.with_name("launch.sh.part").exists()


def test_the_local_transport_copies_back_the_same_way(tmp_path: Path) -> None:
    source = tmp_path / "source.txt"
    source.write_text("data\n")
    local = tmp_path / "runs" / "r1" / "local" / "source.txt"
    victim = _planted(tmp_path, local)
    LocalTransport("local", PosixShell()).get(str(source), local)
    assert victim.read_text() == "not yours\n"
    assert local.read_text() == "data\n" and _mode(local) == 0o600


def test_the_run_record_is_private_and_never_written_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("not yours\n")
    write_record(tmp_path / "runs" / "r1", "r1", [], detached=False)
    assert _mode(tmp_path / "runs" / "r1" / "run.json") == 0o600
    assert _mode(tmp_path / "runs") == _mode(tmp_path / "runs" / "r1") == 0o700
    os.symlink(victim, tmp_path / "runs" / "r1" / "run.json.part")
    write_record(tmp_path / "runs" / "r1", "r1", [], detached=True)
    assert victim.read_text() == "not yours\n"
    assert '"detached": true' in (tmp_path / "runs" / "r1" / "run.json").read_text()


def test_private_dirs_creates_every_missing_parent_owner_only(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir(mode=0o755)
    safefiles.private_dirs(tmp_path / "a" / "b" / "c")
    assert _mode(tmp_path / "a") == 0o755  # there already: left as it was
    assert _mode(tmp_path / "a" / "b") == _mode(tmp_path / "a" / "b" / "c") == 0o700
