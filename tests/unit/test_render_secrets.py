"""Secrets in the training environment and arguments: ``{from_env: NAME}`` values come from this
machine's environment, are masked whenever a script is shown, referenced (never written) in scripts
saved for running by hand, and reach the nodes' launch scripts unchanged. Also `validate --dry-run`,
which shows the rank scripts (masked) and the command that would run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import InventoryError, UsageError
from orchestrator.inventory import PasswordResolver, load_inventory_text
from orchestrator.inventory.model import MASK, FromEnv, Node, masked_args
from orchestrator.platforms import PosixShell, platform_for_node
from orchestrator.records import unnonced
from orchestrator.render import Renderer, plan_launch, render_all, require_secrets
from orchestrator.steps.launch import run_node
from orchestrator.transports import Result, Transport, open_transport
from orchestrator.transports.options import SSHOptions
from tests import pwsh
from tests.conftest import BOOTSTRAP

# distinctive values: a test fails if any of them shows up where it must not
FROM_ENV = "wb-FROMENV-7f3a9c"
LITERAL = "pw-LITERAL-51d2e8"
TOKEN_ARG = "hf-TOKENARG-9b04aa"
KEY_ARG = "ak-KEYARG-c3e117"
SECRETS = (FROM_ENV, LITERAL, TOKEN_ARG, KEY_ARG)

INVENTORY = f"""\
cluster:
  name: sec
  master: a
  backend: gloo
  train:
    script: train.py
    args: [--epochs, 2, --hf-token, {TOKEN_ARG}, --api-key={KEY_ARG}]
    env:
      WANDB_API_KEY: {{from_env: CBT_WANDB}}
      DB_PASSWORD: {LITERAL}
      PLAIN: visible
nodes:
  - {{name: a, host: 10.255.0.1, user: root}}
  - {{name: b, host: 10.255.0.2, user: root, nproc: 2}}
"""

NATIVE = """\
cluster:
  backend: gloo
  train:
    env: {WANDB_API_KEY: {from_env: CBT_WANDB}}
nodes:
  - {name: win1, host: 10.255.0.1, os: windows, windows: {mode: native}}
