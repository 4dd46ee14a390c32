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
