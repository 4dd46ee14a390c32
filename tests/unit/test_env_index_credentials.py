"""Index locations with a login: masked wherever shown, passed to installers through their environment
(pure logic, and the Linux build script run here with this interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import records
from orchestrator.errors import CommandFailedError, UsageError
from orchestrator.inventory import load_inventory
from orchestrator.platforms import PosixShell
from orchestrator.redact import has_url_credentials, mask_credentials_in, mask_url_credentials
from orchestrator.steps.envsync import wheelhouse
from orchestrator.steps.envsync.ops import BuildPlan, PosixEnvOps
from orchestrator.steps.envsync.spec import (
    env_file_text,
    index_environment,
    index_flags,
    resolve_spec,
    stamp_key,
)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("https://user:pass@host/simple", "https://***@host/simple"),
        ("https://TOKEN@host/simple/", "https://***@host/simple/"),  # a lone user is often the token
        ("https://u:p@ss@host:8443/simple", "https://***@host:8443/simple"),  # up to the last "@"
        ("http://u:p@10.0.0.1", "http://***@10.0.0.1"),
        ("git+https://u:t@git.lab/x.git@v1.0#egg=x", "git+https://***@git.lab/x.git@v1.0#egg=x"),
        (
            "Looking in indexes: https://a:b@x/s, https://c:d@y/s",
            "Looking in indexes: https://***@x/s, https://***@y/s",
        ),
        ("--index-url='https://u:p@h/simple'", "--index-url='https://***@h/simple'"),
        ("https://host/simple", "https://host/simple"),
        ("mail me@example.org or git@github.com:a/b", "mail me@example.org or git@github.com:a/b"),
        ("https://host/simple?user=a@b", "https://host/simple?user=a@b"),  # "@" after the authority
    ],
)
def test_logins_in_urls_are_masked_and_nothing_else(text: str, shown: str) -> None:
    assert mask_url_credentials(text) == shown
    assert has_url_credentials(text) is (text != shown)


def test_a_document_is_masked_everywhere() -> None:
    doc = {"a": ["https://u:p@h/s", 3, None], "b": {"c": ("http://t@h",)}, "d": "plain"}
    assert mask_credentials_in(doc) == {
        "a": ["https://***@h/s", 3, None],
        "b": {"c": ["http://***@h"]},
        "d": "plain",
    }


def _inventory(tmp_path: Path, env: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(f"nodes:\n  - {{name: a, host: 10.0.0.1}}\ncluster:\n  env:\n{env}")
    return path


URLS = (
    "    packages: [tinya==1.0]\n"
    "    index_url: https://ci:s3cret@pypi.lab/simple\n"
    "    extra_index_urls: [https://tok3n@torch.lab/whl, https://plain.lab/simple]\n"
    "    find_links: [https://ci:s3cret@files.lab/wheels/, /srv/wheels]\n"
)


def test_the_inventory_shown_masks_logins(tmp_path: Path) -> None:
    doc = load_inventory(_inventory(tmp_path, URLS)).public_dict()  # inventory --json, check --json
    env = doc["cluster"]["env"]
    assert env["index_url"] == "https://***@pypi.lab/simple"
    assert env["extra_index_urls"] == ["https://***@torch.lab/whl", "https://plain.lab/simple"]
    assert env["find_links"] == ["https://***@files.lab/wheels/", "/srv/wheels"]
    assert "s3cret" not in str(doc) and "tok3n" not in str(doc)


def test_locations_become_the_variables_each_installer_reads(tmp_path: Path) -> None:
    spec = resolve_spec(load_inventory(_inventory(tmp_path, URLS)), "linux")
    assert index_flags(spec) == []
    assert index_environment(spec, "pip") == {
        "PIP_INDEX_URL": "https://ci:s3cret@pypi.lab/simple",
        "PIP_EXTRA_INDEX_URL": "https://tok3n@torch.lab/whl https://plain.lab/simple",
        "PIP_FIND_LINKS": "https://ci:s3cret@files.lab/wheels/ /srv/wheels",
    }
    assert index_environment(spec, "uv") == {
        "UV_INDEX_URL": "https://ci:s3cret@pypi.lab/simple",
        "UV_EXTRA_INDEX_URL": "https://tok3n@torch.lab/whl https://plain.lab/simple",
        "UV_FIND_LINKS": "https://ci:s3cret@files.lab/wheels/,/srv/wheels",
    }
    text = env_file_text(index_environment(spec, "pip"))
    assert text.splitlines()[0] == "PIP_EXTRA_INDEX_URL=https://tok3n@torch.lab/whl https://plain.lab/simple"
    # a new token changes nothing installed: same stamp, and the stamp holds no hash of the secret
    rotated = resolve_spec(load_inventory(_inventory(tmp_path, URLS.replace("s3cret", "n3w"))), "linux")
    assert stamp_key(spec, python_version="3.11.7", platform="p") == stamp_key(
        rotated, python_version="3.11.7", platform="p"
    )
    # no_index drops the indexes; find-links stay
    no_index = resolve_spec(load_inventory(_inventory(tmp_path, URLS + "    no_index: true\n")), "linux")
    assert index_flags(no_index) == ["--no-index"]
    assert set(index_environment(no_index, "pip")) == {"PIP_FIND_LINKS"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ("    find_links: ['/srv/my wheels']\n", "env.find_links: '/srv/my wheels' contains a space"),
        (
            "    linux: {index_url: 'https://u:p@h/simple x'}\n",
            "env.linux.index_url: 'https://***@h/simple x'",
        ),
        ("    find_links: ['/srv/a,b']\n", "env.find_links: '/srv/a,b' contains a comma"),
    ],
)
def test_locations_an_environment_variable_cannot_carry_are_refused(
    tmp_path: Path, env: str, message: str
) -> None:
    inventory = load_inventory(_inventory(tmp_path, "    packages: [tinya==1.0]\n" + env))
    with pytest.raises(UsageError) as caught:
        resolve_spec(inventory, "linux")
    assert message in str(caught.value) and "p@h" not in str(caught.value)


def test_a_comma_is_fine_when_pip_installs(tmp_path: Path) -> None:
    env = "    packages: [tinya==1.0]\n    installer: pip\n    find_links: ['/srv/a,b']\n"
    spec = resolve_spec(load_inventory(_inventory(tmp_path, env)), "linux")
    assert index_environment(spec, "pip") == {"PIP_FIND_LINKS": "/srv/a,b"}


def test_errors_never_show_a_login() -> None:
    error = CommandFailedError("cannot reach https://ci:s3cret@pypi.lab/simple", hint="check https://t@x/")
    assert "s3cret" not in str(error) and error.message == "cannot reach https://***@pypi.lab/simple"
    assert error.hint == "check https://***@x/"


def test_the_controller_download_gets_its_locations_from_the_environment(tmp_path: Path) -> None:
    spec = resolve_spec(load_inventory(_inventory(tmp_path, URLS)), "linux")
    target = wheelhouse.Target("3.11", "cp", "cp311", ("manylinux_2_17_x86_64",))
    argv = wheelhouse.download_command(spec, target, tmp_path / "d", tmp_path / "r.txt")
    assert not any("lab" in a for a in argv), argv
    env = wheelhouse.download_environment(spec)
    assert env["PIP_INDEX_URL"] == "https://ci:s3cret@pypi.lab/simple" and env["PIP_NO_INPUT"] == "1"


def test_the_controller_download_keeps_the_extra_indexes_its_pip_configuration_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PIP_EXTRA_INDEX_URL replaces pip.conf's extra-index-url: a lab's mirror named there was lost
    to the offline download. It comes after the inventory's, once."""
    spec = resolve_spec(load_inventory(_inventory(tmp_path, URLS)), "linux")
    monkeypatch.setattr(wheelhouse, "configured_extra_indexes", lambda: [])
    ours = wheelhouse.download_environment(spec)["PIP_EXTRA_INDEX_URL"].split()
    assert ours == ["https://tok3n@torch.lab/whl", "https://plain.lab/simple"]
    mirror = "https://mirror.lab/simple"
    monkeypatch.setattr(wheelhouse, "configured_extra_indexes", lambda: [mirror, ours[0]])
    assert wheelhouse.download_environment(spec)["PIP_EXTRA_INDEX_URL"].split() == [*ours, mirror]
    # what `pip config list` says is read, sections a download does not read left out
    listed = (
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'\nfreeze.extra-index-url='x'\n"
    )
    done = subprocess.CompletedProcess([], 0, stdout=listed, stderr="")
    monkeypatch.undo()
    monkeypatch.setattr(wheelhouse.subprocess, "run", lambda *a, **k: done)
    assert wheelhouse.configured_extra_indexes() == ["file:///opt/a/simple", "file:///opt/b/simple"]


