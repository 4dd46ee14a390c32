"""Passwords: environment, prompts (each secret once), missing secrets, and secrets never shown."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest

from orchestrator.errors import InventoryError, SecretMissingError
from orchestrator.inventory import Node, PasswordResolver, load_inventory_text

SECRET = "Zebra-Quokka-9317!"


class CountingPrompt:
    def __init__(self, answer: str = SECRET) -> None:
        self.answer = answer
        self.questions: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, question: str) -> str:
        with self._lock:
            self.questions.append(question)
        return self.answer


def win(name: str, **kw: object) -> Node:
    return Node.model_validate({"name": name, "host": f"{name}.lan", "os": "windows", **kw})


def test_no_password_needed() -> None:
    prompt = CountingPrompt()
    assert PasswordResolver(prompt, {}).password_for(Node(name="a", host="a")) is None
    assert prompt.questions == []


def test_reads_environment() -> None:
    resolver = PasswordResolver(None, {"WIN_PASS": SECRET})
    assert resolver.password_for(win("a", password_env="WIN_PASS")) == SECRET


def test_prompts_once_for_two_nodes_sharing_a_variable() -> None:
    prompt = CountingPrompt()
    resolver = PasswordResolver(prompt, {})
    a, b = win("a", password_env="WIN_PASS"), win("b", password_env="WIN_PASS")
    assert resolver.password_for(a) == SECRET
    assert resolver.password_for(b) == SECRET
    assert prompt.questions == ["Password for node 'a' (WIN_PASS is not set): "]


def test_distinct_variables_are_asked_separately() -> None:
    prompt = CountingPrompt()
    resolver = PasswordResolver(prompt, {})
    resolver.password_for(win("a", password_env="PASS_A"))
    resolver.password_for(win("b", password_env="PASS_B"))
    assert len(prompt.questions) == 2


def test_missing_without_prompt_raises() -> None:
    resolver = PasswordResolver(None, {})
    with pytest.raises(SecretMissingError) as info:
        resolver.password_for(win("a", password_env="WIN_PASS"))
    err = info.value
    assert err.node == "a"
    assert "WIN_PASS" in err.message
    assert err.hint == "export WIN_PASS=... or run from a terminal to be prompted"


def test_empty_variable_counts_as_missing() -> None:
    prompt = CountingPrompt()
    assert (
        PasswordResolver(prompt, {"WIN_PASS": ""}).password_for(win("a", password_env="WIN_PASS")) == SECRET
    )
    assert prompt.questions == ["Password for node 'a' (WIN_PASS is empty): "]


def test_password_prompt_once_per_user_and_host() -> None:
    prompt = CountingPrompt()
    resolver = PasswordResolver(prompt, {})
    one = Node(name="one", host="box", port=2201, user="u", password_prompt=True)
    two = Node(name="two", host="box", port=2202, user="u", password_prompt=True)
    other_user = Node(name="three", host="box", port=2203, user="v", password_prompt=True)
    for node in (one, two, other_user):
        assert resolver.password_for(node) == SECRET
    assert len(prompt.questions) == 2
    assert "u@box" in prompt.questions[0]


def test_password_prompt_without_terminal_raises() -> None:
    with pytest.raises(SecretMissingError, match="no terminal"):
        PasswordResolver(None, {}).password_for(Node(name="a", host="a", password_prompt=True))


def test_concurrent_requests_prompt_once() -> None:
    prompt = CountingPrompt()
    resolver = PasswordResolver(prompt, {})
    nodes = [win(f"n{i}", password_env="WIN_PASS") for i in range(16)]
    results: list[str | None] = []
    barrier = threading.Barrier(len(nodes))

    def work(node: Node) -> None:
        barrier.wait()
        results.append(resolver.password_for(node))

    threads = [threading.Thread(target=work, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [SECRET] * 16
    assert len(prompt.questions) == 1


ANSIBLE_LITERAL = f"""all:
  hosts:
    w1:
      ansible_connection: winrm
      ansible_password: "{SECRET}"
    w2:
      ansible_connection: winrm
      ansible_password: "{SECRET}"
      bootstrap_password_env: W2_PASS
"""


def test_ansible_literal_password_is_resolved_but_never_shown() -> None:
    inv = load_inventory_text(ANSIBLE_LITERAL, "lit.yaml")
    resolver = PasswordResolver(None, {})
    w1, w2 = inv.nodes
    assert resolver.password_for(w1) == SECRET
    assert resolver.password_for(w2) == SECRET  # W2_PASS not set: the inventory value is used
    assert PasswordResolver(None, {"W2_PASS": "from-env"}).password_for(w2) == "from-env"
    assert w1.password_source == "inventory"
    assert any("ansible_password is a literal value on hosts w1, w2" in n for n in inv.notes)

    shown: list[Callable[[], str]] = [
        lambda: repr(inv),
        lambda: str(inv),
        lambda: str(w1),
        lambda: repr(w1),
        lambda: json.dumps(inv.public_dict()),
        lambda: json.dumps(w1.model_dump(mode="json")),
        lambda: "\n".join(inv.notes),
        lambda: repr(resolver),
    ]
    for show in shown:
        assert SECRET not in show()


def test_secret_never_in_inventory_errors() -> None:
    texts = [
        # literal password next to an unrelated error
        ANSIBLE_LITERAL + "      bootstrap_gpus: lots\n",
        # a password written where a variable NAME belongs
        f"nodes:\n  - host: a\n    password_env: '{SECRET}'\n",
        # a templated password that is not an env lookup
        "all:\n  hosts:\n    w:\n      ansible_password: \"{{ '" + SECRET + "' }}\"\n",
        # wrong type for the password
        f"all:\n  hosts:\n    w:\n      ansible_password: ['{SECRET}']\n",
        # duplicate key with secret values
        f"all:\n  hosts:\n    w:\n      ansible_password: '{SECRET}'\n      ansible_password: '{SECRET}x'\n",
        # a password put in an unknown native field
        f"nodes:\n  - host: a\n    password: '{SECRET}'\n",
    ]
    for text in texts:
        with pytest.raises(InventoryError) as info:
            load_inventory_text(text, "s.yaml")
        assert SECRET not in str(info.value), str(info.value)
        assert SECRET not in repr(info.value.issues)


def test_password_env_name_is_public() -> None:
    inv = load_inventory_text("nodes:\n  - {host: w, os: windows, password_env: WIN_PASS}\n", "p.yaml")
    node = inv.public_dict()["nodes"][0]
    assert node["password_env"] == "WIN_PASS"
    assert node["password_source"] == "env:WIN_PASS"
