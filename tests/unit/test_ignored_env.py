"""train.env variables the tutorials recommend but nothing reads: launch warns, naming each."""

from __future__ import annotations

from orchestrator.inventory import load_inventory_text
from orchestrator.steps.launch import ignored_env_warnings


def test_variables_nothing_reads_are_named_with_what_works_instead() -> None:
    inventory = load_inventory_text(
        "cluster:\n  master: a\n  train:\n    env: {GLOO_TIMEOUT_SECONDS: '300',"
        " TORCH_DISTRIBUTED_BACKEND: gloo, NCCL_DEBUG: INFO}\nnodes:\n  - {name: a, host: 10.0.0.1}\n",
        "lab.yaml",
    )
    warnings = ignored_env_warnings(inventory)
    assert len(warnings) == 2
    assert "GLOO_TIMEOUT_SECONDS" in warnings[0] and "init_process_group(timeout=" in warnings[0]
    assert "TORCH_DISTRIBUTED_BACKEND" in warnings[1] and "CLUSTER_BOOTSTRAP_BACKEND" in warnings[1]


def test_nothing_to_say_about_variables_that_work() -> None:
    inventory = load_inventory_text(
        "cluster: {master: a, train: {env: {NCCL_DEBUG: INFO}}}\nnodes:\n  - {name: a, host: 10.0.0.1}\n",
        "lab.yaml",
    )
    assert ignored_env_warnings(inventory) == []


def test_elastic_on_torch_before_2_2_is_said_to_show_local_ranks() -> None:
    from types import SimpleNamespace

    from orchestrator.facts.linux import TorchInfo
    from orchestrator.steps.launch import old_torch_label_warnings

    facts = [
        SimpleNamespace(
            node=SimpleNamespace(name="old"), torch=TorchInfo(installed=True, version="2.1.2+cu121")
        ),
        SimpleNamespace(
            node=SimpleNamespace(name="new"), torch=TorchInfo(installed=True, version="2.13.0+cpu")
        ),
        SimpleNamespace(node=SimpleNamespace(name="none"), torch=None),
    ]
    (warning,) = old_torch_label_warnings(facts)  # type: ignore[arg-type]
    assert "'old'" in warning and "torch 2.1.2+cu121" in warning and "2.2" in warning