"""


def _specs(text: str = INVENTORY) -> Any:
    inventory = load_inventory_text(text, "sec.yaml")
    specs = plan_launch(
        inventory,
        backend="gloo",
        master_addr="10.255.0.1",
        run_id="sec-1",
        interfaces={},
        cpus={},
        pythons={},
    )
    return inventory, specs


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("BOOTSTRAP_INVENTORY", "CBT_WANDB")}
    full.update({"NO_COLOR": "1", "HOME": str(cwd), **(env or {})})
    return subprocess.run(
        [BOOTSTRAP, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _no_secret_in(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"{secret} shown in:\n{text}"


# -- the inventory --------------------------------------------------------------------------------


def test_from_env_names_a_variable_and_the_inventory_json_shows_no_secret() -> None:
    inventory, _ = _specs()
    train = inventory.cluster.train
    assert train.env_dict["WANDB_API_KEY"] == FromEnv(from_env="CBT_WANDB")
    assert train.env_from == {"WANDB_API_KEY": "CBT_WANDB"}
    doc = inventory.public_dict()["cluster"]["train"]
    assert doc["env"] == {
        "WANDB_API_KEY": {"from_env": "CBT_WANDB"},
        "DB_PASSWORD": "********",
        "PLAIN": "visible",
    }
    assert doc["args"] == ["--epochs", "2", "--hf-token", "********", "--api-key=********"]
    _no_secret_in(json.dumps(inventory.public_dict()))


@pytest.mark.parametrize(
    "value", ["{from_env: 'hf-LEAKED value'}", "{from_env: A, default: x}", "{from_env: 3}"]
)
def test_a_wrong_from_env_names_the_field_and_never_echoes_the_value(value: str) -> None:
    text = f"cluster:\n  train:\n    env:\n      HF_TOKEN: {value}\nnodes: [{{host: h}}]\n"
    with pytest.raises(InventoryError) as wrong:
        load_inventory_text(text, "x.yaml")
    message = str(wrong.value)
    assert "x.yaml:3: field 'train.env'" in message and "HF_TOKEN: write {from_env: VARIABLE}" in message
    assert "LEAKED" not in message


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["--hf-token", "X", "--epochs", "3"], ["--hf-token", "********", "--epochs", "3"]),
        (["--api-key=X", "--lr=0.1"], ["--api-key=********", "--lr=0.1"]),
        (
            ["--DB_PASSWORD", "X", "--client-secret=Y"],
            ["--DB_PASSWORD", "********", "--client-secret=********"],
        ),
        (["--aws-credentials", "X"], ["--aws-credentials", "********"]),
        (["--use-token", "--epochs", "3"], ["--use-token", "--epochs", "3"]),  # a switch: nothing to hide
        (["--token="], ["--token="]),
        (["positional", "-k", "X", "--keep", "2"], ["positional", "-k", "X", "--keep", "2"]),
    ],
)
def test_secret_looking_flags_mask_their_value(args: list[str], shown: list[str]) -> None:
    assert list(masked_args(args)) == shown


# -- rendering: shown, referenced, launched -------------------------------------------------------


def test_shown_scripts_mask_every_secret() -> None:
    _, specs = _specs()
    shown = render_all(Renderer(environ={"CBT_WANDB": FROM_ENV}), specs, _posix(specs), mask=True)
    for text in shown.values():
        _no_secret_in(text)
        assert "export WANDB_API_KEY='********'\n" in text and "export DB_PASSWORD='********'\n" in text
        assert "--hf-token '********' '--api-key=********'" in text and "export PLAIN=visible\n" in text


def test_a_launch_renders_the_real_values_from_this_machines_environment() -> None:
    _, specs = _specs()
    text = Renderer(environ={"CBT_WANDB": FROM_ENV}).render(specs[0], PosixShell())
    assert f"export WANDB_API_KEY={FROM_ENV}\n" in text and f"export DB_PASSWORD={LITERAL}\n" in text
    assert f"--hf-token {TOKEN_ARG} --api-key={KEY_ARG}" in text
    for environ in ({}, {"CBT_WANDB": ""}):
        with pytest.raises(UsageError) as missing:
            Renderer(environ=environ).render(specs[0], PosixShell())
        assert "train.env.WANDB_API_KEY: environment variable CBT_WANDB is" in str(missing.value)
        assert "export CBT_WANDB=..." in str(missing.value)


def test_a_missing_variable_is_an_inventory_error_naming_field_and_variable() -> None:
    inventory, _ = _specs()
    require_secrets(inventory, {"CBT_WANDB": FROM_ENV})
    with pytest.raises(InventoryError) as missing:
        require_secrets(inventory, {})
    assert str(missing.value).startswith(
        "sec.yaml: field 'train.env.WANDB_API_KEY': environment variable CBT_WANDB is not set"
    )


def test_a_script_written_to_run_by_hand_requires_the_variable_instead_of_holding_it(tmp_path: Path) -> None:
    _, specs = _specs()
    written = render_all(Renderer(environ={"CBT_WANDB": FROM_ENV}), specs, _posix(specs), mask=False)["a"]
    assert FROM_ENV not in written
    line = (
        'export WANDB_API_KEY="${WANDB_API_KEY:?set WANDB_API_KEY first: a secret, not stored in this file}"'
    )
    assert line + "\n" in written
    assert f"export DB_PASSWORD={LITERAL}\n" in written  # literals: as the inventory has them
    # run by hand with a stand-in interpreter: it needs the variable, and gets it
    fake = tmp_path / "python3"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$WANDB_API_KEY"\n')
    fake.chmod(0o755)
    script = written.replace('cd "$HOME"/cluster-bootstrap/code', f"cd {tmp_path}")
    (tmp_path / "train.py").write_text("")  # the training script, where the script looks for it
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    unset = subprocess.run(["sh"], input=script, text=True, capture_output=True, env=env)
    assert unset.returncode != 0 and "WANDB_API_KEY: set WANDB_API_KEY first" in unset.stderr
    given = subprocess.run(
        ["sh"], input=script, text=True, capture_output=True, env={**env, "WANDB_API_KEY": "v1"}
    )
    assert given.returncode == 0 and given.stdout == "v1\n"


def test_native_windows_scripts_mask_reference_and_launch_secrets() -> None:
    inventory, specs = _specs(NATIVE)
    platform = platform_for_node(inventory.nodes[0])
    renderer = Renderer(environ={"CBT_WANDB": FROM_ENV})
    scripts = {
        mode: renderer.render(specs[0], platform, secrets=mode) for mode in ("mask", "reference", "value")
    }
    for text in scripts.values():
        assert pwsh.errors(pwsh.parse(text)) == []
    assert "$env:WANDB_API_KEY = '********'" in scripts["mask"] and FROM_ENV not in scripts["mask"]
    assert f"$env:WANDB_API_KEY = '{FROM_ENV}'" in scripts["value"]
    reference = scripts["reference"]
    assert FROM_ENV not in reference and "$env:WANDB_API_KEY =" not in reference
    tree = pwsh.parse(reference)
    checks = [n for n in pwsh.walk(tree.root_node) if n.type == "if_statement"]
    (check,) = [n for n in checks if b"$env:WANDB_API_KEY" in (n.text or b"")]
    assert (
        (check.text or b"")
        .decode()
        .startswith("if (-not $env:WANDB_API_KEY) { throw 'WANDB_API_KEY is not set")
    )


def _posix(specs: Any) -> dict[str, PosixShell]:
    return {s.node.name: PosixShell() for s in specs}


def _wire_cut(node: Node) -> tuple[Transport, list[str], dict[str, tuple[str, int | None]]]:
    """The node's real transport (as ``open_transport`` makes it, as `launch` uses it) with only
    its wire cut: each command's text exactly as its shell would get it (``plan``, what the SSH
    transport sends), and each upload's content and mode. Every command succeeds."""
    transport = open_transport(node, ssh=SSHOptions(), passwords=PasswordResolver(prompt=None))
    sent: list[str] = []
    files: dict[str, tuple[str, int | None]] = {}

    def run_raw(script: str, **_: Any) -> Result:
        sent.append(transport.plan(script))
        return Result(node.name, script, 0, "", "", 0.01)

    def put(local: Path, remote: str, *, mode: int | None = None) -> None:
        files[remote] = (local.read_text(), mode)

    transport.connect = lambda: None  # type: ignore[method-assign]
    transport.run_raw = run_raw  # type: ignore[method-assign]
    transport.put = put  # type: ignore[method-assign]
    return transport, sent, files


