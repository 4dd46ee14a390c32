"""The relays of a Slurm allocation (orchestrator/slurm/relay.py) over one real SSH connection to the
login host: what only sharing that connection brings, without Slurm (its files go through the login
host; running steps is tested on the real Slurm in tests/e2e/test_slurm.py)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.slurm.relay import SrunTransport
from orchestrator.transports import SSHTransport
from tests.cluster import NamespaceCluster
from tests.conftest import connected_root_transport


@pytest.fixture
def login(cluster: NamespaceCluster, ctl_home: Path) -> Iterator[SSHTransport]:
    with connected_root_transport(cluster, ctl_home) as t:
        yield t


def test_the_nodes_of_an_allocation_upload_at_once_through_the_login_hosts_connection(
    login: SSHTransport, tmp_path: Path
) -> None:
    # validate uploads every node's rank script and worker at the same moment; paramiko's one SFTP
    # session per connection, used by several threads at once, loses answers and hangs
    files = threading.Lock()
    relays = [SrunTransport(f"n{i}", login, "1", files) for i in range(4)]
    sources = []
    for i in range(4):
        source = tmp_path / f"source{i}"
        source.write_bytes(os.urandom(50_000 + i))
        sources.append(source)
    target = tmp_path / "shared"

    def upload(index: int) -> None:
        for k in range(25):
            relays[index].put(sources[index], f"{target}/n{index}/file{k}")

    threads = [threading.Thread(target=upload, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "uploads through the shared connection hung"
    for index, source in enumerate(sources):
        for k in range(25):
            assert (target / f"n{index}" / f"file{k}").read_bytes() == source.read_bytes()
