"""`bootstrap sync --only env` on the namespace cluster, with tiny wheels built here (no network).

The namespace hosts have no default route (tests/cluster.py): nothing they run can reach an index, so
every install below comes from a local --find-links directory or, in offline mode, from the wheels the
controller pushed into each node's wheelhouse. All hosts share this machine's filesystem, so each node
gets its own venv through ``env.path: .../{node}/venv``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import NamespaceCluster
from tests.conftest import CliRun, write_inventory

Bootstrap = Callable[..., CliRun]


def make_wheel(directory: Path, name: str, version: str, extra: dict[str, str] | None = None) -> Path:
    """A minimal pure-Python wheel (METADATA, WHEEL, RECORD written by hand); ``extra``: more files
    installed into site-packages (name -> text)."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        **(extra or {}),
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: cb-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    path = directory / f"{name}-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(path, "w") as zf:
        for arc, text in files.items():
            data = text.encode()
            zf.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")
        record.append(f"{dist}/RECORD,,")
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    directory = tmp_path / "wheels"
    for name, version in (("tinya", "1.0"), ("tinyb", "1.0"), ("tinyb", "2.0")):
        make_wheel(directory, name, version)
    return directory


def _inventory(
    cluster: NamespaceCluster,
    tmp_path: Path,
    env: dict[str, Any],
    pythons: dict[str, str] | None = None,
) -> Path:
    nodes = [
        {
            "name": h.name,
            "host": h.addr,
            "user": "root",
            "python": (pythons or {}).get(h.name, sys.executable),
        }
        for h in cluster.hosts
    ]
    env = {"path": str(tmp_path / "nodes" / "{node}" / "venv"), **env}
    return write_inventory(tmp_path / "hosts.yaml", nodes, name="ns", master="node1", env=env)


def _sync(bootstrap: Bootstrap, inv: Path, *args: str) -> tuple[CliRun, dict[str, Any]]:
    run = bootstrap("-i", str(inv), "sync", "--only", "env", "--json", *args, timeout=600)
    return run, json.loads(run.stdout) if run.stdout.strip() else {}


def _nodes(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in doc["env"]["nodes"]}


def _venv(tmp_path: Path, node: str) -> Path:
    return tmp_path / "nodes" / node / "venv"


def _import_on(cluster: NamespaceCluster, node: str, venv: Path, code: str) -> str:
    """Run ``code`` with the node's venv interpreter inside the node's namespace."""
    result = cluster.host_run(cluster.host(node), [str(venv / "bin" / "python"), "-c", code])
    assert result.returncode == 0, result.stderr
    return str(result.stdout).strip()


def _tinyb_on(cluster: NamespaceCluster, tmp_path: Path, node: str) -> str:
    return _import_on(cluster, node, _venv(tmp_path, node), "import tinyb; print(tinyb.__version__)")


def test_first_sync_installs_second_skips_a_bump_moves_only_that_package(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path, wheels: Path
) -> None:
    env = {"packages": ["tinya==1.0", "tinyb==1.0"], "find_links": [str(wheels)], "no_index": True}
    inv = _inventory(cluster, tmp_path, env)

    run, doc = _sync(bootstrap, inv)
    assert run.returncode == 0, run
    for name, node in _nodes(doc).items():
        assert node["action"] == "installed", node
        assert node["packages"]["tinya"] == "1.0" and node["packages"]["tinyb"] == "1.0"
        assert _tinyb_on(cluster, tmp_path, name) == "1.0"
    assert len(doc["env"]["environments"]) == 1 and doc["env"]["identical"]
    tinya_file = _venv(tmp_path, "node2") / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    tinya_file = tinya_file / "site-packages" / "tinya" / "__init__.py"
    inode = tinya_file.stat().st_ino

    run, doc = _sync(bootstrap, inv)
    assert run.returncode == 0, run
    for node in _nodes(doc).values():
        assert node["action"] == "unchanged" and node["round_trips"] == 1, node

    human = bootstrap("-i", str(inv), "sync", "--only", "env", timeout=120)
    assert human.returncode == 0, human
    assert "3/3 nodes synced (3 unchanged), identical" in human.stderr
    assert "1 distinct environment" in human.stdout

    env["packages"] = ["tinya==1.0", "tinyb==2.0"]
    inv = _inventory(cluster, tmp_path, env)
    run, doc = _sync(bootstrap, inv)
    assert run.returncode == 0, run
    for name, node in _nodes(doc).items():
        assert node["action"] == "updated", node
        assert node["changes"] == {"tinyb": ["1.0", "2.0"]}, node  # only the bumped package moved
        assert _tinyb_on(cluster, tmp_path, name) == "2.0"
    # tinya was not reinstalled: the new build shares its file with the previous one (hard link)
    assert tinya_file.stat().st_ino == inode