def test_each_node_gets_the_real_values_and_what_launch_dry_run_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`launch --dry-run` shows, per node, what a launch really sends: the same uploads, the same
    launch script but for the secrets (masked), the same text handed to the node's shell."""
    (tmp_path / "sec.yaml").write_text(INVENTORY)
    (tmp_path / "train.py").write_text("print('hi')\n")  # uploaded from the current directory
    dry = _cli("-i", "sec.yaml", "--json", "launch", "--dry-run", "--run-id", "sec-1", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    shown = {node["name"]: node for node in json.loads(dry.stdout)["nodes"]}
    inventory, specs = _specs()  # run id sec-1, the master's address from the inventory, as the dry run
    from orchestrator.bench.launch import attach_shares
    from orchestrator.executor import Outcome
    from orchestrator.steps.launch import LaunchPlan

    launching = LaunchPlan(
        list(specs), "gloo", "", [Outcome(s.node.name, None, None, 0.1) for s in specs], []
    )
    attach_shares(None, inventory, launching, "sec-1")  # type: ignore[arg-type]  # as a launch: equal shares
    specs = launching.specs
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # the ssh config read is the dry run's (none)
    sh = PosixShell()
    # what the dry run shows in place of each secret: the same word, quoted, with the value masked
    masked = {
        sh.quote(FROM_ENV): sh.quote(MASK),
        sh.quote(LITERAL): sh.quote(MASK),
        sh.quote(TOKEN_ARG): sh.quote(MASK),
        sh.quote(f"--api-key={KEY_ARG}"): sh.quote(f"--api-key={MASK}"),
    }
    assert {spec.node.name for spec in specs} == set(shown) == {"a", "b"}
    for spec in specs:
        transport, sent, files = _wire_cut(spec.node)
        run_node(spec.node, transport, spec, renderer=Renderer(environ={"CBT_WANDB": FROM_ENV}))
        planned = shown[spec.node.name]
        assert list(files) == planned["uploads"]  # launch.sh, rank capture, the shares, train.py
        script, mode = files[planned["uploads"][0]]
        assert mode == 0o700  # it holds the secrets
        assert f"export WANDB_API_KEY={FROM_ENV}\n" in script and f"export DB_PASSWORD={LITERAL}\n" in script
        assert f"--hf-token {TOKEN_ARG} --api-key={KEY_ARG}\n" in script
        for real, mask in masked.items():
            script = script.replace(real, mask)
        assert script == planned["script"]
        # the text that runs it, byte for byte but for the run's sample nonce (its own per run)
        assert unnonced([sent[-1]]) == unnonced([planned["commands"][0]])
        # the whole plan: every command the node's shell got, in order, is what the dry run showed
        # (each run's record nonce is its own: orchestrator/records.py)
        assert unnonced(sent) == unnonced([*planned["prepare"], *planned["commands"]])
        _no_secret_in(json.dumps(planned))


# -- the CLI ----------------------------------------------------------------------------------------


def test_render_never_prints_a_secret_and_writes_references(tmp_path: Path) -> None:
    inventory = tmp_path / "sec.yaml"
    inventory.write_text(INVENTORY)
    env = {"CBT_WANDB": FROM_ENV}
    shown = _cli("-vv", "-i", str(inventory), "render", "--offline", cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "export WANDB_API_KEY='********'" in shown.stdout
    as_json = _cli("-vv", "-i", str(inventory), "--json", "render", "--offline", cwd=tmp_path, env=env)
    assert as_json.returncode == 0, as_json.stderr
    assert set(json.loads(as_json.stdout)["scripts"]) == {"a", "b"}
    written = _cli("-vv", "-i", str(inventory), "render", "--offline", "--out", "out", cwd=tmp_path, env=env)
    assert written.returncode == 0, written.stderr
    _no_secret_in(shown.stdout, shown.stderr, as_json.stdout, as_json.stderr, written.stdout, written.stderr)
    script = (tmp_path / "out" / "a.sh").read_text()
    assert FROM_ENV not in script and '"${WANDB_API_KEY:?set WANDB_API_KEY first' in script
    inventory_json = _cli("-i", str(inventory), "--json", "inventory", cwd=tmp_path, env=env)
    assert inventory_json.returncode == 0 and '"from_env": "CBT_WANDB"' in inventory_json.stdout
    _no_secret_in(inventory_json.stdout)


def test_launch_hands_the_secret_to_training_and_prints_it_nowhere(tmp_path: Path) -> None:
    """A local node; a stand-in for torchrun runs the training script with this machine's Python."""
    fake = tmp_path / "fakepython"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ "$2" = torch.distributed.run ]; then\n'
        "  shift 2\n"
        '  while [ $# -gt 0 ]; do case "$1" in *.py) break;; esac; shift; done\n'
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    (tmp_path / "train.py").write_text(
        "import os, sys\n"
        "seen = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'seen.txt')\n"
        "open(seen, 'w').write(os.environ['WANDB_API_KEY'] + ' ' + ' '.join(sys.argv[1:]))\n"
        "print('training saw its secrets', flush=True)\n"
    )
    work = tmp_path / "work"
    text = INVENTORY.split("nodes:")[0] + (
        f"nodes:\n  - {{name: a, connection: local, workdir: {work}, python: {fake}}}\n"
    )
    (tmp_path / "sec.yaml").write_text(text)
    missing = _cli("-i", "sec.yaml", "launch", cwd=tmp_path)
    assert missing.returncode == 2, missing
    assert "field 'train.env.WANDB_API_KEY': environment variable CBT_WANDB is not set" in missing.stderr
    run = _cli(
        "-vv", "-i", "sec.yaml", "launch", "--run-id", "sec-1", cwd=tmp_path, env={"CBT_WANDB": FROM_ENV}
    )
    assert run.returncode == 0, run.stderr
    assert "[a:0] training saw its secrets" in run.stdout  # through the per-rank capture
    _no_secret_in(
        run.stdout, run.stderr, *(p.read_text() for p in (tmp_path / "runs").rglob("*") if p.is_file())
    )
    assert (
        work / "code" / "seen.txt"
    ).read_text() == f"{FROM_ENV} --epochs 2 --hf-token {TOKEN_ARG} --api-key={KEY_ARG}"
    launch_sh = work / "runs" / "sec-1" / "a" / "launch.sh"
    assert f"export WANDB_API_KEY={FROM_ENV}\n" in launch_sh.read_text()
    assert launch_sh.stat().st_mode & 0o777 == 0o700


def test_validate_dry_run_shows_each_nodes_script_masked_and_its_command(tmp_path: Path) -> None:
    inventory = tmp_path / "sec.yaml"
    inventory.write_text(INVENTORY)
    run = _cli("-vv", "-i", str(inventory), "validate", "--dry-run", "--sizes", "4K", cwd=tmp_path)
    assert run.returncode == 0, run.stderr  # the variable is not needed: nothing runs
    _no_secret_in(run.stdout, run.stderr)
    out = run.stdout
    # the node's plan in the order it is applied: the preparation, the uploads, the launcher
    prepare = "# ---- a (ssh root@10.255.0.1): would run as the login user (refuse a run id used before; "
    assert out.startswith(prepare)
    assert "\n# ---- a (ssh root@10.255.0.1): would upload ~/cluster-bootstrap/runs/validate-sec-" in out
    assert out.count("export WANDB_API_KEY='********'") == 2
    assert "RANK=1 LOCAL_RANK=0 python3 " in out and "RANK=2 LOCAL_RANK=1 python3 " in out
    assert "python3 validate_worker.py --backend gloo --timeout 60 --sizes 4096 &" in out
    assert "# ---- b (ssh root@10.255.0.2): would run as the login user (the launcher):\n" in out
    # the exact text the node's shell gets: the script run with its log, stopped on hang-up
    assert '/bin/sh "$HOME"/cluster-bootstrap/runs/validate-sec-' in out and "setsid" in out
    assert "nothing was uploaded or started" in run.stderr
    assert not (tmp_path / "runs").exists()  # nothing ran, nothing was logged
    doc = json.loads(_cli("-i", str(inventory), "--json", "validate", "--dry-run", cwd=tmp_path).stdout)
    assert doc["command"] == "validate" and doc["dry_run"] is True and doc["backend"] == "gloo"
    assert [n["name"] for n in doc["nodes"]] == ["a", "b"]
    node = doc["nodes"][1]
    assert node["via"] == "ssh root@10.255.0.2" and node["run_dir"].endswith("/b")
    assert node["uploads"][0] == node["run_dir"] + "/launch.sh"
    assert node["uploads"][1].endswith("/validate_worker.py")
    assert "RANK=2 LOCAL_RANK=1" in node["script"] and "launch.sh" in node["commands"][0]
    _no_secret_in(json.dumps(doc))


def test_a_missing_templates_directory_stops_only_the_commands_that_render(tmp_path: Path) -> None:
    """A moved `train.templates` directory must not keep a run from being stopped."""
    inventory = tmp_path / "sec.yaml"
    inventory.write_text(INVENTORY.replace("  train:\n", "  train:\n    templates: tpl\n"))
    for command in (
        ["inventory"],
        ["--dry-run", "stop", "--run", "sec-1"],
        ["--dry-run", "status", "--run", "sec-1"],
    ):
        run = _cli("-i", str(inventory), *command, cwd=tmp_path)
        assert run.returncode == 0, (command, run.stderr)
    for command in (["render", "--offline"], ["validate", "--dry-run"], ["launch", "--dry-run"]):
        run = _cli("-i", str(inventory), *command, cwd=tmp_path)
        assert run.returncode == 2, (command, run.stderr)
        assert f"sec.yaml:6: field 'train.templates': {tmp_path / 'tpl'} does not exist" in run.stderr
    assert not (tmp_path / "runs").exists()


def test_validate_uses_the_inventorys_templates_and_needs_the_variable(tmp_path: Path) -> None:
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "ranks.sh.j2").write_text("echo my ranks for {{ node.name }}: {{ nproc }}\n")
    inventory = tmp_path / "sec.yaml"
    inventory.write_text(INVENTORY.replace("  train:\n", "  train:\n    templates: tpl\n"))
    run = _cli("-i", str(inventory), "validate", "--dry-run", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "echo my ranks for a: 1\n" in run.stdout and "echo my ranks for b: 2\n" in run.stdout
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "ranks.sh.j2").write_text("echo from the command line\n")
    run = _cli("-i", str(inventory), "validate", "--dry-run", "--templates", "cli", cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.count("echo from the command line\n") == 2, run  # it wins
    missing = _cli("-i", str(inventory), "validate", cwd=tmp_path)
    assert missing.returncode == 2, missing  # before connecting to anything
    assert "field 'train.env.WANDB_API_KEY': environment variable CBT_WANDB is not set" in missing.stderr


def test_a_dry_run_warns_of_a_secret_the_real_launch_would_stop_on(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(
        "cluster: {name: s, train: {env: {HF_TOKEN: {from_env: CBT_UNSET_FOR_THIS_TEST}}}}\n"
        "nodes: [{name: a, host: 10.255.0.1}]\n"
    )
    dry = _cli("-i", "s.yaml", "launch", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr  # the dry run shows the plan, masked
    assert "field 'train.env.HF_TOKEN': environment variable CBT_UNSET_FOR_THIS_TEST is not set" in dry.stderr
    assert "(a real launch stops here, exit 2)" in dry.stderr
    real = _cli("-i", "s.yaml", "launch", cwd=tmp_path)
    assert real.returncode == 2 and "CBT_UNSET_FOR_THIS_TEST is not set" in real.stderr


def test_a_login_inside_a_url_is_masked_where_scripts_are_shown_and_sent_as_it_is() -> None:
    text = (
        "cluster:\n  train:\n    args: [--data, 'https://bob:pw-in-arg-881@data.lab/x']\n"
        "    env: {HTTPS_PROXY: 'http://u:pw-in-env-882@proxy:3128'}\nnodes: [{name: a, host: h}]\n"
    )
    _, (spec,) = _specs(text)
    shown = Renderer().render(spec, PosixShell(), mask=True)
    assert "export HTTPS_PROXY='http://***@proxy:3128'" in shown and "'https://***@data.lab/x'" in shown
    assert "pw-in-" not in shown
    sent = Renderer().render(spec, PosixShell())  # what a launch runs: the real values
    assert "http://u:pw-in-env-882@proxy:3128" in sent and "https://bob:pw-in-arg-881@data.lab/x" in sent
