"""Hostile inventory values through every launch template: nothing runs, every value arrives exactly.

Issue 14: `# Cluster {{ cluster_name }}` (no filter) let a cluster name run as a command on every node,
and `export {{ name }}=` did the same with an env name ending in a newline. Quoting is now the
renderer's default (Jinja ``finalize``), so this test feeds hostile strings (newlines, ``$(...)``,
backticks, quotes, ``%``, ``!``, unicode quotes and line separators, very long values) into every
string field of an inventory, renders the three shipped templates and a user template that uses no
filter at all, then:

- POSIX scripts run under the real ``/bin/sh`` with ``python`` pointing at a stub that records its
  argv, environment and working directory: no marker file appears, every value arrives byte for byte;
- PowerShell scripts (no PowerShell here) are parsed with tree-sitter-pwsh: no parse error, no command
  but the template's own, and every value is one single-quoted literal whose text decodes to it.

A value the inventory refuses (a node name with a newline, an env name ``X\\n``) is a pass too: what
must never happen is a value that is accepted and then does something.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import InventoryError
from orchestrator.inventory import load_inventory_text
from orchestrator.platforms import PosixShell, PowerShell
from orchestrator.render import Renderer, plan_launch
from tests import pwsh

MARKER_NAME = "cb-pwned"


def _attacks(marker: str) -> list[str]:
    """Ways out of a word, a comment, a quote or a line: each would create ``marker`` if it ran."""
    touch = f"touch {marker}"
    return [
        f"x\n{touch}\n",
        f"x\r\n{touch} #",
        f"$({touch})",
        f"`{touch}`",
        f"';{touch};'",
        f'";{touch};"',
        f"x; {touch}",
        f"x && {touch} || {touch}",
        f"x\u2028{touch}",
        f"x\u2019; {touch}; \u2018",  # PowerShell reads unicode single quotes as quotes
        f"x`n{touch}",
        f"$(New-Item {marker})",
        f"%PATH%!x!^&{touch}",
        f"x'\"'\"'\n{touch}\n'",
        "$HOME ${HOME} ~ * ? [a] {a,b}",
        "-n",
        "--",
        "",
        "é漢字\U0001f600",
        "a" * 5000,
    ]


#: text a field may hold: anything but NUL, which no argv or environment can carry
_TEXT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40)


def hostile(marker: str) -> st.SearchStrategy[str]:
    attack = st.sampled_from(_attacks(marker))
    return st.one_of(attack, _TEXT, st.builds(lambda a, b, c: a + b + c, _TEXT, attack, _TEXT))


def _write_stub(path: Path) -> None:
    """An executable at ``path`` that records how it was started (argv, environment, cwd)."""
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "out = os.path.join(os.environ['CB_PROBE_DIR'], 'call-%d.json' % os.getpid())\n"
        "with open(out, 'w', encoding='utf-8', errors='surrogateescape') as f:\n"
        "    json.dump({'argv': sys.argv[1:], 'env': dict(os.environ), 'cwd': os.getcwd()}, f)\n"
    )
    path.chmod(0o700)


def _inventory(values: dict[str, Any], base: Path) -> str:
    """An inventory (JSON is YAML) whose string fields hold ``values``."""
    doc = {
        "cluster": {
            "name": values["cluster_name"],
            "master": "head",
            "backend": "gloo",
            "train": {
                "script": values["script"],
                "args": values["args"],
                "env": {"CB_VALUE": values["env_value"], values["env_name"]: "v"},
                "elastic": values["elastic"],
            },
        },
        "nodes": [
            {
                "name": values["node_name"],
                "host": values["host"],
                "python": str(base / "py" / values["python_name"]),
                "workdir": str(base / "wd" / values["workdir_name"]),
                "interface": values["interface"],
                "nproc": 2,
            }
        ],
    }
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(doc, ensure_ascii=False))


# JSON is YAML, except that YAML allows only printable characters raw and reads U+0085, U+2028 and
# U+2029 as line breaks: those are written as \uXXXX escapes (astral characters stay raw: a JSON
# surrogate pair escape is not one character in YAML)
_YAML_UNSAFE = re.compile(
    "[^\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
)


def _path_part(marker: str) -> st.SearchStrategy[str]:
    # one file-name component: the stub and the code directory must exist under exactly that name
    return hostile(marker).map(lambda s: s.replace("/", "_")[:200]).filter(lambda s: s not in ("", ".", ".."))


def _mostly(valid: st.SearchStrategy[str], raw: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """``valid`` nine times in ten, else ``raw`` (which the inventory must refuse or make harmless)."""
    return st.integers(0, 9).flatmap(lambda i: raw if i == 9 else valid)  # 0 is what hypothesis favours


def _one_line(value: str) -> str:
    return "".join(c for c in value if unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp", "Cs"))


def _values(marker: str) -> st.SearchStrategy[dict[str, Any]]:
    h = hostile(marker)
    # fields the inventory restricts get mostly values it accepts (hostile ones inside its rules), so
    # that most examples render; the raw hostile value is drawn now and then and must be refused
    display = h.map(lambda s: _one_line(s)[:200]).filter(bool)
    host_word = h.map(lambda s: re.sub(r"[\s,/]", "", _one_line(s))[:200]).filter(bool)
    return st.fixed_dictionaries(
        {
            "cluster_name": _mostly(display, h),
            "node_name": _mostly(st.just("head"), h),
            "host": _mostly(host_word, h),
            "python_name": _path_part(marker),
            "workdir_name": _path_part(marker),
            "interface": h,
            "script": h,
            "args": st.lists(h, max_size=4),
            "env_value": h,
            "env_name": _mostly(st.just("CB_OTHER"), h),
            "elastic": st.booleans(),
            "run_id": h.filter(bool),
        }
    )


USER_TEMPLATE = """#!/bin/sh
# a user's template that forgets every filter: {{ cluster_name }}
cd {{ code_dir }}
{% for name, value in env %}
export {{ name }}={{ value }}
{% endfor %}
export GLOO_CHECK={{ master_addr }}
exec {{ python }} {{ script }}{% for a in args %} {{ a }}{% endfor %}

