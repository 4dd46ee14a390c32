"""A run's own arguments and environment: `launch ... -- ARGS`, `bootstrap ... -- ARGS`, `-e NAME=VALUE`.

They replace train.args (and add to train.env) for that run only; the rendered script quotes them as
every inventory value; the run record keeps them and `status` shows them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.inventory import load_inventory
from orchestrator.inventory.model import MASK
from orchestrator.runs.layout import read_record, train_record

INVENTORY = """\
cluster:
  name: lab
  train: {script: train.py, args: [--epochs, "3"], env: {KEEP: "1", LR_SCHED: step}}
nodes:
  - {name: a, host: 192.0.2.1}
  - {name: b, host: 192.0.2.2}
"""


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "-i", "lab.yaml", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_launch_args_after_the_double_dash_replace_the_inventorys_quoted(tmp_path: Path) -> None:
    (tmp_path / "lab.yaml").write_text(INVENTORY)
    (tmp_path / "train.py").write_text("print('hi')\n")
    dry = _cli(
        tmp_path, "--json", "launch", "--dry-run", "--run-id", "r1", "-e", "LR_SCHED=cos", "-e", "NEW=a b",
        "--", "--lr", "0.1; touch pwned", "--name=$HOME",
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    for node in json.loads(dry.stdout)["nodes"]:
        script = node["script"]
        assert "python3 train.py --lr '0.1; touch pwned' '--name=$HOME'\n" in script, script
        assert "--epochs" not in script  # replaced, not appended
        assert "export KEEP=1\n" in script and "export LR_SCHED=cos\n" in script  # added to, overriding
        assert "export NEW='a b'\n" in script
        assert "export CB_RUN_ID=r1\n" in script and 'export CB_RUN_DIR="$cb_dir/out"\n' in script
    plain = _cli(tmp_path, "--json", "launch", "--dry-run", "--run-id", "r1")
    assert "python3 train.py --epochs 3\n" in json.loads(plain.stdout)["nodes"][0]["script"]


def test_launch_options_meant_for_the_script_are_a_usage_error_naming_the_double_dash(tmp_path: Path) -> None:
    (tmp_path / "lab.yaml").write_text(INVENTORY)
    run = _cli(tmp_path, "launch", "--dry-run", "--lr", "0.1")
    assert run.returncode == 2
    # the line to type carries the -i this one had: pasted, it acts on the same inventory
    assert (
        "No such option: --lr." in run.stderr and "`bootstrap -i lab.yaml launch -- --lr ...`" in run.stderr
    )
    assert "--help" not in run.stderr.split("Error:")[1]  # click's "Did you mean '--help'?" is noise here
    # the main pipeline's form says the same (it took the words for an unknown option of its own)
    pipeline = _cli(tmp_path, "--dry-run", "--lr", "0.1")
    assert pipeline.returncode == 2 and "`bootstrap -i lab.yaml -- --lr ...`" in pipeline.stderr, (
        pipeline.stderr
    )
    bad = _cli(tmp_path, "launch", "--dry-run", "-e", "1X=2")
    assert bad.returncode == 2, bad.stderr
    assert "--env '1X=...': invalid environment variable name" in bad.stderr, bad.stderr
    # the value of a mistyped -e is never repeated: it may be the secret itself
    for pair in ("HF-TOKEN=hf_s3cret", "hf_s3cret", "AKIAIOSFODNN7S3CRET"):
        typo = _cli(tmp_path, "launch", "--dry-run", "-e", pair)
        assert typo.returncode == 2 and "s3cret" not in typo.stderr and "--env" in typo.stderr, typo.stderr


def test_words_for_the_script_typed_before_the_double_dash_are_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    """`launch other.py` (meant --script) and `launch 0.1` started every node for a script that then
    refused the word; they are usage errors naming the line to type (the nodes, TEST-NET addresses,
    are never contacted)."""
    (tmp_path / "lab.yaml").write_text(INVENTORY)
    (tmp_path / "train.py").write_text("print('hi')\n")
    script = _cli(tmp_path, "launch", "other.py")
    assert script.returncode == 2, script.stderr
    assert "other.py: words for the training script go after `--`" in script.stderr, script.stderr
    assert "`bootstrap -i lab.yaml launch --script other.py` trains that script" in script.stderr
    # the line to type keeps every other option and the words after `--`: typed, it is the same job
    kept = _cli(tmp_path, "launch", "--nodes", "a", "--detach", "-e", "A=1", "other.py", "--", "--steps", "1")
    assert kept.returncode == 2, kept.stderr
    assert (
        "`bootstrap -i lab.yaml launch --script other.py --nodes a --detach -e A=1 -- --steps 1`"
        in kept.stderr
    )
    # a word that is also an option's value: the stray one moves, the value stays
    twice = _cli(tmp_path, "launch", "a", "--nodes", "a")
    assert twice.returncode == 2 and "`bootstrap -i lab.yaml launch --nodes a -- a`" in twice.stderr, twice
    # a line holding a secret-looking value is never repeated (nor the value)
    secret = _cli(tmp_path, "launch", "-e", "HF_TOKEN=hf_s3cret", "other.py")
    assert secret.returncode == 2 and "hf_s3cret" not in secret.stderr, secret
    assert "`--script other.py` trains that script (the line typed is not repeated here" in secret.stderr
    token = _cli(tmp_path, "launch", "hf_s3cretaaaabbbbcccc")  # a token pasted alone
    assert token.returncode == 2 and "s3cret" not in token.stderr, token
    stray = _cli(tmp_path, "launch", "HF_TOKEN=hf_s3cret")  # the stray word is the secret
    assert stray.returncode == 2 and "hf_s3cret" not in stray.stderr, stray
    assert "1 word(s) before `--`: words for the training script go after `--`" in stray.stderr, stray
    number = _cli(tmp_path, "launch", "0.1", "--", "--lr", "1")
    assert number.returncode == 2 and "`bootstrap -i lab.yaml launch -- 0.1 --lr 1`" in number.stderr, number
    after = _cli(tmp_path, "--json", "launch", "--dry-run", "--", "0.1")  # after `--`: the script's
    assert (
        after.returncode == 0 and "python3 train.py 0.1\n" in json.loads(after.stdout)["nodes"][0]["script"]
    )
    # -i typed after the command is kept in the line to type too
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1"}
    late = subprocess.run(
        [sys.executable, "-m", "orchestrator", "launch", "-i", "lab.yaml", "--lr=0.1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert late.returncode == 2 and "`bootstrap -i lab.yaml launch -- --lr ...`" in late.stderr, late.stderr


def test_the_run_record_keeps_what_the_command_line_changed(tmp_path: Path) -> None:
    (tmp_path / "lab.yaml").write_text(INVENTORY)
    inventory = load_inventory(tmp_path / "lab.yaml")
    run = inventory.for_run(["--lr", "0.1", "--api-key", "s3cret"], {"NEW": "1", "HF_TOKEN": "hf_x"})
    assert run.cluster.train.args == ("--lr", "0.1", "--api-key", "s3cret")
    assert run.cluster.train.env_dict == {"KEEP": "1", "LR_SCHED": "step", "NEW": "1", "HF_TOKEN": "hf_x"}
    assert inventory.cluster.train.args == ("--epochs", "3")  # the inventory itself is unchanged
    assert inventory.for_run(None, {}) is inventory
    record = train_record(run)
    assert record == {
        "script": "train.py",
        "args": ["--lr", "0.1", "--api-key", MASK],
        "args_from": "command line",
        "env": {"NEW": "1", "HF_TOKEN": MASK},
    }
    assert train_record(inventory)["args_from"] == "inventory"
    # a URL's login, in an argument or a value, is masked as --dry-run and --json mask it
    logins = inventory.for_run(["--data", "http://u:pw@h/x"], {"https_proxy": "http://u:pw@proxy:3128"})
    assert train_record(logins) == {
        "script": "train.py",
        "args": ["--data", "http://***@h/x"],
        "args_from": "command line",
        "env": {"https_proxy": "http://***@proxy:3128"},
    }


def test_a_record_an_older_version_wrote_with_a_login_is_shown_masked() -> None:
    from orchestrator.runs.layout import train_args_line

    old = {"args": ["--data", "http://u:pw@h/x"], "args_from": "command line", "env": {"P": "s://t@h"}}
    assert train_args_line(old) == "args: --data 'http://***@h/x' (command line); env: P='s://***@h'"


def test_status_shows_the_runs_arguments(tmp_path: Path) -> None:
    """`status` prints the arguments the run got (from its record here), whatever the nodes say."""
    from orchestrator.runs.layout import train_args_line

    record = {"script": "t.py", "args": ["--lr", "0.1"], "args_from": "command line", "env": {"A": "x y"}}
    assert train_args_line(record) == "args: --lr 0.1 (command line); env: A='x y'"
    assert train_args_line({"args": [], "args_from": "inventory", "env": {}}) == ""
    assert read_record(tmp_path) is None


def test_a_syntax_error_in_the_script_stops_before_anything_connects(tmp_path: Path) -> None:
    """The nodes (TEST-NET addresses) are never contacted: one line names the file and line, exit 2."""
    import time

    (tmp_path / "lab.yaml").write_text(INVENTORY)
    (tmp_path / "train.py").write_text("import os\n\ndef main(:\n    pass\n")
    for command in (["launch"], ["launch", "--dry-run"], []):
        begin = time.monotonic()
        run = _cli(tmp_path, *command)
        assert run.returncode == 2, (command, run.stderr)
        assert time.monotonic() - begin < 10  # an unreachable node would cost its connect timeout
        [line] = run.stderr.strip().splitlines()
        assert line.startswith("error: train.py, line 3: invalid syntax: "), line
        assert "the training script does not compile" in line


def test_inventory_and_the_pipeline_agree_on_a_requirements_file_left_behind(tmp_path: Path) -> None:
    """An inventory copied elsewhere without its requirements file: `inventory` says what the
    pipeline says (the field, the resolved path), both exit 2 before connecting."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    copy = INVENTORY.replace("  name: lab\n", "  name: lab\n  env: {requirements: reqs.txt}\n")
    (tmp_path / "lab.yaml").write_text(copy)
    missing = tmp_path / "reqs.txt"
    shown = _cli(tmp_path, "inventory")
    run = _cli(tmp_path)
    for result in (shown, run):
        assert result.returncode == 2, result.stderr
        assert f"env.requirements: cannot read {missing}: No such file or directory" in result.stderr
        assert f"relative to the inventory file's directory ({tmp_path})" in result.stderr
    missing.write_text("torch==2.13.0\n")
    assert _cli(tmp_path, "inventory").returncode == 0


