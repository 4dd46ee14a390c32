"""`bootstrap sync --from-master` / `--freeze`, pure parts: which packages and builds nodes get, the
index, the lock text, the record check/launch read, and the fixes `check` prints."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.inventory import Inventory, load_inventory_text
from orchestrator.steps.envsync import master
from orchestrator.steps.envsync.master import (
    MasterEnv,
    recorded_nodes,
    remember,
    requirements_text,
    spec_from_master,
    synced_from_master,
    torch_missing_fix,
    versions_differ_fix,
    write_freeze,
)
from orchestrator.steps.envsync.spec import resolve_spec, stamp_key

LINUX_CPU = MasterEnv(
    where="ws1: /usr/bin/python3",
    python="3.11.7",
    platform="linux",
    torch="2.13.0+cpu",
    cuda=None,
    hip=None,
    packages={"torch": "2.13.0+cpu", "numpy": "2.4.6", "sympy": "1.14.0", "triton": "3.5.0"},
    portable=frozenset({"torch", "numpy", "sympy"}),  # triton: required on Linux only
)


def _env(**changes: Any) -> MasterEnv:
    return MasterEnv(**{**LINUX_CPU.__dict__, **changes})


def _inventory(tmp_path: Path, env: str = "", nodes: str | None = None) -> Inventory:
    nodes = nodes or "  - {name: ws1, host: 10.0.0.1}\n  - {name: ws2, host: 10.0.0.2}\n"
    text = f"cluster:\n  master: ws1\n{env}nodes:\n{nodes}"
    return load_inventory_text(text, str(tmp_path / "hosts.yaml"))


def _pins(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_nodes_of_the_masters_os_get_every_package_at_the_masters_exact_build() -> None:
    pins = _pins(requirements_text(LINUX_CPU, "linux", with_index=True))
    assert pins == [
        "--extra-index-url https://download.pytorch.org/whl/cpu",
        "numpy==2.4.6",
        "sympy==1.14.0",
        "torch==2.13.0+cpu",
        "triton==3.5.0",
    ]


def test_another_os_gets_the_portable_packages_and_the_same_kind_of_build() -> None:
    pins = _pins(requirements_text(LINUX_CPU, "windows", with_index=True))
    # triton is required on Linux only: the Windows node's installer decides what it needs there
    assert pins == [
        "--extra-index-url https://download.pytorch.org/whl/cpu",
        "numpy==2.4.6",
        "sympy==1.14.0",
        "torch==2.13.0+cpu",
    ]


@pytest.mark.parametrize(
    ("torch", "cuda", "node_os", "pin", "index"),
    [
        # a CUDA build on the master: the same CUDA build everywhere, from PyTorch's index for it
        ("2.13.0+cu126", "12.6", "linux", "torch==2.13.0+cu126", "https://download.pytorch.org/whl/cu126"),
        ("2.13.0+cu126", "12.6", "windows", "torch==2.13.0+cu126", "https://download.pytorch.org/whl/cu126"),
        # PyPI's unlabeled Linux torch (a CUDA build): the same from PyPI; Windows gets that CUDA's
        ("2.13.0", "12.8", "linux", "torch==2.13.0", None),
        ("2.13.0", "12.8", "windows", "torch==2.13.0+cu128", "https://download.pytorch.org/whl/cu128"),
        # a CPU master without a label (macOS, Windows from PyPI): Linux nodes get the CPU build, never
        # PyPI's several-GB CUDA one
        ("2.13.0", None, "linux", "torch==2.13.0+cpu", "https://download.pytorch.org/whl/cpu"),
    ],
)
def test_the_build_label_and_index_follow_the_masters_torch(
    torch: str, cuda: str | None, node_os: str, pin: str, index: str | None
) -> None:
    platform = "darwin" if torch == "2.13.0" and cuda is None else "linux"
    env = _env(
        torch=torch, cuda=cuda, platform=platform, packages={"torch": torch}, portable=frozenset({"torch"})
    )
    pins = _pins(requirements_text(env, node_os, with_index=True))
    assert pin in pins
    index_lines = [p for p in pins if p.startswith("--extra-index-url")]
    assert index_lines == ([f"--extra-index-url {index}"] if index else [])


def test_torchvision_shares_torchs_build_label() -> None:
    env = _env(
        torch="2.13.0+cu126",
        cuda="12.6",
        packages={"torch": "2.13.0+cu126", "torchvision": "0.28.0+cu126"},
        portable=frozenset({"torch", "torchvision"}),
    )
    assert "torchvision==0.28.0+cu126" in _pins(requirements_text(env, "windows", with_index=True))


def test_cluster_env_index_settings_replace_the_pytorch_index(tmp_path: Path) -> None:
    mirrored = _inventory(tmp_path, "  env:\n    index_url: https://mirror.example/simple\n")
    spec = spec_from_master(mirrored, LINUX_CPU, "linux")
    assert "--extra-index-url" not in spec.requirements_text
    assert spec.index_url == "https://mirror.example/simple"
    offline = _inventory(tmp_path, "  env:\n    no_index: true\n    find_links: [/srv/wheels]\n")
    spec = spec_from_master(offline, LINUX_CPU, "linux")
    assert "--extra-index-url" not in spec.requirements_text and spec.no_index
    assert spec.find_links == ("/srv/wheels",)
    plain = spec_from_master(_inventory(tmp_path), LINUX_CPU, "linux")
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in plain.requirements_text
    assert plain.pins["torch"] == "2.13.0+cpu" and plain.warnings == ()


def test_the_frozen_file_declared_in_cluster_env_is_the_same_environment(tmp_path: Path) -> None:
    """Switching from --from-master to cluster.env pointing at the --freeze file rebuilds nothing."""
    inv = _inventory(tmp_path)
    (written,) = write_freeze(tmp_path / "locks" / "requirements.txt", inv, list(inv.nodes), LINUX_CPU)
    declared = _inventory(tmp_path, "  env:\n    requirements: locks/requirements.txt\n")
    from_file = resolve_spec(declared, "linux")
    from_master = spec_from_master(inv, LINUX_CPU, "linux")
    assert written.read_text() == from_master.requirements_text
    key = {"python_version": "3.11.7", "platform": "linux-x86_64-cpython-cp311"}
    assert stamp_key(from_file, **key) == stamp_key(from_master, **key)


def test_freeze_writes_one_file_per_os_among_the_nodes(tmp_path: Path) -> None:
    inv = _inventory(
        tmp_path,
        nodes="  - {name: ws1, host: 10.0.0.1}\n"
        "  - {name: win, host: 10.0.0.3, os: windows, password_env: P, windows: {mode: native}}\n"
        "  - {name: wsl, host: 10.0.0.4, os: windows, password_env: P}\n",
    )
    files = write_freeze(tmp_path / "req.txt", inv, list(inv.nodes), LINUX_CPU)
    assert [f.name for f in files] == ["req.txt", "req.windows.txt"]
    assert "triton==3.5.0" in files[0].read_text() and "triton" not in files[1].read_text()
    # the WSL node installs what the Linux nodes install (the Linux build, inside its distribution)
    ws1, _win, wsl = inv.nodes
    linux_only = write_freeze(tmp_path / "wsl.txt", inv, [ws1, wsl], LINUX_CPU)
    assert [f.name for f in linux_only] == ["wsl.txt"] and "triton==3.5.0" in linux_only[0].read_text()


def test_the_record_makes_training_use_the_venv_only_where_it_still_applies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    inv = _inventory(tmp_path)
    ws1, ws2 = inv.nodes
    assert not synced_from_master(ws2, inv)
    remember(inv, {"ws2": {"env_id": "b1", "torch": "2.13.0+cpu"}})
    assert synced_from_master(ws2, inv) and not synced_from_master(ws1, inv)
    assert recorded_nodes(inv) == ["ws2"]
    from orchestrator.steps.node_facts import training_python

    assert training_python(ws2, inv) == "~/cluster-bootstrap/venv/bin/python"
    assert training_python(ws1, inv) == "python3"
    # the workdir moved: the recorded venv is not where the inventory now puts it
    moved = _inventory(
        tmp_path, nodes="  - {name: ws1, host: 10.0.0.1}\n  - {name: ws2, host: 10.0.0.2, workdir: /x}\n"
    )
    assert not synced_from_master(moved.nodes[1], moved)
    # cluster.env declared: its own environment, whatever the record says
    declared = _inventory(tmp_path, "  env:\n    packages: [torch==2.13.0]\n")
    assert not synced_from_master(declared.nodes[1], declared)


def test_check_fixes_name_the_sync_never_a_pip_into_the_managed_venv() -> None:
    missing = torch_missing_fix("2.13.0+cpu")
    assert "`bootstrap sync --from-master`" in missing and "2.13.0+cpu" in missing
    assert "`bootstrap sync`" in missing and "cluster.env" in missing
    assert "pip install" not in missing
    differ = versions_differ_fix(
        {"torch": "2.12.0", "python": "3.11.7"}, {"torch": "2.13.0+cpu", "python": "3.11.2"}
    )
    assert "`bootstrap sync --from-master`" in differ and "Python" not in differ.split("(")[0]
    python = versions_differ_fix(
        {"torch": "2.13.0", "python": "3.12.1"}, {"torch": "2.13.0", "python": "3.11.2"}
    )
    assert "install Python 3.11" in python and "--from-master" not in python


def _load_probe() -> Any:
    path = Path(master.__file__).parent / "probes" / "master_env.py"
    spec = importlib.util.spec_from_file_location("cb_master_env_probe", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Dist:
    def __init__(self, *requires: str) -> None:
        self.requires = list(requires)


def test_the_master_probe_follows_requirements_skipping_extras_and_marking_platform_ones() -> None:
    probe = _load_probe()
    dists = {
        "torch": _Dist(
            "filelock",
            "sympy>=1.13",
            'triton==3.5.0; platform_system == "Linux"',
            'opt-einsum; extra == "opt"',
        ),
        "sympy": _Dist("mpmath<1.4"),
        "filelock": _Dist(),
        "mpmath": _Dist(),
        "triton": _Dist(),
        "opt-einsum": _Dist(),
        "requests": _Dist(),
    }
    assert probe.closure(dists, ["torch"], False) == ["filelock", "mpmath", "sympy", "torch", "triton"]
    assert probe.closure(dists, ["torch"], True) == ["filelock", "mpmath", "sympy", "torch"]


def test_the_master_probe_reads_this_interpreter() -> None:
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", master.probe_code()], capture_output=True, text=True, check=True
    ).stdout
    data = json.loads(out.strip().splitlines()[-1])
    env = MasterEnv.parse("here", data)
    if importlib.util.find_spec("torch") is None:
        assert env.torch is None
        return
    from importlib import metadata

    version = metadata.version("torch")  # importing torch costs seconds: its metadata says the same
    assert env.torch == version and env.packages["torch"] == version and "torch" in env.portable
    assert env.cuda is None if version.endswith("+cpu") else env.cuda


def test_uv_resolves_a_lock_naming_pytorchs_index_as_pip_does(tmp_path: Path) -> None:
    from orchestrator.steps.envsync.spec import index_environment

    spec = spec_from_master(_inventory(tmp_path), LINUX_CPU, "linux")
    # uv's default takes numpy from the first index that has any numpy (PyTorch's): pip's way instead
    assert index_environment(spec, "uv") == {"UV_INDEX_STRATEGY": "unsafe-best-match"}
    assert index_environment(spec, "pip") == {}
