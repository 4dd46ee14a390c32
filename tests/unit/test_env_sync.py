"""Environment sync, pure parts: the inventory's env section, requirement parsing, the stamp key,
the per-OS commands and the comparison of installed versions."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import records
from orchestrator.errors import InventoryError, UsageError
from orchestrator.inventory import Inventory, load_inventory_text
from orchestrator.platforms import PosixShell
from orchestrator.platforms.powershell import PowerShell
from orchestrator.steps.envsync import resolve_specs, venv_python
from orchestrator.steps.envsync.ops import BuildPlan, PosixEnvOps, PowerShellEnvOps, probe_code
from orchestrator.steps.envsync.report import NodeVersions, summarize
from orchestrator.steps.envsync.spec import (
    drift,
    env_path,
    parse_requirements,
    python_matches,
    resolve_spec,
    same_version,
    stamp_key,
)


def inventory(env: str, tmp_path: Path, nodes: str = "  - {name: a, host: 10.0.0.1}\n") -> Inventory:
    text = f"cluster:\n  env:\n{env}nodes:\n{nodes}"
    return load_inventory_text(text, str(tmp_path / "hosts.yaml"))


def problems(env: str, tmp_path: Path) -> str:
    with pytest.raises(InventoryError) as info:
        inventory(env, tmp_path)
    return str(info.value)


# ----- the inventory's env section ------------------------------------------------------------------


def test_env_section_is_optional_and_empty_by_default(tmp_path: Path) -> None:
    inv = load_inventory_text("nodes:\n  - host: a\n", str(tmp_path / "h.yaml"))
    assert not inv.cluster.env.declared
    assert inv.cluster.env.installer == "auto" and inv.cluster.env.offline is False


def test_env_accepts_a_string_or_a_list(tmp_path: Path) -> None:
    env = inventory(
        "    python: '3.11'\n    packages: torch==2.13.0\n"
        "    linux: {extra_index_urls: https://download.pytorch.org/whl/cu124}\n",
        tmp_path,
    ).cluster.env
    assert env.packages == ("torch==2.13.0",)
    assert env.linux is not None and env.linux.extra_index_urls == ("https://download.pytorch.org/whl/cu124",)
    assert env.declared


def test_an_unquoted_python_version_is_refused_because_yaml_reads_3_10_as_3_1(tmp_path: Path) -> None:
    text = problems("    python: 3.10\n    packages: [a==1]\n", tmp_path)
    assert "field 'env.python'" in text and "quoted string" in text


def test_env_mistakes_are_named_with_the_closest_field(tmp_path: Path) -> None:
    text = problems(
        "    instaler: uv\n    linux: {index_urll: x}\n    installer: conda\n    offline: maybe\n", tmp_path
    )
    assert "field 'env.instaler': unknown field 'instaler'; did you mean 'installer'?" in text
    assert "field 'env.linux.index_urll': unknown field 'index_urll'; did you mean 'index_url'?" in text
    assert "field 'env.installer': expected one of: auto, uv, pip, got 'conda'" in text
    assert "field 'env.offline': expected true or false" in text


def test_requirements_and_packages_together_are_refused(tmp_path: Path) -> None:
    inv = inventory("    requirements: lock.txt\n    packages: [a==1]\n", tmp_path)
    with pytest.raises(UsageError, match=r"either requirements \(a file\) or packages \(a list\), not both"):
        resolve_spec(inv, "linux")


def test_requirements_file_is_relative_to_the_inventory(tmp_path: Path) -> None:
    (tmp_path / "lock.txt").write_text(
        "torch==2.13.0 \\\n    --hash=sha256:abc\nnumpy==2.1.0 --hash=sha256:def\n"
    )
    spec = resolve_spec(inventory("    requirements: lock.txt\n", tmp_path), "linux")
    assert spec.hashes and spec.pins == {"torch": "2.13.0", "numpy": "2.1.0"}
    assert spec.source == str(tmp_path / "lock.txt") and not spec.warnings


def test_a_missing_requirements_file_names_field_and_path(tmp_path: Path) -> None:
    inv = inventory("    requirements: nope.txt\n", tmp_path)
    with pytest.raises(UsageError) as info:
        resolve_spec(inv, "linux")
    assert "env.requirements: cannot read" in str(info.value) and "nope.txt" in str(info.value)


def test_per_os_overrides_replace_the_cluster_wide_values(tmp_path: Path) -> None:
    inv = inventory(
        "    packages: [torch==2.13.0]\n"
        "    index_url: https://pypi.example/simple\n"
        "    linux: {extra_index_urls: [https://download.pytorch.org/whl/cu124]}\n"
        "    windows: {packages: [torch==2.13.0+cpu], index_url: https://win.example/simple}\n",
        tmp_path,
    )
    linux, windows = resolve_spec(inv, "linux"), resolve_spec(inv, "windows")
    assert linux.extra_index_urls == ("https://download.pytorch.org/whl/cu124",)
    assert linux.index_url == "https://pypi.example/simple" and linux.pins == {"torch": "2.13.0"}
    assert windows.index_url == "https://win.example/simple" and windows.extra_index_urls == ()
    assert windows.pins == {"torch": "2.13.0+cpu"}
    assert linux.digest != windows.digest


# ----- requirements -----------------------------------------------------------------------------------


def test_requirements_parsing_follows_pip_rules() -> None:
    text = (
        "# comment\n--index-url https://x/simple\nTorch_Vision==0.28.0  # trailing\n"
        "numpy>=2\nsomething==2.*\n./local/pkg\n"
    )
    reqs, hashes, warnings = parse_requirements(text, "lock.txt")
    assert not hashes
    assert [r.name for r in reqs] == ["torch-vision", "numpy", "something", None]
    assert [r.pinned for r in reqs] == ["0.28.0", None, None, None]
    assert len(warnings) == 3 and "'numpy>=2' is not pinned" in warnings[0]


@pytest.mark.parametrize("line", ["-r other.txt", "--requirement=other.txt", "-c constraints.txt", "-e ."])
def test_includes_are_refused_because_they_would_not_reach_the_nodes(line: str) -> None:
    with pytest.raises(UsageError, match="pulls in another file"):
        parse_requirements(f"a==1\n{line}\n", "lock.txt")


def test_an_empty_requirement_set_is_refused() -> None:
    with pytest.raises(UsageError, match="no requirements"):
        parse_requirements("# nothing\n--index-url https://x\n", "lock.txt")


# ----- stamp, versions, paths ------------------------------------------------------------------------


def test_stamp_key_changes_with_what_changes_the_environment(tmp_path: Path) -> None:
    base = resolve_spec(inventory("    packages: [a==1]\n", tmp_path), "linux")
    key = stamp_key(base, python_version="3.11.7", platform="linux-x86_64-cpython-cp311")
    assert key == stamp_key(base, python_version="3.11.7", platform="linux-x86_64-cpython-cp311")
    assert key != stamp_key(base, python_version="3.11.8", platform="linux-x86_64-cpython-cp311")
    assert key != stamp_key(base, python_version="3.11.7", platform="linux-aarch64-cpython-cp311")
    for env in (
        "    packages: [a==2]\n",
        "    packages: [a==1]\n    index_url: https://x/simple\n",
        "    packages: [a==1]\n    installer: uv\n",
        "    packages: [a==1]\n    offline: true\n",
    ):
        other = resolve_spec(inventory(env, tmp_path), "linux")
        assert stamp_key(other, python_version="3.11.7", platform="linux-x86_64-cpython-cp311") != key, env
    moved = resolve_spec(inventory("    packages: [a==1]\n    path: /opt/venv\n", tmp_path), "linux")
    assert stamp_key(moved, python_version="3.11.7", platform="linux-x86_64-cpython-cp311") == key


def test_versions_compare_like_pip_equality() -> None:
    assert same_version("2.13.0+cpu", "2.13.0")  # a pin without a local label ignores it
    assert not same_version("2.13.0+cpu", "2.13.0+cu124")
    assert same_version("1.0.0", "1.0") and not same_version("1.0.1", "1.0")


def test_drift_lists_pinned_packages_installed_at_another_version(tmp_path: Path) -> None:
    spec = resolve_spec(inventory("    packages: [a==1.0, b==2.0, c]\n", tmp_path), "linux")
    assert drift(spec, {"a": "1.0", "b": "2.0", "c": "9"}).wrong == {}
    assert drift(spec, {"a": "1.0", "b": "2.1"}).wrong == {"b": ("2.1", "2.0")}
    assert drift(spec, {"b": "2.0"}).wrong == {"a": (None, "1.0")}


def test_python_version_matching() -> None:
    assert python_matches("3.11", "3.11.7") and python_matches(None, "3.9.1")
    assert not python_matches("3.1", "3.11.7") and not python_matches("3.11", "3.12.0")
    assert python_matches("3.11.7", "3.11.7") and not python_matches("3.11.7", "3.11.8")


def test_env_path_defaults_to_the_workdir_launch_uses(tmp_path: Path) -> None:
    inv = inventory(
        "    packages: [a==1]\n",
        tmp_path,
        nodes="  - {name: a, host: h1}\n  - {name: b, host: h2, workdir: /srv/cb/}\n"
        "  - {name: w, host: h3, os: windows, password_env: P, windows: {mode: native}}\n"
        "  - {name: wsl, host: h4, os: windows, password_env: P}\n",
    )
    a, b, w, wsl = inv.nodes
    assert env_path(a, path_setting=None) == "~/cluster-bootstrap/venv"
    assert env_path(b, path_setting=None) == "/srv/cb/venv"
    assert env_path(a, path_setting="/nfs/envs/{node}/venv") == "/nfs/envs/a/venv"
    assert venv_python(a, inv) == "~/cluster-bootstrap/venv/bin/python"
    assert venv_python(w, inv) == "~/cluster-bootstrap/venv\\Scripts\\python.exe"
    # a WSL-mode Windows node trains with the Linux build inside its distribution: a Linux venv
    assert venv_python(wsl, inv) == "~/cluster-bootstrap/venv/bin/python"
    from orchestrator.steps.node_facts import training_python

    assert training_python(wsl, inv) == "~/cluster-bootstrap/venv/bin/python"  # what its launch runs
    assert resolve_specs(inv, [a, wsl]).keys() == {"linux"} and resolve_specs(inv, [w]).keys() == {"windows"}


# ----- the node side -----------------------------------------------------------------------------------


def _probe_module() -> object:
    spec = importlib.util.spec_from_loader("env_probe", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(probe_code(), "env_probe.py", "exec"), module.__dict__)
    return module


def test_manylinux_tags_cover_every_older_glibc_and_the_legacy_aliases() -> None:
    tags = _probe_module().manylinux_platforms("x86_64", ("glibc", "2.28"))  # type: ignore[attr-defined]
    assert tags[0] == "manylinux_2_28_x86_64" and tags[-1] == "linux_x86_64"
    for tag in ("manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64"):
        assert tag in tags
    arm = _probe_module().manylinux_platforms("aarch64", ("glibc", "2.17"))  # type: ignore[attr-defined]
    assert arm == ["manylinux_2_17_aarch64", "manylinux2014_aarch64", *arm[2:]]
    assert "manylinux2010_aarch64" not in arm
    musl = _probe_module().manylinux_platforms("x86_64", ("", ""))  # type: ignore[attr-defined]
    assert musl == ["linux_x86_64"]


def _plan(**changes: object) -> BuildPlan:
    values: dict[str, object] = {
        "interpreter": "/opt/py thon/bin/python3",
        "path": "~/it's here/venv",
        "build_id": "20260101-000000-abcdef",
        "clone": False,
        "installer": "pip",
        "uv": None,
        "index_args": ("--no-index", "--find-links", "/w h/wheels"),
        "require_hashes": True,
        "stamp": {"key": "k'ey"},
        "pip_runner": "base",
    }
    values.update(changes)
    return BuildPlan(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"clone": True},
        {"installer": "uv", "uv": "/usr/local/bin/uv"},
        {"pip_runner": "wheel", "pip_wheel": "/usr/share/python-wheels/pip-23.0.1-py3-none-any.whl"},
        {"pip_runner": "venv", "offline": True, "remove_wheels": ("old-1.0-py3-none-any.whl",)},
    ],
)
def test_build_scripts_are_valid_sh_with_every_value_quoted(changes: dict[str, object]) -> None:
    ops = PosixEnvOps(PosixShell())
    plan = _plan(**changes)
    script = ops.build(plan)
    check = subprocess.run(["sh", "-n"], input=script, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert "link=\"$HOME\"/'it'\"'\"'s here/venv'" in script  # "~" expands on the node, the rest is literal
    assert "'/opt/py thon/bin/python3'" in script and "'/w h/wheels'" in script
    assert "--require-hashes" in script
    assert 'mv -T "$link.cb-new" "$link"' in script  # the atomic switch
    if plan.clone:
        assert 'cp -a -l "$cur" "$new"' in script and "-m venv" not in script
    else:
        assert ("-m venv --without-pip" in script) == (plan.pip_runner != "venv")
    if plan.installer == "uv":
        assert '/usr/local/bin/uv pip install --python "$new/bin/python"' in script
        assert "--compile-bytecode" not in script
    else:  # as uv: nothing byte-compiled while installing (Python compiles what it imports)
        assert " --no-compile " in script
    if plan.remove_wheels:
        assert "rm -f -- old-1.0-py3-none-any.whl" in script


def test_a_build_script_really_builds_switches_and_rolls_back(tmp_path: Path) -> None:
    """The Linux script run here, with this interpreter and a local wheel: success switches the
    symlink; a failing install leaves the previous build active and removes the new one."""
    from tests.integration.test_env_sync import make_wheel

    wheels = tmp_path / "wheels"
    make_wheel(wheels, "tinya", "1.0")
    ops = PosixEnvOps(PosixShell())
    path = str(tmp_path / "env" / "venv")
    first = _plan(
        interpreter=sys.executable, path=path, index_args=("--no-index", "--find-links", str(wheels))
    )
    first = BuildPlan(**{**first.__dict__, "require_hashes": False})
    Path(first.versions_dir).mkdir(parents=True)
    Path(first.requirements_file).write_text("tinya==1.0\n")
    done = subprocess.run(["sh", "-c", ops.build(first)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert Path(path).resolve().name == first.build_id
    listed = records.find(done.stdout, first.nonce, "installed")  # the build's listing record
    assert listed is not None and json.loads(listed.text(0))["packages"]["tinya"] == "1.0"

    second = BuildPlan(**{**first.__dict__, "build_id": "20260101-000001-bbbbbb", "clone": True})
    Path(second.requirements_file).write_text("tinya==1.0\nmissing-package==1.0\n")
    failed = subprocess.run(["sh", "-c", ops.build(second)], capture_output=True, text=True)
    assert failed.returncode == 1
    assert "the previous environment is still active" in failed.stderr
    assert Path(path).resolve().name == first.build_id
    assert sorted(p.name for p in Path(first.versions_dir).iterdir()) == [first.build_id]


# ----- the comparison ---------------------------------------------------------------------------------


def test_identical_nodes_form_one_group_and_pip_is_not_compared() -> None:
    report = summarize(
        [
            NodeVersions("a", "linux", "3.11.7", {"torch": "2.13.0", "pip": "23.0"}),
            NodeVersions("b", "linux", "3.11.2", {"torch": "2.13.0", "pip": "24.0"}),
        ]
    )
    assert [g.nodes for g in report.groups] == [["a", "b"]] and not report.mismatch
    assert report.groups[0].describe() == "python 3.11: torch 2.13.0"


def test_a_difference_names_the_package_and_the_nodes() -> None:
    report = summarize(
        [
            NodeVersions("a", "linux", "3.11.7", {"torch": "2.13.0", "numpy": "2.1.0"}),
            NodeVersions("b", "linux", "3.11.7", {"torch": "2.13.0", "numpy": "2.1.0"}),
            NodeVersions("c", "linux", "3.11.7", {"torch": "2.12.0", "numpy": "2.1.0", "extra": "1"}),
        ]
    )
    assert [g.nodes for g in report.groups] == [["a", "b"], ["c"]]
    assert report.describe_mismatch() == ["extra: - on a, b; 1 on c", "torch: 2.13.0 on a, b; 2.12.0 on c"]


def test_across_oses_only_python_and_the_torch_release_must_match() -> None:
    same_release = summarize(
        [
            NodeVersions("lin", "linux", "3.11.7", {"torch": "2.13.0+cu124", "nvidia-nccl": "2.21"}),
            NodeVersions("win", "windows", "3.11.9", {"torch": "2.13.0+cpu"}),
        ]
    )
    assert len(same_release.groups) == 2 and not same_release.mismatch
    other = summarize(
        [
            NodeVersions("lin", "linux", "3.11.7", {"torch": "2.13.0+cu124"}),
            NodeVersions("win", "windows", "3.12.1", {"torch": "2.12.0+cpu"}),
        ]
    )
    assert other.differing == {
        "python": {"3.11": ["lin"], "3.12": ["win"]},
        "torch": {"2.13.0": ["lin"], "2.12.0": ["win"]},
    }


# ----- native Windows: generated PowerShell, parsed (no PowerShell runs here) -------------------------


def _windows_plan(**changes: object) -> BuildPlan:
    values: dict[str, object] = {
        "interpreter": "C:\\Program Files\\Python311\\python.exe",
        "path": "C:\\Users\\o'brien\\cluster-bootstrap\\venv",
        "build_id": "20260101-000000-abcdef",
        "clone": False,
        "installer": "pip",
        "uv": None,
        "index_args": ("--extra-index-url", "https://download.pytorch.org/whl/cpu"),
        "require_hashes": False,
        "stamp": {"key": "k"},
        "pip_runner": "base",
    }
    values.update(changes)
    return BuildPlan(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"installer": "uv", "uv": "C:\\Users\\o'brien\\.local\\bin\\uv.exe"},
        {"offline": True, "remove_wheels": ("old-1.0-py3-none-any.whl",), "pip_runner": "venv"},
    ],
)
def test_windows_build_script_parses_and_switches_a_junction(changes: dict[str, object]) -> None:
    from orchestrator.platforms.powershell import PowerShell
    from orchestrator.steps.envsync.ops import PowerShellEnvOps, ops_for
    from tests.pwsh import assert_parses, commands

    platform = PowerShell()
    ops = ops_for(platform)
    assert isinstance(ops, PowerShellEnvOps) and not ops.supports_clone
    plan = _windows_plan(**changes)
    script = platform.wrap(ops.build(plan))
    tree = assert_parses(script)
    names = [c.name for c in commands(tree)]
    junction = [c for c in commands(tree) if c.name == "New-Item"]
    assert junction and junction[0].has("-ItemType") and "Junction" in junction[0].arguments
    assert "[System.IO.Directory]::Delete($cbLink)" in script  # the old junction, never its target
    assert "'C:\\Users\\o''brien\\cluster-bootstrap\\venv.versions\\20260101-000000-abcdef'" in script
    assert "Remove-Item" in names and "Get-ChildItem" in names
    assert ("--without-pip" in script) == (plan.pip_runner != "venv" or plan.installer == "uv")
    assert ("--no-compile" in script) == (plan.installer != "uv")
    if plan.remove_wheels:
        assert "old-1.0-py3-none-any.whl" in script
    assert ops.venv_python("C:\\cb\\venv") == "C:\\cb\\venv\\Scripts\\python.exe"


def test_windows_probe_and_prepare_parse() -> None:
    from orchestrator.platforms.powershell import PowerShell
    from orchestrator.steps.envsync.ops import PowerShellEnvOps
    from tests.pwsh import assert_parses

    platform = PowerShell()
    ops = PowerShellEnvOps(platform)
    probe = platform.wrap(ops.probe("python.exe", {"path": "~/cluster-bootstrap/venv", "stamp": "s"}))
    assert_parses(probe)
    assert "ProcessStartInfo" in probe  # the interpreter gets exactly our argv (no PowerShell quoting)
    assert_parses(platform.wrap(ops.prepare(_windows_plan(offline=True))))


def test_probe_and_build_list_packages_with_the_same_code() -> None:
    """An unchanged node reports through the probe, a rebuilt one through the build: one listing."""
    from orchestrator.steps.envsync.ops import LIST_CODE

    assert _probe_module().LIST_CODE == LIST_CODE  # type: ignore[attr-defined]


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_compile_bytecode_asks_both_installers_to_compile(installer: str) -> None:
    plan = _plan(installer=installer, uv="/usr/local/bin/uv", compile_bytecode=True)
    for script in (PosixEnvOps(PosixShell()).build(plan), PowerShellEnvOps(PowerShell()).build(plan)):
        assert "--no-compile" not in script
        assert ("--compile-bytecode" in script) == (installer == "uv")


def test_a_requirements_path_that_is_no_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # opening it to read would wait for a writer forever
    for path in ("/dev/zero", str(tmp_path / "fifo")):
        inv = inventory(f"    requirements: {path}\n", tmp_path)
        with pytest.raises(UsageError, match=r"env.requirements: cannot read .*: not a regular file"):
            resolve_spec(inv, "linux")
    (tmp_path / "huge.txt").write_bytes(b"#" * (17 << 20))
    with pytest.raises(UsageError, match="larger than 16 MiB"):
        resolve_spec(inventory("    requirements: huge.txt\n", tmp_path), "linux")


def test_names_too_long_for_the_file_system_are_errors_not_tracebacks(tmp_path: Path) -> None:
    long = "x" * 300
    (tmp_path / "l.yaml").write_text(
        f"cluster:\n  train: {{script: {long}.py, templates: {long}}}\n  code: {{source: {long}}}\n"
        "nodes: [{name: a, host: 192.0.2.1}]\n"
    )
    from tests.conftest import BOOTSTRAP

    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1"}
    for command in (
        ["launch", "--dry-run"],
        ["render", "--offline"],
        ["sync", "--only", "code", "--dry-run"],
    ):
        run = subprocess.run(
            [BOOTSTRAP, "-i", "l.yaml", *command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 2 and "Traceback" not in run.stderr, (command, run.stderr)
    (tmp_path / "s.yaml").write_text(
        f"cluster: {{train: {{script: {long}.py}}}}\nnodes: [{{name: a, host: 192.0.2.1}}]\n"
    )
    run = subprocess.run(
        [BOOTSTRAP, "-i", "s.yaml", "launch", "--dry-run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0 and "is not in" in run.stderr and "Traceback" not in run.stderr, run.stderr