THREE = """\
cluster:
  name: lab
  master: a
  train: {script: train.py}
nodes:
  - {name: a, host: 192.0.2.1}
  - {name: b, host: 192.0.2.2}
  - {name: c, host: 192.0.2.3}
"""


def _planned(stdout: str) -> dict[str, list[str]]:
    """node -> the torchrun lines that size and place it, from `launch --dry-run --json`."""
    keys = ("--nnodes", "--node-rank", "--master-addr")
    return {
        n["name"]: [line.strip(" \\") for line in n["script"].splitlines() if line.strip().startswith(keys)]
        for n in json.loads(stdout)["nodes"]
    }


def test_nodes_size_the_job_and_the_master_must_be_among_them(tmp_path: Path) -> None:
    """`--nodes` means the nodes the run uses, for launch and validate too: --nnodes, ranks and the
    world size follow them; without the master, --master names another one (it becomes node rank 0,
    which hosts the static rendezvous at the master's address)."""
    (tmp_path / "lab.yaml").write_text(THREE)
    (tmp_path / "train.py").write_text("print('hi')\n")
    two = _cli(tmp_path, "--json", "launch", "--dry-run", "--nodes", "a,b")
    assert two.returncode == 0, two.stderr
    assert _planned(two.stdout) == {
        "a": ["--nnodes 2", "--node-rank 0", "--master-addr 192.0.2.1"],
        "b": ["--nnodes 2", "--node-rank 1", "--master-addr 192.0.2.1"],
    }
    assert "runs every node of the inventory" not in two.stderr
    headless = _cli(tmp_path, "launch", "--dry-run", "--nodes", "b,c")
    assert headless.returncode == 2
    assert "the master a is not among the nodes this run uses (b, c)" in headless.stderr
    assert "--master NODE" in headless.stderr
    moved = _cli(tmp_path, "--json", "launch", "--dry-run", "--nodes", "b,c", "--master", "c")
    assert _planned(moved.stdout) == {
        "c": ["--nnodes 2", "--node-rank 0", "--master-addr 192.0.2.3"],
        "b": ["--nnodes 2", "--node-rank 1", "--master-addr 192.0.2.3"],
    }
    validate = _cli(tmp_path, "--json", "validate", "--dry-run", "--nodes", "a,c")
    assert validate.returncode == 0, validate.stderr
    assert [n["name"] for n in json.loads(validate.stdout)["nodes"]] == ["a", "c"]


