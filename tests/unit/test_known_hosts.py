"""known_hosts reading (pure logic): host patterns as OpenSSH matches them, revocations with their
file:line, and fix hints naming the key type a node really offered."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest

from orchestrator.cli.report import fail_lines
from orchestrator.cli.ui import UI
from orchestrator.errors import ConnectError, HostKeyUnknownError
from orchestrator.executor import Outcome
from orchestrator.transports.known_hosts import KnownHosts, compare_command, host_matches, lookup_name


@pytest.mark.parametrize(
    ("hosts", "name", "expected"),
    [
        ("10.0.0.5", "10.0.0.5", True),
        ("10.0.0.5", "10.0.0.50", False),
        ("Node1.Lab", "node1.lab", True),  # names compare case-insensitively
        ("*", "anything", True),
        ("10.0.0.*", "10.0.0.7", True),
        ("10.0.0.?", "10.0.0.17", False),
        ("a,b,c", "b", True),
        ("!10.0.0.5,*", "10.0.0.5", False),  # one negated match excludes the host
        ("!10.0.0.5,*", "10.0.0.6", True),
        ("!10.0.0.5", "10.0.0.6", False),  # a negation alone matches nothing
        ("[10.0.0.5]:2222", "[10.0.0.5]:2222", True),  # brackets are literal, not a character class
        ("[10.0.0.5]:2222", "10.0.0.5", False),
        ("|1|bad|hash", "10.0.0.5", False),
    ],
)
def test_host_patterns_match_as_openssh_does(hosts: str, name: str, expected: bool) -> None:
    assert host_matches(hosts, name) is expected


def test_hashed_names_match_their_host_only() -> None:
    hashed = paramiko.HostKeys.hash_host("10.0.0.5")
    assert host_matches(hashed, "10.0.0.5") and not host_matches(hashed, "10.0.0.6")
    assert lookup_name("h", 22) == lookup_name("h", None) == "h"
    assert lookup_name("h", 2222) == "[h]:2222"


def _key_line() -> tuple[paramiko.PKey, str]:
    key = paramiko.ECDSAKey.generate()
    return key, f"{key.get_name()} {key.get_base64()}"


def test_revocations_keep_their_file_and_line_and_hide_the_key_from_trust(tmp_path: Path) -> None:
    key, line = _key_line()
    other, other_line = _key_line()
    known = tmp_path / "known_hosts"
    known.write_text(
        f"# comment\n\n10.0.0.5 {line}\n10.0.0.5 {other_line}\n@cert-authority *.lab {other_line}\n"
        f"@revoked  10.0.0.*   {line} old key\n"
    )
    trust = KnownHosts.load([tmp_path / "missing", known], node="n1")
    revoked = trust.revocation("10.0.0.5", key)
    assert revoked is not None and revoked.where == f"{known}:6"
    assert trust.revocation("10.0.0.5", other) is None and trust.revocation("192.168.1.1", key) is None
    assert [e.key.asbytes() for e in trust.trusted_for("10.0.0.5")] == [other.asbytes()]
    assert len(trust.trusted_for("192.168.1.1")) == 2  # revoked for 10.0.0.* only
    assert trust.authorities == [f"{known}:5"]


def test_a_misspelt_marker_is_refused_with_its_line(tmp_path: Path) -> None:
    _, line = _key_line()
    known = tmp_path / "known_hosts"
    known.write_text(f"@revokd * {line}\n")
    with pytest.raises(ConnectError, match=r"known_hosts:1: unknown known_hosts marker '@revokd'"):
        KnownHosts.load([known], node="n1")


def test_compare_commands_follow_the_key_type() -> None:
    assert compare_command("ssh-ed25519") == "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`"
    assert compare_command("ecdsa-sha2-nistp384") == "`ssh-keygen -lf /etc/ssh/ssh_host_ecdsa_key.pub`"
    assert compare_command("ssh-rsa") == "`ssh-keygen -lf /etc/ssh/ssh_host_rsa_key.pub`"
    odd = compare_command("sk-ssh-ed25519@openssh.com")
    assert "sk-ssh-ed25519@openssh.com host key" in odd and "ed25519_key.pub" not in odd


def test_the_unknown_key_block_names_each_offered_type(capsys: pytest.CaptureFixture[str]) -> None:
    def unknown(node: str, key_type: str) -> Outcome[None]:
        error = HostKeyUnknownError(
            "unknown",
            node=node,
            hint=None,
            fingerprint="SHA256:x",
            host="10.0.0.5",
            key_type=key_type,
            known_hosts="/k",
        )
        return Outcome(node, None, error, 0.0)

    fail_lines(UI(color=False), [unknown("a", "ecdsa-sha2-nistp256"), unknown("b", "ssh-rsa")])
    err = capsys.readouterr().err
    assert "`ssh-keygen -lf /etc/ssh/ssh_host_ecdsa_key.pub` (for ecdsa-sha2-nistp256)" in err, err
    assert "`ssh-keygen -lf /etc/ssh/ssh_host_rsa_key.pub` (for ssh-rsa)" in err, err
    assert "ed25519" not in err  # no guess: neither node offered one


def test_a_known_hosts_file_is_parsed_once_for_every_node_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[str] = []
    real = paramiko.hostkeys.HostKeyEntry.from_line

    def counting(line: str, lineno: int | None = None) -> paramiko.hostkeys.HostKeyEntry | None:
        parsed.append(line)
        return real(line, lineno)

    monkeypatch.setattr(paramiko.hostkeys.HostKeyEntry, "from_line", staticmethod(counting))
    keys = [_key_line() for _ in range(3)]
    known = tmp_path / "known_hosts"
    known.write_text("".join(f"10.0.0.{i} {line}\n" for i, (_, line) in enumerate(keys)))
    for node in ("n1", "n2", "n3"):  # 64 nodes parsed 64 x 64 keys per command
        trust = KnownHosts.load([known], node=node)
        assert [e.key.asbytes() for e in trust.trusted_for("10.0.0.1")] == [k.asbytes() for k, _ in keys]
    assert len(parsed) == 3
    # a node's connection that adds a key to its HostKeys leaves the others' trust as it was
    trust.trusted_for("10.0.0.1")[0].hostnames.append("10.9.9.9")
    assert trust.trusted_for("10.0.0.1")[0].hostnames == ["10.0.0.0"]
    # the file changed (a key accepted, ssh-keygen -R): read again
    new, new_line = _key_line()
    with known.open("a") as fh:
        fh.write(f"10.0.0.9 {new_line}\n")
    trust = KnownHosts.load([known], node="n1")
    assert trust.trusted_for("10.0.0.9")[-1].key.asbytes() == new.asbytes()
    assert len(parsed) == 7