def test_a_failed_install_keeps_the_previous_environment(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path, wheels: Path
) -> None:
    env: dict[str, Any] = {"packages": ["tinyb==1.0"], "find_links": [str(wheels)], "no_index": True}
    inv = _inventory(cluster, tmp_path, env)
    run, _ = _sync(bootstrap, inv)
    assert run.returncode == 0, run
    active = os.readlink(_venv(tmp_path, "node1"))

    env["packages"] = ["tinyb==1.0", "tinyc==9.9"]  # no such wheel anywhere
    inv = _inventory(cluster, tmp_path, env)
    run = bootstrap("-i", str(inv), "sync", "--only", "env", timeout=600)
    assert run.returncode == 1, run
    assert "tinyc" in run.stderr
    assert "the previous environment" in run.stderr and "is still active" in run.stderr, run.stderr
    for host in cluster.hosts:
        venv = _venv(tmp_path, host.name)
        assert _tinyb_on(cluster, tmp_path, host.name) == "1.0"
        builds = list((venv.parent / "venv.versions").iterdir())
        assert [b.name for b in builds] == [Path(os.readlink(venv)).name], builds  # the failed one is gone
    assert os.readlink(_venv(tmp_path, "node1")) == active


def test_a_node_that_reaches_no_index_is_refused_before_anything_is_installed(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """The namespace hosts have no route out: PyPI (the index when none is named) is out of reach.
    One probe says so, before any directory is made; the error names the two ways out."""
    inv = _inventory(cluster, tmp_path, {"packages": ["tinya==1.0"]})
    run = bootstrap("-i", str(inv), "sync", "--only", "env", timeout=600)
    assert run.returncode == 1, run
    # the same failure on every node: said once, naming them all
    names = ", ".join(f"'{host.name}'" for host in cluster.hosts)
    assert re.search(
        rf"^error: nodes {names}: cannot reach the package index \(https://pypi\.org/simple/: .+\): "
        r"nothing was installed\b.*env\.offline: true.*env\.index_url",
        run.stderr,
        re.M,
    ), run.stderr
    assert run.stderr.count("cannot reach the package index") == 1, run.stderr
    for host in cluster.hosts:
        assert not (_venv(tmp_path, host.name).parent / "venv.versions").exists()
    assert "Retrying" not in run.stderr and "No matching distribution" not in run.stderr


def test_a_node_with_another_python_is_reported(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path, wheels: Path
) -> None:
    # A wrapper whose interpreter reports 3.99 (sitecustomize rewrites sys.version_info).
    fake = tmp_path / "fakepy"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text("import sys\nsys.version_info = (3, 99, 0, 'final', 0)\n")
    wrapper = fake / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={fake} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    wanted = f"{sys.version_info[0]}.{sys.version_info[1]}"
    env = {"python": wanted, "packages": ["tinya==1.0"], "find_links": [str(wheels)], "no_index": True}
    inv = _inventory(cluster, tmp_path, env, pythons={"node3": str(wrapper)})
    run = bootstrap("-i", str(inv), "sync", "--only", "env", timeout=600)
    assert run.returncode == 1, run
    assert (
        f"node 'node3': Python 3.99.0 ({sys.executable}), but cluster.env.python wants {wanted}" in run.stderr
    )
    assert "2/3 nodes synced" in run.stderr
    assert not _venv(tmp_path, "node3").exists()


def test_nodes_with_different_versions_fail_with_one_line_per_environment(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    # An unpinned requirement resolved at two moments: what a lock file prevents.
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "tinyb", "1.0")
    env = {"packages": ["tinyb"], "find_links": [str(wheels)], "no_index": True}
    inv = _inventory(cluster, tmp_path, env)
    run, _ = _sync(bootstrap, inv, "--nodes", "node1,node2")
    assert run.returncode == 0, run
    make_wheel(wheels, "tinyb", "2.0")
    run, _ = _sync(bootstrap, inv, "--nodes", "node3")
    assert run.returncode == 0, run

    run = bootstrap("-i", str(inv), "sync", "--only", "env", timeout=600)
    assert run.returncode == 1, run
    assert "not pinned" in run.stderr
    assert "2 distinct environments" in run.stdout
    lines = [line for line in run.stdout.splitlines() if "python " in line and "tinyb" in line]
    assert len(lines) == 2, run.stdout
    assert any("node1, node2" in line and "tinyb 1.0" in line for line in lines), lines
    assert any("node3" in line and "tinyb 2.0" in line for line in lines), lines
    assert "tinyb: 1.0 on node1, node2; 2.0 on node3" in run.stderr, run.stderr


def test_offline_mode_pushes_wheels_and_installs_without_any_index(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    tmp_path: Path,
    wheels: Path,
) -> None:
    env = {
        "offline": True,
        "packages": ["tinya==1.0", "tinyb==1.0"],
        "find_links": [str(wheels)],  # read by the controller's pip download only
        "no_index": True,
    }
    inv = _inventory(cluster, tmp_path, env)
    run, doc = _sync(bootstrap, inv)
    assert run.returncode == 0, run
    for name, node in _nodes(doc).items():
        assert node["action"] == "installed" and node["wheels_pushed"] == 2, node
        pushed = sorted(p.name for p in (_venv(tmp_path, name).parent / "venv.wheels").glob("*.whl"))
        assert pushed == ["tinya-1.0-py3-none-any.whl", "tinyb-1.0-py3-none-any.whl"]

    run, doc = _sync(bootstrap, inv)
    assert all(n["action"] == "unchanged" for n in _nodes(doc).values()), doc

    # A bump pushes the one new wheel and drops the stale one from each node's wheelhouse.
    env["packages"] = ["tinya==1.0", "tinyb==2.0"]
    inv = _inventory(cluster, tmp_path, env)
    run, doc = _sync(bootstrap, inv)
    assert run.returncode == 0, run
    for name, node in _nodes(doc).items():
        assert node["wheels_pushed"] == 1 and node["changes"] == {"tinyb": ["1.0", "2.0"]}, node
        house = {p.name for p in (_venv(tmp_path, name).parent / "venv.wheels").iterdir()}
        assert "tinyb-1.0-py3-none-any.whl" not in house and "tinyb-2.0-py3-none-any.whl" in house

    # The nodes need nothing but their own wheelhouse: no source directory, no index, no network
    # (the namespaces have no route out). Fresh venvs are built from the pushed wheels alone.
    shutil.rmtree(wheels)
    run, doc = _sync(bootstrap, inv, "--force")
    assert run.returncode == 0, run
    for name, node in _nodes(doc).items():
        assert node["action"] == "rebuilt" and node["wheels_pushed"] == 0, node
        assert _tinyb_on(cluster, tmp_path, name) == "2.0"


def test_dry_run_shows_the_commands_and_touches_nothing(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path, wheels: Path
) -> None:
    env = {"packages": ["tinya==1.0"], "find_links": [str(wheels)], "no_index": True}
    inv = _inventory(cluster, tmp_path, env)
    run = bootstrap("-i", str(inv), "sync", "--only", "env", "--dry-run", timeout=120)
    assert run.returncode == 0, run
    for host in cluster.hosts:
        assert f"# {host.name}: environment at {tmp_path}/nodes/{host.name}/venv" in run.stdout
    assert "--no-index" in run.stdout and "-m venv --without-pip" in run.stdout
    # locations reach pip through its environment (an owner-only file), never its command line
    assert f"the index settings: PIP_FIND_LINKS={wheels}" in run.stdout and "--find-links" not in run.stdout
    # what the nodes told the probe, never a stand-in (issue 29): their Python in each build's stamp
    placeholders = ("BUILD-ID", '"KEY"', '"TOKEN"', '"PYTHON"', '"PLATFORM"', '"CREATED"', "env_probe.py")
    assert [p for p in placeholders if p in run.stdout] == []
    version = ".".join(map(str, sys.version_info[:3]))  # the nodes run this machine's Python
    assert run.stdout.count(f'"python": "{version}"') == len(cluster.hosts), run.stdout
    assert not (tmp_path / "nodes").exists()


def test_a_bad_env_section_stops_before_any_node_is_contacted(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    inv = _inventory(cluster, tmp_path, {"requirements": "missing-lock.txt"})
    run = bootstrap("-i", str(inv), "sync", "--only", "env", timeout=120)
    assert run.returncode == 2, run
    assert "env.requirements: cannot read" in run.stderr and "missing-lock.txt" in run.stderr
    assert not (tmp_path / "nodes").exists()


def test_uv_and_pip_give_the_same_environment(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path, wheels: Path
) -> None:
    uv = Path(sys.executable).parent / "uv"  # installed with the test extras (pyproject.toml)
    assert uv.is_file(), "uv is a test dependency: pip install -e '.[test]'"
    node1 = cluster.host("node1")
    cluster.set_session_env(
        node1, {"PATH": f"{uv.parent}:/usr/bin:/bin", "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    )
    try:
        env = {"packages": ["tinya==1.0", "tinyb==2.0"], "find_links": [str(wheels)], "no_index": True}
        run, doc = _sync(bootstrap, _inventory(cluster, tmp_path, env))
    finally:
        cluster.set_session_env(node1, None)
    assert run.returncode == 0, run
    nodes = _nodes(doc)
    assert nodes["node1"]["installer"] == "uv"
    assert nodes["node2"]["installer"] == "pip" and nodes["node3"]["installer"] == "pip"
    assert [e["nodes"] for e in doc["env"]["environments"]] == [["node1", "node2", "node3"]]
    assert _tinyb_on(cluster, tmp_path, "node1") == "2.0"