def test_the_build_script_takes_locations_from_the_settings_file_and_deletes_it(tmp_path: Path) -> None:
    """The Linux build run here: pip finds the wheel only through PIP_FIND_LINKS from the file; the
    script and the installer's command line hold no location."""
    from tests.integration.test_env_sync import make_wheel

    wheels = tmp_path / "wheels"
    make_wheel(wheels, "tinya", "1.0")
    path = str(tmp_path / "env" / "venv")
    plan = BuildPlan(
        interpreter=sys.executable,
        path=path,
        build_id="20260101-000000-abcdef",
        clone=False,
        installer="pip",
        uv=None,
        index_args=("--no-index",),
        index_env=(("PIP_FIND_LINKS", str(wheels)),),
        require_hashes=False,
        stamp={"key": "k"},
        pip_runner="base",
    )
    assert plan.index_env_file == f"{path}.versions/20260101-000000-abcdef.index.env"
    script = PosixEnvOps(PosixShell()).build(plan)
    assert str(wheels) not in script and "--find-links" not in script
    Path(plan.versions_dir).mkdir(parents=True)
    Path(plan.requirements_file).write_text("tinya==1.0\n")
    Path(plan.index_env_file).write_text(env_file_text(dict(plan.index_env)))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # nothing from this process's pip settings
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    listed = records.find(done.stdout, plan.nonce, "installed")  # the build's listing record
    assert listed is not None and json.loads(listed.text(0))["packages"]["tinya"] == "1.0"
    assert not Path(plan.index_env_file).exists()

    missing = BuildPlan(**{**plan.__dict__, "build_id": "20260101-000001-bbbbbb"})
    Path(missing.requirements_file).write_text("tinya==1.0\n")
    failed = subprocess.run(
        ["sh", "-c", PosixEnvOps(PosixShell()).build(missing)], capture_output=True, text=True
    )
    assert failed.returncode == 1 and "cannot read the index settings" in failed.stderr
    assert Path(path).resolve().name == plan.build_id  # the previous build stays active