def test_nodes_refuse_what_cannot_be_sized_down(tmp_path: Path) -> None:
    inventory_text = THREE.replace(
        "train: {script: train.py}", "train: {script: train.py, shares: [1, 2, 3]}"
    )
    (tmp_path / "lab.yaml").write_text(inventory_text)
    inventory = load_inventory(tmp_path / "lab.yaml")
    import pytest

    from orchestrator.errors import UsageError

    with pytest.raises(UsageError, match=r"train\.shares lists fixed shares"):
        inventory.only(inventory.select(["a,b"]))
    assert inventory.only(list(inventory.nodes)) is inventory
    elastic = THREE.replace(
        "train: {script: train.py}", "train: {script: train.py, elastic: true, min_nodes: 3}"
    )
    (tmp_path / "lab.yaml").write_text(elastic)
    inventory = load_inventory(tmp_path / "lab.yaml")
    with pytest.raises(UsageError, match=r"train\.min_nodes is 3, but this run uses 2 node"):
        inventory.only(inventory.select(["a,b"]))


def test_a_run_without_train_script_names_the_example_and_script_picks_the_users(tmp_path: Path) -> None:
    """An inventory without train.script (an Ansible one has no train section) trained the shipped
    example while the user's train.py sat here, and nothing said which script ran. It is said (a
    warning naming the way out), and `--script` trains the user's for this run."""
    (tmp_path / "lab.yaml").write_text("cluster: {name: lab}\nnodes:\n  - {name: a, host: 192.0.2.1}\n")
    (tmp_path / "train.py").write_text("print('mine')\n")
    dry = _cli(tmp_path, "--json", "launch", "--dry-run", "--run-id", "r1")
    assert dry.returncode == 0, dry.stderr
    assert "script: examples/train_ddp.py, the example shipped with bootstrap" in dry.stderr, dry.stderr
    assert "so train.py here is not what runs" in dry.stderr and "`--script train.py`" in dry.stderr
    mine = _cli(
        tmp_path, "--json", "launch", "--dry-run", "--run-id", "r1", "--script", "train.py", "--", "--x"
    )
    assert mine.returncode == 0 and "shipped with bootstrap" not in mine.stderr, mine.stderr
    assert "python3 train.py --x\n" in json.loads(mine.stdout)["nodes"][0]["script"]
    bad = _cli(tmp_path, "launch", "--dry-run", "--script", "a\nb.py")
    assert bad.returncode == 2 and "--script 'a\\nb.py': not one line of a file name" in bad.stderr, (
        bad.stderr
    )
    option = _cli(tmp_path, "launch", "--dry-run", "--script=-c", "--", "import os")  # python's own option
    assert option.returncode == 2 and "starts with '-', which python reads as an option" in option.stderr
    run = load_inventory(tmp_path / "lab.yaml").for_run(None, {}, "train.py")
    from orchestrator.runs.layout import train_args_line

    assert train_args_line(train_record(run)) == "script: train.py (command line)"
