"""Pure logic of the WS-Management test server (tests/winrm_server): Windows command-line splitting,
CLIXML escaping and where plain stderr text can land in it, xs:duration, powershell.exe argument
decoding, and the corruption device the SHA-256 tests use."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.winrm_server import cmdline
from tests.winrm_server import powershell as ps
from tests.winrm_server.soap import parse_duration

#: a self-test of the test harness (select with -m harness, leave out with -m 'not harness')
pytestmark = pytest.mark.harness


# The table of "Parsing C command-line arguments" (Microsoft C runtime documentation), plus argv[0].
@pytest.mark.parametrize(
    ("line", "argv"),
    [
        ('prog "a b c" d e', ["prog", "a b c", "d", "e"]),
        (r'prog "ab\"c" "\\" d', ["prog", 'ab"c', "\\", "d"]),
        (r'prog a\\\b d"e f"g h', ["prog", r"a\\\b", "de fg", "h"]),
        (r"prog a\\\"b c d", ["prog", r"a\"b", "c", "d"]),
        (r'prog a\\\\"b c" d e', ["prog", r"a\\b c", "d", "e"]),
        ('prog a"b"" c d', ["prog", 'ab" c d']),  # "" inside quotes: a quote, still quoted (VC++ 2008+)
        ('"C:\\Program Files\\x\\" arg', ["C:\\Program Files\\x\\", "arg"]),  # argv[0]: no escapes
        ("prog\t a  \t b ", ["prog", "a", "b"]),
        ('prog "" ""', ["prog", "", ""]),
        ("  ", []),
    ],
)
def test_split_follows_the_c_runtime_rules(line: str, argv: list[str]) -> None:
    assert cmdline.split(line) == argv


def test_legacy_mode_ends_the_quoted_part_at_doubled_quotes() -> None:
    assert cmdline.split('prog a"b"" c d', legacy=True) == ["prog", 'ab"', "c", "d"]


def test_tokens_know_their_source_span() -> None:
    line = 'wsl.exe -d X -- bash -lc "echo hi"'
    tokens = cmdline.split_tokens(line)
    dashdash = next(t for t in tokens if t.value == "--")
    assert line[dashdash.end :].strip() == 'bash -lc "echo hi"'


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))))
def test_quote_round_trips_through_split(args: list[str]) -> None:
    line = "prog " + " ".join(cmdline.quote(a) for a in args)
    assert cmdline.split(line) == ["prog", *args]


def test_clixml_escapes_control_characters_underscore_x_and_markup() -> None:
    assert ps.clixml_escape("a\r\nb") == "a_x000D__x000A_b"
    assert ps.clixml_escape("my_xvar _y") == "my_x005F_xvar _y"
    assert ps.clixml_escape("<a & b>") == "&lt;a &amp; b&gt;"


def test_clixml_errors_shape() -> None:
    text = ps.clixml_errors("one\ntwo\n", progress_record=False)
    assert text == (
        '#< CLIXML\r\n<Objs Version="1.1.0.1" xmlns="http://schemas.microsoft.com/powershell/2004/04">'
        '<S S="Error">one_x000D__x000A_</S><S S="Error">two_x000D__x000A_</S></Objs>'
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("PT20S", 20.0),
        ("PT7200.000S", 7200.0),
        ("P0DT0H1M5S", 65.0),
        ("PT0.5S", 0.5),
        ("P1D", 86400.0),
        ("PT", None),
        ("20", None),
        ("PT-1S", None),
    ],
)
def test_durations(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


def test_powershell_invocations() -> None:
    enc = base64.b64encode("Get-Date".encode("utf-16-le")).decode()
    assert (
        ps.parse_invocation(
            ["-NoProfile", "-NonInteractive", "-ExecutionPolicy", "Bypass", "-EncodedCommand", enc]
        ).script
        == "Get-Date"
    )
    assert ps.parse_invocation(["-enc", enc]).script == "Get-Date"
    inv = ps.parse_invocation(["-nop", "-File", "C:\\a.ps1", "-X", "1"])
    assert (inv.mode, inv.file, inv.file_args) == ("file", "C:\\a.ps1", ["-X", "1"])
    assert ps.parse_invocation(["-Command", "Get-Item", "x"]).script == "Get-Item x"
    with pytest.raises(ps.PowerShellUsageError):
        ps.parse_invocation(["-EncodedCommand", "not base64!"])


def test_script_files_are_read_like_windows_powershell_reads_them() -> None:
    assert ps.decode_script_file(b"\xef\xbb\xbfcaf\xc3\xa9") == "café"
    assert ps.decode_script_file("café".encode("utf-16")) == "café"
    assert ps.decode_script_file(b"caf\xc3\xa9") == "cafÃ©"  # no BOM: ANSI code page, as PS 5.1 does


def test_cmd_exe_preprocessing() -> None:
    from tests.winrm_server.cmdexe import CmdSyntaxError, preprocess

    env = {"UserProfile": "C:\\Users\\bob"}
    assert (
        preprocess('wsl.exe -e echo "%USERPROFILE%" %NOPE% a^&b', env)
        == 'wsl.exe -e echo "C:\\Users\\bob" %NOPE% a&b'
    )
    assert preprocess('x "a|b&c<d>e^"', env) == 'x "a|b&c<d>e^"'  # operators and ^ are literal inside quotes
    for bad in ("x a|b", "x a && b", "x > f", 'x "q" & y'):
        with pytest.raises(CmdSyntaxError):
            preprocess(bad, env)


def test_clixml_error_parts_cut_after_the_first_record() -> None:
    head, tail = ps.clixml_error_parts("one\ntwo\n", progress_record=True)
    assert head + tail == ps.clixml_errors("one\ntwo\n", progress_record=True)
    assert head.startswith('#< CLIXML\r\n<Objs Version="1.1.0.1" ') and head.endswith("</Obj>")
    assert tail.startswith('<S S="Error">one_x000D__x000A_</S>') and tail.endswith("</Objs>")
    head, tail = ps.clixml_error_parts("one\ntwo\n", progress_record=False)
    assert (
        head.endswith('<S S="Error">one_x000D__x000A_</S>')
        and tail == '<S S="Error">two_x000D__x000A_</S></Objs>'
    )


def test_corruption_changes_one_base64_character_into_another() -> None:
    from tests.winrm_server.server import Corruption

    line = base64.b64encode(bytes(range(60))) + b"\r\n"
    hit = Corruption("stdout", at=10)
    out = hit.apply("cmd", line, start=0)
    assert hit.fired and hit.offset == 10 and hit.command_line == "cmd"
    assert sum(a != b for a, b in zip(out, line, strict=True)) == 1
    assert base64.b64decode(out.strip(), validate=True) != bytes(range(60))  # still base64, other bytes
    # a later piece of the stream: the offset counts from the stream's start
    later = Corruption("stdout", at=100)
    assert later.apply("cmd", line, start=0) == line and not later.fired
    assert later.apply("cmd", line, start=90) != line and later.offset == 100
    # the last character before a line end or padding is never the one changed (its low bits may not count)
    tail = Corruption("stdin", at=0)
    assert tail.apply("cmd", b"QQ==\n", start=0) == b"RQ==\n" and tail.offset == 0
    assert Corruption("stdin", at=1).apply("cmd", b"QQ==\n", start=0) == b"QQ==\n"