def test_the_windows_build_reads_the_settings_file_and_holds_no_location() -> None:
    from orchestrator.platforms.powershell import PowerShell
    from orchestrator.steps.envsync.ops import PowerShellEnvOps
    from tests.pwsh import assert_parses

    platform = PowerShell()
    plan = BuildPlan(
        interpreter="C:\\Python311\\python.exe",
        path="C:\\Users\\me\\cluster-bootstrap\\venv",
        build_id="20260101-000000-abcdef",
        clone=False,
        installer="pip",
        uv=None,
        index_args=(),
        index_env=(("PIP_INDEX_URL", "https://ci:s3cret@pypi.lab/simple"),),
        require_hashes=False,
        stamp={"key": "k"},
        pip_runner="base",
    )
    script = platform.wrap(PowerShellEnvOps(platform).build(plan))
    assert_parses(script)
    assert "s3cret" not in script and "pypi.lab" not in script
    assert "venv.versions\\20260101-000000-abcdef.index.env'" in script
    assert "SetEnvironmentVariable" in script and "Remove-Item -LiteralPath $cbEnvFile" in script


def test_the_node_build_keeps_the_extra_indexes_the_nodes_pip_configuration_names(tmp_path: Path) -> None:
    """The same on the node: the spec's PIP_EXTRA_INDEX_URL (the torch index `--from-master` adds)
    replaced the node's pip.conf extra-index-url, its lab mirror lost ("Looking in indexes:
    pypi.org, download.pytorch.org"). The build keeps it, after the spec's."""
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text(
        "[global]\nextra-index-url = file:///opt/pypi/simple\n"
    )
    plan = BuildPlan(
        interpreter=sys.executable, path=str(tmp_path / "v"), build_id="b", clone=False, installer="pip",
        uv=None, index_args=(), require_hashes=False, stamp={},
        index_env=(("PIP_EXTRA_INDEX_URL", "https://download.pytorch.org/whl/cpu"),),
    )  # fmt: skip
    (line,) = [line for line in PosixEnvOps(PosixShell()).build(plan).splitlines() if "cb_cfg" in line]
    env = {
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "PIP_EXTRA_INDEX_URL": "https://download.pytorch.org/whl/cpu",
    }
    said = subprocess.run(
        ["/bin/sh", "-c", f'{line}\necho "$PIP_EXTRA_INDEX_URL"'], capture_output=True, text=True, env=env
    )
    assert said.stdout.strip() == "https://download.pytorch.org/whl/cpu file:///opt/pypi/simple", said


def test_a_failed_download_here_is_told_to_every_node_it_was_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One download serves every node of a platform; its failure was one error object, so once shown
    for node1 the other nodes were `failed` with no reason. Each node gets its own error, the same
    words (said once for all of them), naming this machine's download."""
    from orchestrator.executor import Outcome
    from orchestrator.view import failures

    spec = resolve_spec(load_inventory(_inventory(tmp_path, URLS)), "linux")
    target = wheelhouse.Target("3.11", "cp", "cp311", ("manylinux_2_17_x86_64",))
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found for x==1\n")
    monkeypatch.setattr(wheelhouse.subprocess, "run", lambda *a, **k: failed)
    errors = []
    for node in ("node1", "node2", "node3"):
        with pytest.raises(CommandFailedError) as caught:
            wheelhouse.fill(spec, target, root=tmp_path / "houses")
        caught.value.node = node
        errors.append(caught.value)
    assert len({id(e) for e in errors}) == 3
    said = failures([Outcome(e.node, None, e, 0.1) for e in errors])
    assert len(said) == 1, said
    assert "'node1', 'node2', 'node3'" in said[0].text and "this machine's download" in said[0].text, said


@pytest.mark.parametrize(
    ("word", "token"),
    [
        ("hf_abcdefghijklmnop", True),
        ("AKIAIOSFODNN7EXAMPLE", True),
        ("ghp_0123456789abcdefghij", True),
        ("a1b2c3d4e5f6g7h8i9j0k1", True),  # long, letters and digits
        ("0.1", False),
        ("--lr", False),
        ("checkpoints/epoch20/model.pt", False),
        ("DEBUG", False),
        ("experimentnamewithoutdigits", False),
    ],
)
def test_a_token_shape_is_never_repeated(word: str, token: bool) -> None:
    from orchestrator.redact import looks_like_token

    assert looks_like_token(word) is token
