"""Files to and from an SSH server without an sftp subsystem (issue 15 item 2).

A one-host namespace cluster whose sshd_config has no ``Subsystem sftp`` line, as on hardened hosts:
paramiko's SFTP is refused there ("Channel closed."). The SSH transport then moves files through the
shell (the platform's upload and download scripts over the exec channel), and says so once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from orchestrator.errors import TransferError
from orchestrator.transports import OnLine, Result, SSHTransport
from tests import netns
from tests.cluster import NamespaceCluster
from tests.conftest import BOOTSTRAP, require_cluster_support, root_transport, write_inventory
from tests.integration.test_code_sync import EXPECTED, Harness, _project
from tests.integration.test_env_sync import make_wheel

MB = 1024 * 1024


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceCluster]:
    """One host whose sshd offers no sftp subsystem."""
    require_cluster_support()
    with NamespaceCluster(1, workdir=tmp_path_factory.mktemp("nosftp"), sftp=False) as cluster:
        yield cluster


@pytest.fixture
def home(bare: NamespaceCluster, tmp_path: Path) -> Path:
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    (ssh / "known_hosts").write_text(bare.known_hosts_text())
    (ssh / "config").write_text("")
    shutil.copyfile(bare.client_key, ssh / "id_ed25519")
    (ssh / "id_ed25519").chmod(0o600)
    return tmp_path / "home"


def _connected(transport: SSHTransport, cluster: NamespaceCluster) -> SSHTransport:
    with netns.inside(cluster.controller_ns):
        transport.connect()
    return transport


@pytest.fixture
def transport(bare: NamespaceCluster, home: Path) -> Iterator[SSHTransport]:
    ssh = home / ".ssh"
    t = _connected(root_transport(bare, bare.hosts[0], ssh / "known_hosts", ssh / "config"), bare)
    yield t
    t.close()


@pytest.fixture
def remote_dir(transport: SSHTransport) -> Iterator[str]:
    path = f"/tmp/cbt-nosftp-{uuid.uuid4().hex}"
    yield path
    transport.run(f"rm -rf {path}")


def test_the_server_really_refuses_sftp(transport: SSHTransport) -> None:
    with pytest.raises(paramiko.SSHException, match="Channel closed"):
        transport.conn.client.open_sftp()


def test_files_round_trip_through_the_shell_with_their_mode_said_once(
    transport: SSHTransport, remote_dir: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orchestrator.transports")
    src = tmp_path / "payload.bin"
    src.write_bytes(bytes(range(256)) * 40 + "naïve\r\n".encode())
    target = f'{remote_dir}/deep/it\'s a "file" $HOME.bin'
    transport.put(src, target, mode=0o640)
    transport.put(src, f"{remote_dir}/private.bin", mode=0o600)
    transport.put(src, f"{remote_dir}/plain.bin")
    transport.get(target, tmp_path / "back" / "payload.bin")

    assert (tmp_path / "back" / "payload.bin").read_bytes() == src.read_bytes()
    assert Path(target).read_bytes() == src.read_bytes()  # the namespace host shares this file system
    assert Path(target).stat().st_mode & 0o777 == 0o640
    assert Path(f"{remote_dir}/private.bin").stat().st_mode & 0o777 == 0o600
    assert Path(f"{remote_dir}/plain.bin").stat().st_mode & 0o777 == 0o644  # sshd's umask 022
    assert sorted(os.listdir(remote_dir)) == ["deep", "plain.bin", "private.bin"]  # no leftovers
    assert len(transport.notes) == 1 and "SFTP" in transport.notes[0] and "shell" in transport.notes[0]
    said = [r for r in caplog.records if "SFTP" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO and transport.node_name in said[0].getMessage()


def test_home_relative_paths_land_in_the_users_home(transport: SSHTransport, tmp_path: Path) -> None:
    name = f"cbt-nosftp-{uuid.uuid4().hex}.txt"
    src = tmp_path / "f.txt"
    src.write_text("in home\n")
    try:
        transport.put(src, f"~/{name}")
        assert transport.run(f"cat ~/{name}").stdout == "in home\n"
        transport.get(f"~/{name}", tmp_path / "back.txt")
        assert (tmp_path / "back.txt").read_text() == "in home\n"
    finally:
        transport.run(f"rm -f ~/{name}")


def test_a_file_of_several_megabytes_travels_in_chunks(
    transport: SSHTransport, remote_dir: str, tmp_path: Path
) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(6 * MB + 7))
    transport.put(src, f"{remote_dir}/big.bin", mode=0o600)
    transport.get(f"{remote_dir}/big.bin", tmp_path / "back.bin")
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    assert hashlib.sha256((tmp_path / "back.bin").read_bytes()).hexdigest() == digest
    assert transport.run(f"sha256sum {remote_dir}/big.bin").stdout.split()[0] == digest


class _Corrupting(SSHTransport):
    """Flips one byte of what travels through the shell (a test seam on the real path): in the
    ``nth`` base64 line sent (upload) or ``data`` line received (download)."""

    nth = 2

    def _piped(self, line: str, stdin: Iterator[bytes] | None, on_line: OnLine | None) -> Result:
        def corrupt(text: str) -> str:
            middle = len(text) // 2
            return text[:middle] + ("A" if text[middle] != "A" else "B") + text[middle + 1 :]

        def sent() -> Iterator[bytes]:
            for index, piece in enumerate(stdin or ()):
                yield corrupt(piece.decode()).encode() if index == self.nth else piece

        count = [0]

        def received(stream: str, text: str) -> None:
            if text.startswith("data "):
                count[0] += 1
                if count[0] == self.nth:
                    text = "data " + corrupt(text[5:])
            assert on_line is not None
            on_line(stream, text)  # type: ignore[arg-type]

        return super()._piped(line, sent() if stdin else None, received if on_line else None)


def test_the_sha256_check_catches_corruption_both_ways(
    bare: NamespaceCluster, home: Path, remote_dir: str, tmp_path: Path
) -> None:
    ssh = home / ".ssh"
    plain = root_transport(bare, bare.hosts[0], ssh / "known_hosts", ssh / "config")
    t = _connected(
        _Corrupting(
            plain.node_name,
            plain.platform,
            host=bare.hosts[0].addr,
            port=None,
            user="root",
            key_file=str(bare.client_key),
            password=lambda: None,
            options=plain.options,
            identities_only=True,
        ),
        bare,
    )
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(400_000))
    os.makedirs(remote_dir)
    Path(f"{remote_dir}/model.bin").write_bytes(b"old contents")
    try:
        with pytest.raises(TransferError) as upload:
            t.put(src, f"{remote_dir}/model.bin", mode=0o600)
        shutil.copyfile(src, f"{remote_dir}/good.bin")
        with pytest.raises(TransferError) as download:
            t.get(f"{remote_dir}/good.bin", tmp_path / "back.bin")
    finally:
        t.close()
    assert (
        "SHA-256" in str(upload.value)
        and "node1" in str(upload.value)
        and "nothing was replaced" in str(upload.value)
    )
    assert Path(f"{remote_dir}/model.bin").read_bytes() == b"old contents"
    assert sorted(os.listdir(remote_dir)) == ["good.bin", "model.bin"]  # the temporary file is gone
    assert "SHA-256" in str(download.value) and "was not written" in str(download.value)
    assert not (tmp_path / "back.bin").exists() and not (tmp_path / "back.bin.part").exists()


def test_a_missing_remote_file_is_named(transport: SSHTransport, tmp_path: Path) -> None:
    with pytest.raises(TransferError, match=r"node 'node1'.*cbt-nosftp-nope.*(no such file|not readable)"):
        transport.get("/tmp/cbt-nosftp-nope/x.bin", tmp_path / "x.bin")
    assert not (tmp_path / "x.bin").exists() and not (tmp_path / "x.bin.part").exists()


def test_code_sync_works_without_sftp(bare: NamespaceCluster, home: Path, tmp_path: Path) -> None:
    harness = Harness(bare, home, tmp_path, _project(tmp_path, git=False))
    result = harness.ok()["node1"]
    dest = harness.dest("node1")
    assert sorted(result.added) == sorted(EXPECTED)
    assert (dest / "pkg" / "model.py").read_text() == "WIDTH = 3\n"
    assert (dest / "run.sh").stat().st_mode & 0o777 == 0o755
    assert not list(dest.glob(".bootstrap-code-upload-*"))


def test_offline_env_sync_pushes_its_files_without_sftp_and_says_so_with_v(
    bare: NamespaceCluster, home: Path, tmp_path: Path
) -> None:
    """The requirements (0600), the index settings and the pushed wheels all go through the shell."""
    make_wheel(tmp_path / "wheels", "tinya", "1.0")
    venv = tmp_path / "node1" / "venv"
    env = {"offline": True, "packages": ["tinya==1.0"], "find_links": [str(tmp_path / "wheels")]}
    node = {"name": "node1", "host": bare.hosts[0].addr, "user": "root", "python": sys.executable}
    inventory = write_inventory(
        tmp_path / "hosts.yaml", [node], master="node1", env={"path": str(venv), "no_index": True, **env}
    )
    argv = [BOOTSTRAP, "-v", "-i", str(inventory), "sync", "--only", "env", "--json"]
    run_env = {"HOME": str(home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    proc = subprocess.run(
        bare.controller_argv(argv, env=run_env), capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = json.loads(proc.stdout)["env"]["nodes"]
    assert result["action"] == "installed" and result["wheels_pushed"] == 1, result
    said = [line for line in proc.stderr.splitlines() if "SFTP" in line]
    assert len(said) == 1 and "INFO" in said[0] and "node1" in said[0] and "shell" in said[0]
    check = bare.host_run(
        bare.hosts[0], [str(venv / "bin" / "python"), "-c", "import tinya; print(tinya.__version__)"]
    )
    assert check.stdout.strip() == "1.0", check.stderr
