"""Code sync over real SSH/SFTP keeps private files private on every node (security review item 6).

A tracked ``.env`` at 0600 used to land 0644 on every node, readable by every local user there; the
bundle carrying it was uploaded with the SFTP server's default mode too. The namespace hosts share
this machine's file system, so what a node holds (and what an upload looks like while it arrives)
is read directly.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.transports import SSHTransport
from tests.cluster import NamespaceCluster
from tests.conftest import connected_root_transport
from tests.integration.test_code_sync import Harness, _project


def _mode(path: Path) -> int:
    return path.lstat().st_mode & 0o7777


class _Watcher:
    """Samples files matching a name prefix in some directories until stopped; keeps every sighting of
    one holding bytes while group or others could read it."""

    def __init__(self, directories: list[Path], prefix: str) -> None:
        self.directories = directories
        self.prefix = prefix
        self.exposed: list[tuple[str, int, int]] = []  # (path, mode, size)
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            for directory in self.directories:
                try:
                    entries = list(os.scandir(directory))
                except OSError:
                    continue
                for entry in entries:
                    if not entry.name.startswith(self.prefix):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    self.seen.add(entry.path)
                    if st.st_size and st.st_mode & 0o077 and len(self.exposed) < 20:
                        self.exposed.append((entry.path, stat.S_IMODE(st.st_mode), st.st_size))


def test_private_files_keep_their_privacy_on_every_node(
    cluster: NamespaceCluster, ctl_home: Path, tmp_path: Path
) -> None:
    source = _project(tmp_path, git=True)
    (source / ".env").write_text("API_TOKEN=s3cret\n")
    (source / "config.yaml").write_text("lr: 0.1\n")
    (source / "tool.sh").write_text("#!/bin/sh\n")
    (source / "keys").mkdir()
    (source / "keys" / "deploy.pem").write_text("PRIVATE KEY\n")
    os.chmod(source / ".env", 0o600)
    os.chmod(source / "config.yaml", 0o640)
    os.chmod(source / "tool.sh", 0o750)
    os.chmod(source / "keys" / "deploy.pem", 0o644)
    os.chmod(source / "keys", 0o700)  # nobody else can read what is inside, here
    h = Harness(cluster, ctl_home, tmp_path, source)
    h.ok()
    expected = {
        ".env": 0o600,
        "config.yaml": 0o640,
        "tool.sh": 0o750,
        "keys/deploy.pem": 0o600,
        "run.sh": 0o755,  # as before: the executable bit travels
        "train.py": 0o644,
    }
    for host in cluster.hosts:
        dest = h.dest(host.name)
        assert {rel: _mode(dest / rel) for rel in expected} == expected, host.name
        assert (dest / ".env").read_text() == "API_TOKEN=s3cret\n"

    # someone widened .env on the nodes, and train.py became private here: both are changes
    for host in cluster.hosts:
        os.chmod(h.dest(host.name) / ".env", 0o644)
    os.chmod(source / "train.py", 0o600)
    results = h.ok()
    for host in cluster.hosts:
        assert sorted(results[host.name].changed) == [".env", "train.py"], results[host.name]
        dest = h.dest(host.name)
        assert _mode(dest / ".env") == 0o600 and _mode(dest / "train.py") == 0o600
    assert all(r.unchanged for r in h.ok().values())


def test_the_bundle_is_never_readable_by_others_while_it_arrives(
    cluster: NamespaceCluster, ctl_home: Path, tmp_path: Path
) -> None:
    source = _project(tmp_path, git=False)
    (source / "weights.key").write_bytes(os.urandom(8 << 20))  # long enough to watch it arrive
    os.chmod(source / "weights.key", 0o600)
    h = Harness(cluster, ctl_home, tmp_path, source)
    dests = [h.dest(host.name) for host in cluster.hosts]
    with _Watcher(dests, ".bootstrap-code-upload-") as watcher:
        h.ok()
    assert watcher.seen, "the upload was never seen: the test proves nothing"
    assert watcher.exposed == []
    for dest in dests:
        assert _mode(dest / "weights.key") == 0o600


@pytest.fixture
def transport(cluster: NamespaceCluster, ctl_home: Path) -> Iterator[SSHTransport]:
    with connected_root_transport(cluster, ctl_home) as t:
        yield t


def test_a_private_upload_has_its_mode_before_its_first_byte(transport: SSHTransport, tmp_path: Path) -> None:
    src = tmp_path / "secret.bin"
    src.write_bytes(os.urandom(8 << 20))
    target_dir = tmp_path / "uploads"
    target_dir.mkdir()
    target = target_dir / "secret.bin"
    target.write_bytes(b"old content, world-readable")  # an earlier copy: replaced, not kept readable
    target.chmod(0o644)
    with _Watcher([target_dir], "secret.bin") as watcher:
        transport.put(src, str(target), mode=0o600)
    assert watcher.seen
    # only the old content may be seen readable (before the put truncates it), never the new bytes
    assert [e for e in watcher.exposed if e[2] != len(b"old content, world-readable")] == []
    assert _mode(target) == 0o600 and target.read_bytes() == src.read_bytes()