"""


def _run_posix(script: str, base: Path, probe: Path) -> list[dict[str, Any]]:
    for old in probe.glob("call-*.json"):
        old.unlink()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(base), "CB_PROBE_DIR": str(probe)}
    subprocess.run(["/bin/sh", "-c", script, "launch"], cwd=base, env=env, capture_output=True, timeout=60)
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(probe.glob("call-*.json"))]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_values_never_run_and_arrive_exactly(base: Path, data: st.DataObject) -> None:
    marker = base / MARKER_NAME
    values = data.draw(_values(str(marker)))
    try:
        inventory = load_inventory_text(_inventory(values, base), "hostile.yaml")
    except InventoryError:
        return  # refused before anything renders: safe
    (base / "py").mkdir(exist_ok=True)
    (base / "wd").mkdir(exist_ok=True)
    node = inventory.nodes[0]
    python = base / "py" / values["python_name"]
    code_dir = base / "wd" / values["workdir_name"] / "code"
    _write_stub(python)
    code_dir.mkdir(parents=True, exist_ok=True)
    probe = base / "probe"
    probe.mkdir(exist_ok=True)
    specs = plan_launch(
        inventory,
        backend="gloo",
        master_addr=node.host,
        run_id=values["run_id"],
        interfaces={node.name: (values["interface"], node.host)},
        cpus={},
        pythons={},
    )
    user_dir = base / "user-templates"
    user_dir.mkdir(exist_ok=True)
    (user_dir / "user.sh.j2").write_text(USER_TEMPLATE)
    renderer, user_renderer = Renderer(), Renderer(user_dir)
    spec = specs[0]
    env_expected = {
        "CB_VALUE": values["env_value"],
        values["env_name"]: "v",
        "GLOO_SOCKET_IFNAME": values["interface"],
    }
    user_env_expected = {**env_expected, "GLOO_CHECK": node.host}

    posix = {
        "torchrun.sh.j2": renderer.render(spec, PosixShell()),
        "ranks.sh.j2": renderer.render(spec, PosixShell(), template="ranks.sh.j2"),
        "user.sh.j2": user_renderer.render(spec, PosixShell(), template="user.sh.j2"),
    }
    for name, script in posix.items():
        calls = _run_posix(script, base, probe)
        assert not marker.exists(), f"{name}: a value ran as a command\n{script}"
        expected_calls = 2 if name == "ranks.sh.j2" else 1
        assert len(calls) == expected_calls, f"{name}: the interpreter was not started as written\n{script}"
        for call in calls:
            assert call["cwd"] == str(code_dir.resolve()), name
            want_env = user_env_expected if name == "user.sh.j2" else env_expected
            for key, value in want_env.items():
                assert call["env"].get(key) == value, f"{name}: {key} changed on the way"
            argv = call["argv"]
            assert argv[-1 - len(values["args"]) :] == [spec.script, *values["args"]], name
            if name == "torchrun.sh.j2":
                if spec.elastic:
                    assert argv[argv.index("--rdzv-id") + 1] == values["run_id"]
                    assert argv[argv.index("--local-addr") + 1] == node.host
                else:
                    assert argv[argv.index("--master-addr") + 1] == node.host

    if spec.elastic:
        return  # native Windows refuses elastic runs before rendering (tested elsewhere)
    ps = renderer.render(spec, PowerShell())
    tree = pwsh.assert_parses(ps)
    # the template's own New-Item (the run's outputs directory) is fine; one naming the marker is not
    became = [
        (c.name, c.arguments)
        for c in pwsh.commands(tree)
        if c.name.lower() == "touch" or (c.name.lower() == "new-item" and "cb-pwned" in " ".join(c.arguments))
    ]
    assert not became, f"a value became a PowerShell command: {became}"
    literals = {
        _ps_literal(n.text.decode("utf-8"))
        for n in pwsh.walk(tree.root_node)
        if n.type == "verbatim_string_characters"
    }
    for value in (values["env_value"], values["interface"], node.host, values["run_id"]):
        assert value in literals, f"{value!r} is not one PowerShell literal of the script"


_PS_SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b"


def _ps_literal(text: str) -> str:
    """The value of a PowerShell single-quoted literal (quotes doubled inside, any of four quote marks)."""
    body = text[1:-1]
    out, i = [], 0
    while i < len(body):
        out.append(body[i])
        i += (
            2
            if body[i] in _PS_SINGLE_QUOTES and i + 1 < len(body) and body[i + 1] in _PS_SINGLE_QUOTES
            else 1
        )
    return "".join(out)


def test_cluster_name_in_a_comment_cannot_end_the_line() -> None:
    """The reported attack, exactly: an Ansible ``bootstrap_cluster_name`` with a newline is refused,
    and a template writing any value into a comment through ``comment`` keeps it on that line."""
    text = json.dumps(
        {"cluster": {"name": "lab\ntouch /tmp/x", "master": "a"}, "nodes": [{"name": "a", "host": "h"}]}
    )
    with pytest.raises(InventoryError, match="control character"):
        load_inventory_text(text, "x.yaml")
    env_name = json.dumps(
        {
            "cluster": {"name": "lab", "master": "a", "train": {"env": {"X\n": "v"}}},
            "nodes": [{"name": "a", "host": "h"}],
        }
    )
    with pytest.raises(InventoryError):
        load_inventory_text(env_name, "x.yaml")


def test_stub_is_executable(tmp_path: Path) -> None:
    """The harness itself: the stub records a call, so 'no call recorded' above means a broken script."""
    stub = tmp_path / "py"
    _write_stub(stub)
    assert stub.stat().st_mode & stat.S_IXUSR
    calls = _run_posix(f"exec {stub} a 'b c'", tmp_path, tmp_path)
    assert calls[0]["argv"] == ["a", "b c"]
    assert os.path.samefile(calls[0]["cwd"], tmp_path)


BOOTSTRAP = str(Path(sys.executable).with_name("bootstrap"))


def _render_out(tmp_path: Path, name: str, out: Path) -> subprocess.CompletedProcess[str]:
    inventory = tmp_path / "h.yaml"
    inventory.write_text(
        json.dumps(
            {
                "cluster": {"name": "lab", "master": name},
                "nodes": [{"name": name, "connection": "local", "python": sys.executable}],
            }
        )
    )
    env = {"HOME": str(tmp_path), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    argv = [BOOTSTRAP, "-i", str(inventory), "render", "--offline", "--out", str(out)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_render_out_stays_inside_its_directory(tmp_path: Path) -> None:
    """Issue 14 item 11: a node named ``../x`` wrote outside ``--out``, and an existing symlink there was
    written through. Now the name is refused (exit 2, naming the field), and a link is replaced."""
    out = tmp_path / "out"
    out.mkdir()
    run = _render_out(tmp_path, "../escaped", out)
    assert run.returncode == 2, run
    assert "field 'name'" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "escaped.sh").exists()

    target = tmp_path / "target"
    target.write_text("keep me\n")
    (out / "box.sh").symlink_to(target)
    run = _render_out(tmp_path, "box", out)
    assert run.returncode == 0, run
    assert target.read_text() == "keep me\n", "the script was written through the link"
    assert not (out / "box.sh").is_symlink()
    assert (out / "box.sh").read_text().startswith("#!/bin/sh")
    assert (out / "box.sh").stat().st_mode & 0o777 == 0o700
