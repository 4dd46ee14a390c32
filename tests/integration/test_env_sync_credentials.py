"""Index URLs with a login (`https://user:token@host/simple`) on the namespace cluster (security review
item 10).

The login used to be on pip's and uv's command line (every user of a node sees it with ``ps``), in
``bootstrap inventory --json`` and in ``sync --dry-run``. Here two private indexes, each behind HTTP
basic authentication with its own user, run in the controller's namespace; whenever one of them is
asked for something with the right login, it reads the command line of every process of the machine
(the nodes share its process table) and keeps any that holds a password, as typed or inside the
base64 text the transport hands to ``/bin/sh``. The installs only work when the installer really
read the locations from its environment: the nodes reach nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests import netns
from tests.cluster import NamespaceCluster
from tests.conftest import CliRun, write_inventory
from tests.integration.test_env_sync import make_wheel

Bootstrap = Callable[..., CliRun]
_BASE64_RE = re.compile(rb"[A-Za-z0-9+/]{24,}={0,2}")


def _command_lines() -> list[tuple[int, bytes]]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                found.append((int(proc.name), (proc / "cmdline").read_bytes()))
            except OSError:
                continue  # gone meanwhile
    return found


def _holds(cmdline: bytes, secret: bytes) -> bool:
    if secret in cmdline:
        return True
    for token in _BASE64_RE.findall(cmdline):
        try:
            if secret in base64.b64decode(token + b"=" * (-len(token) % 4)):
                return True
        except ValueError:
            continue
    return False


class PrivateIndex:
    """A PEP 503 simple index of some wheels, behind basic authentication, in the controller's
    network namespace. Records who fetched what with the right login, and, at every request, each
    command line showing a watched secret."""

    def __init__(self, cluster: NamespaceCluster, wheels: list[Path], secrets_to_watch: list[str]) -> None:
        self.user = "ci-" + secrets.token_hex(3)
        self.password = "pw-" + secrets.token_hex(12)
        self.wheels = {w.name.split("-")[0].lower(): w for w in wheels}
        self.watch = [s.encode() for s in secrets_to_watch]
        self.requests: list[tuple[str, str]] = []  # (client address, path) of authorised requests
        self.exposed: list[str] = []  # command lines that showed a secret (as text)
        self._lock = threading.Lock()
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:  # uv asks for a wheel's size first
                self.do_GET(body=False)

            def do_GET(self, body: bool = True) -> None:
                expected = base64.b64encode(f"{index.user}:{index.password}".encode()).decode()
                authorised = self.headers.get("Authorization") == f"Basic {expected}"
                index.saw(self.client_address[0], self.path, authorised)
                if not authorised:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="private"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data, kind = index.answer(self.path)
                self.send_response(200 if data is not None else 404)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data or b"")))
                self.end_headers()
                if body:
                    self.wfile.write(data or b"")

        with netns.inside(cluster.controller_ns):
            self.server = ThreadingHTTPServer((cluster.controller_addr, 0), Handler)
        self.port = self.server.server_address[1]
        self.host = cluster.controller_addr
        self.url = f"http://{self.user}:{self.password}@{self.host}:{self.port}/simple"
        self.masked = f"http://***@{self.host}:{self.port}/simple"

    def saw(self, client: str, path: str, authorised: bool) -> None:
        exposed = [
            cmdline.replace(b"\0", b" ").decode(errors="replace")
            for _, cmdline in _command_lines()
            if any(_holds(cmdline, secret) for secret in self.watch)
        ]
        with self._lock:
            if authorised:
                self.requests.append((client, path))
            self.exposed.extend(exposed)

    def answer(self, path: str) -> tuple[bytes | None, str]:
        parts = [p for p in path.split("?")[0].split("/") if p]
        if parts[:1] == ["simple"] and len(parts) == 2 and parts[1] in self.wheels:
            wheel = self.wheels[parts[1]]
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            link = f'<a href="/files/{wheel.name}#sha256={digest}">{wheel.name}</a>'
            return f"<!DOCTYPE html><html><body>{link}</body></html>".encode(), "text/html"
        if parts[:1] == ["files"] and len(parts) == 2:
            for wheel in self.wheels.values():
                if wheel.name == parts[1]:
                    return wheel.read_bytes(), "application/octet-stream"
        return None, "text/plain"

    def clients(self) -> set[str]:
        with self._lock:
            return {client for client, path in self.requests if path.startswith("/files/")}

    def __enter__(self) -> PrivateIndex:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def indexes(cluster: NamespaceCluster, tmp_path: Path) -> Iterator[tuple[PrivateIndex, PrivateIndex]]:
    """Index A serves tinya, index B (the extra one) tinyb; each watches for both passwords.

    They speak plain HTTP (a test needs no certificate), which pip refuses off localhost unless told
    to trust the host: every node's sessions get PIP_TRUSTED_HOST (no location, no login in it);
    node1 also gets uv on its PATH, so uv installs there and pip on the others."""
    wheels = tmp_path / "wheels"
    tinya, tinyb = make_wheel(wheels, "tinya", "1.0"), make_wheel(wheels, "tinyb", "1.0")
    a = PrivateIndex(cluster, [tinya], [])
    b = PrivateIndex(cluster, [tinyb], [])
    a.watch = b.watch = [a.password.encode(), b.password.encode()]
    uv = Path(sys.executable).parent / "uv"
    assert uv.is_file(), "uv is a test dependency: pip install -e '.[test]'"
    for host in cluster.hosts:
        env = {"PIP_TRUSTED_HOST": cluster.controller_addr}
        if host.name == "node1":
            env.update(PATH=f"{uv.parent}:/usr/bin:/bin", UV_CACHE_DIR=str(tmp_path / "uv-cache"))
        cluster.set_session_env(host, env)
    try:
        with a, b:
            yield a, b
    finally:
        for host in cluster.hosts:
            cluster.set_session_env(host, None)


def _inventory(cluster: NamespaceCluster, tmp_path: Path, env: dict[str, Any]) -> Path:
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in cluster.hosts
    ]
    env = {"path": str(tmp_path / "nodes" / "{node}" / "venv"), **env}
    return write_inventory(tmp_path / "hosts.yaml", nodes, name="ns", master="node1", env=env)


def _nothing_shows(run: CliRun, *passwords: str) -> None:
    for password in passwords:
        assert password not in run.stdout and password not in run.stderr, run


def test_index_logins_stay_out_of_process_lists_output_and_files(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    tmp_path: Path,
    indexes: tuple[PrivateIndex, PrivateIndex],
) -> None:
    a, b = indexes
    env = {"packages": ["tinya==1.0", "tinyb==1.0"], "index_url": a.url, "extra_index_urls": [b.url]}
    inv = _inventory(cluster, tmp_path, env)

    shown = bootstrap("-i", str(inv), "--json", "inventory")
    assert shown.returncode == 0, shown
    _nothing_shows(shown, a.password, b.password)
    doc = json.loads(shown.stdout)
    assert doc["cluster"]["env"]["index_url"] == a.masked
    assert doc["cluster"]["env"]["extra_index_urls"] == [b.masked]

    for args in (("--dry-run",), ("--dry-run", "--json")):
        dry = bootstrap("-i", str(inv), *args, "sync", "--only", "env", timeout=120)
        assert dry.returncode == 0, dry
        _nothing_shows(dry, a.password, b.password)
        assert a.masked in dry.stdout and b.masked in dry.stdout, dry
        assert "--index-url" not in dry.stdout and "--extra-index-url" not in dry.stdout
    assert not a.requests and not b.requests  # a dry run contacts nothing

    run = bootstrap("-i", str(inv), "-v", "--json", "sync", "--only", "env", timeout=600)
    assert run.returncode == 0, run
    _nothing_shows(run, a.password, b.password)
    nodes = {n["name"]: n for n in json.loads(run.stdout)["env"]["nodes"]}
    assert nodes["node1"]["installer"] == "uv" and nodes["node2"]["installer"] == "pip"
    for node in nodes.values():
        assert node["packages"]["tinya"] == "1.0" and node["packages"]["tinyb"] == "1.0", node
    # every node fetched from both indexes: uv and pip read the locations from their environment
    addrs = {h.addr for h in cluster.hosts}
    assert a.clients() == addrs and b.clients() == addrs
    assert a.exposed == [] and b.exposed == []  # no command line ever showed a password
    # nothing left on the nodes holds one (the index settings file is read, then deleted)
    for path in (tmp_path / "nodes").rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            assert a.password.encode() not in data and b.password.encode() not in data, path


def test_a_wrong_login_fails_without_showing_it(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    tmp_path: Path,
    indexes: tuple[PrivateIndex, PrivateIndex],
) -> None:
    a, _ = indexes
    wrong = "wrong-" + secrets.token_hex(8)
    url = a.url.replace(a.password, wrong)
    a.watch.append(wrong.encode())
    inv = _inventory(cluster, tmp_path, {"packages": ["tinya==1.0"], "index_url": url})
    run = bootstrap("-i", str(inv), "-v", "sync", "--only", "env", "--nodes", "node1,node2", timeout=600)
    assert run.returncode == 1, run
    assert "pip install failed" in run.stderr, run
    _nothing_shows(run, wrong, a.password)
    assert not a.requests  # never authorised
    assert a.exposed == []  # the wrong login was not on a command line either


def test_offline_downloads_read_the_login_from_the_environment_too(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    tmp_path: Path,
    indexes: tuple[PrivateIndex, PrivateIndex],
) -> None:
    a, _ = indexes
    env = {"offline": True, "packages": ["tinya==1.0"], "index_url": a.url}
    inv = _inventory(cluster, tmp_path, env)
    run = bootstrap(
        "-i",
        str(inv),
        "--json",
        "sync",
        "--only",
        "env",
        "--nodes",
        "node3",
        env={"PIP_TRUSTED_HOST": cluster.controller_addr},  # this machine's pip downloads
        timeout=600,
    )
    assert run.returncode == 0, run
    _nothing_shows(run, a.password)
    assert a.clients() == {cluster.controller_addr}  # this machine downloaded, the node did not
    assert a.exposed == []
    assert json.loads(run.stdout)["env"]["nodes"][0]["packages"]["tinya"] == "1.0"
