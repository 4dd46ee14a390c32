"""The PowerShell platform: quoting, native-program command lines, and every script it writes.

No PowerShell runs here: scripts are parsed with tree-sitter (tests/pwsh.py) and checked on the
tree; single-quoted strings are read back with PowerShell's own rule (any of ' ‘ ’ ‚ ‛ ends the
string unless doubled); command lines are split with a reference implementation of the Microsoft C
runtime / CommandLineToArgvW rules written below.
"""

from __future__ import annotations

import base64
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.facts.base import split_sections
from orchestrator.platforms import PowerShell, platform_for
from orchestrator.platforms.powershell import (
    CWD_FAILED_EXIT,
    MAX_COMMAND_LINE,
    NOT_ELEVATED_EXIT,
    NOT_FOUND_EXIT,
    argv_to_command_line,
    cmd_command_line,
)
from orchestrator.runs.windows import WindowsRuns
from tests import pwsh
from tests.noderecords import NONCE, sections_asked, sections_said

QUOTES = "'\u2018\u2019\u201a\u201b"
# Anything a script may carry: no NUL, no lone surrogates; quotes of every kind, $, backtick, newlines
# and double quotes (plain and typographic) drawn often.
tricky = st.sampled_from(list(QUOTES + '"\u201c\u201d\u201e$`\n\r\t\\ @(){};#<>|&%!'))
any_char = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
text = st.lists(st.one_of(tricky, any_char), max_size=40).map("".join)

ps = PowerShell()


# -- references --------------------------------------------------------------------------------------


def single_quoted_value(literal: str) -> str:
    """What PowerShell makes of a single-quoted string token (its tokenizer's rule); the whole
    ``literal`` must be that one token."""
    assert literal[0] in QUOTES, literal
    out: list[str] = []
    i = 1
    while i < len(literal):
        char = literal[i]
        if char in QUOTES:
            if i + 1 < len(literal) and literal[i + 1] in QUOTES:
                out.append(literal[i + 1])
                i += 2
                continue
            assert i == len(literal) - 1, f"string ends early at {i}: {literal!r}"
            return "".join(out)
        out.append(char)
        i += 1
    raise AssertionError(f"unterminated string {literal!r}")


def split_command_line(line: str) -> list[str]:
    """Reference splitter: the Microsoft C runtime (2008+) / CommandLineToArgvW rules."""
    argv: list[str] = []
    n = len(line)
    if line.startswith('"'):
        end = line.index('"', 1)
        argv.append(line[1:end])
        i = end + 1
    else:
        i = 0
        while i < n and line[i] not in " \t":
            i += 1
        argv.append(line[:i])
    while True:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            return argv
        arg: list[str] = []
        quoted = False
        while i < n:
            char = line[i]
            if char in " \t" and not quoted:
                break
            if char == "\\":
                k = i
                while k < n and line[k] == "\\":
                    k += 1
                count = k - i
                if k < n and line[k] == '"':
                    arg.append("\\" * (count // 2))
                    if count % 2:
                        arg.append('"')
                        i = k + 1
                    else:
                        i = k
                else:
                    arg.append("\\" * count)
                    i = k
                continue
            if char == '"':
                if quoted and i + 1 < n and line[i + 1] == '"':
                    arg.append('"')
                    i += 2
                    continue
                quoted = not quoted
                i += 1
                continue
            arg.append(char)
            i += 1
        argv.append("".join(arg))


def unquoted_regions(line: str) -> str:
    """The characters cmd.exe sees outside double-quoted regions (each quote toggles)."""
    out, quoted = [], False
    for char in line:
        if char == '"':
            quoted = not quoted
        elif not quoted:
            out.append(char)
    return "".join(out)


def string_literals(tree: object) -> list[str]:
    return [
        (n.text or b"").decode()
        for n in pwsh.walk(tree.root_node)  # type: ignore[attr-defined]
        if n.type == "string_literal"
    ]


def assignments(tree: object) -> dict[str, str]:
    """``$target = value`` statements: target text -> value text."""
    found = {}
    for node in pwsh.walk(tree.root_node):  # type: ignore[attr-defined]
        if node.type == "assignment_expression":
            target, value = node.children[0], node.children[-1]
            found[(target.text or b"").decode()] = (value.text or b"").decode()
    return found


def find(tree: object, name: str) -> list[pwsh.Command]:
    return [c for c in pwsh.commands(tree) if c.name.lower() == name.lower()]  # type: ignore[arg-type]


# -- quoting ---------------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(value=text)
def test_quoted_strings_survive_as_one_literal(value: str) -> None:
    quoted = ps.quote(value)
    tree = pwsh.assert_parses(quoted)
    assert string_literals(tree) == [quoted]
    assert single_quoted_value(quoted) == value


@pytest.mark.parametrize("quote", list(QUOTES))
def test_every_single_quote_kind_is_doubled(quote: str) -> None:
    assert ps.quote(f"a{quote}b") == f"'a{quote}{quote}b'"


def test_the_reference_reader_catches_an_undoubled_typographic_quote() -> None:
    # what a quote() forgetting U+2019 would produce: PowerShell ends the string at the ’
    with pytest.raises(AssertionError, match="ends early"):
        single_quoted_value("'it\u2019s'")


# -- native programs -------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(argv=st.lists(text, max_size=6))
def test_command_lines_split_back_into_the_same_argv(argv: list[str]) -> None:
    assert split_command_line(argv_to_command_line(["prog.exe", *argv])) == ["prog.exe", *argv]


@settings(max_examples=150, deadline=None)
@given(args=st.lists(text, max_size=5))
def test_native_invocation_passes_arguments_exactly(args: list[str]) -> None:
    script = ps.native(["python", *args])
    tree = pwsh.assert_parses(script)
    found = assignments(tree)
    literal = found["$cbInfo.Arguments"]
    command_line = single_quoted_value(literal)
    assert split_command_line("python " + command_line) == ["python", *args]
    assert found["$cbInfo.UseShellExecute"] == "$false"
    assert found["$global:LASTEXITCODE"] in ("$cbProc.ExitCode", str(NOT_FOUND_EXIT))
    lookup = find(tree, "Get-Command")[0]
    assert lookup.has("-CommandType") and lookup.has("-Name") and "'python'" in lookup.arguments


def test_native_refuses_batch_files_and_reports_missing_programs() -> None:
    script = ps.native(["tool", "a"])
    assert "\\.(cmd|bat)$" in script and "throw" in script
    assert f"$global:LASTEXITCODE = {NOT_FOUND_EXIT}" in script
    assert ps.join(["tool", "a"]) == script


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["a.exe", ""], 'a.exe ""'),
        (["a.exe", 'say "hi"'], 'a.exe "say \\"hi\\""'),
        (["a.exe", "C:\\dir with space\\"], 'a.exe "C:\\dir with space\\\\"'),
        (["a.exe", "C:\\plain\\"], "a.exe C:\\plain\\"),
        (["C:\\Program Files\\x.exe", "1"], '"C:\\Program Files\\x.exe" 1'),
    ],
)
def test_command_line_examples(argv: list[str], line: str) -> None:
    assert argv_to_command_line(argv) == line


# -- through cmd.exe -----------------------------------------------------------------------------------

cmd_text = (
    st.lists(
        st.one_of(st.sampled_from(list(" &|<>^()\\/=:.-_$;'ab")), st.characters(min_codepoint=0x20)),
        max_size=30,
    )
    .map("".join)
    .filter(lambda s: not re.search(r'[%!"\r\n\x00]', s))
)


@settings(max_examples=150, deadline=None)
@given(args=st.lists(cmd_text, max_size=5))
def test_cmd_lines_keep_every_cmd_metacharacter_inside_quotes(args: list[str]) -> None:
    line = cmd_command_line(["wsl.exe", *args])
    assert split_command_line(line) == ["wsl.exe", *args]
    assert not re.search(r"[&|<>^()%!]", unquoted_regions(line)), line


@pytest.mark.parametrize("bad", ["%PATH%", "a!b", 'say "x"', "two\nlines"])
def test_cmd_lines_refuse_what_cmd_would_expand(bad: str) -> None:
    with pytest.raises(ValueError, match=r"cmd\.exe"):
        cmd_command_line(["x.exe", bad])


# -- scripts ---------------------------------------------------------------------------------------------


def test_wrap_sets_everything_up_and_propagates_exit_codes() -> None:
    env = {"MASTER_ADDR": "10.0.0.1", "ODD": "it's $x `y` \u2019"}
    script = ps.wrap("python train.py", env=env, cwd="C:/work dir/it's", become=False)
    tree = pwsh.assert_parses(script)
    found = assignments(tree)
    assert found["$ErrorActionPreference"] == "'Stop'"
    assert found["$ProgressPreference"] == "'SilentlyContinue'"
    assert single_quoted_value(found["$env:MASTER_ADDR"]) == "10.0.0.1"
    assert single_quoted_value(found["$env:ODD"]) == env["ODD"]
    strict = find(tree, "Set-StrictMode")[0]
    assert strict.has("-Version") and strict.arguments == ["Latest"]
    location = find(tree, "Set-Location")[0]
    assert location.has("-LiteralPath")
    assert single_quoted_value(location.arguments[0]) == "C:\\work dir\\it's"
    assert f"exit {CWD_FAILED_EXIT}" in script
    assert script.rstrip().endswith("exit $global:LASTEXITCODE")
    assert "IsInRole" not in script
    # the command itself sits between the setup and the error handler
    assert script.index("$env:ODD") < script.index("python train.py") < script.index("} catch {\n  [Console]")


def test_wrap_with_become_checks_elevation_first() -> None:
    script = ps.wrap("Get-NetFirewallRule", become=True)
    tree = pwsh.assert_parses(script)
    assert "IsInRole($cbAdmin)" in script
    assert assignments(tree)["$cbAdmin"] == "[System.Security.Principal.WindowsBuiltInRole]::Administrator"
    assert f"exit {NOT_ELEVATED_EXIT}" in script
    assert script.index("IsInRole") < script.index("Get-NetFirewallRule")
    assert ps.not_elevated(NOT_ELEVATED_EXIT) and not ps.not_elevated(1)


@pytest.mark.parametrize("name", ["1X", "A-B", "", "A B", "X;rm", "env:X"])
def test_bad_env_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="environment variable name"):
        ps.wrap("x", env={name: "v"})


def test_home_paths_expand_on_the_node() -> None:
    assert ps.path_word("~") == "$HOME"
    word = ps.path_word("~/runs/a b")
    pwsh.assert_parses(f"Set-Location -LiteralPath {word}")
    assert word == "($HOME + '\\runs\\a b')"
    assert ps.path_word("C:/x/y") == "'C:\\x\\y'"
    assert ps.transfer_path("~/x/y") == "x\\y" and ps.transfer_path("~") == "."


@pytest.mark.parametrize("path", ["~/cluster-bootstrap/runs/r1", "C:\\data\\it's", "relative/dir"])
def test_mkdir_and_run_script_parse(path: str) -> None:
    tree = pwsh.assert_parses(ps.mkdir(path))
    assert "CreateDirectory" in ps.mkdir(path) and "GetUnresolvedProviderPathFromPSPath" in ps.mkdir(path)
    assert string_literals(tree) or path == "~"
    pwsh.assert_parses(ps.run_script(path + "/launch.ps1"))


def invocations(tree: object) -> list[tuple[str, str, list[str]]]:
    """Every method call on the tree, in order: (what it is called on, method, argument texts)."""
    found = []
    for node in pwsh.walk(tree.root_node):  # type: ignore[attr-defined]
        if node.type != "invocation_expression":
            continue
        member = next(c for c in node.children if c.type == "member_name")
        arguments = node.children[-1]  # argument_list > argument_expression_list > argument_expression
        args = [
            (e.text or b"").decode()
            for listed in arguments.children
            if listed.type == "argument_expression_list"
            for e in listed.children
            if e.type == "argument_expression"
        ]
        found.append(((node.children[0].text or b"").decode(), (member.text or b"").decode(), args))
    return found


ACL = "System.Security.AccessControl"


@pytest.mark.parametrize("path", ["~/cluster-bootstrap/runs/r1/win1", "C:\\data\\it's ‘x’", "D:/runs/a b"])
def test_a_private_directory_gets_an_owner_only_access_list(path: str) -> None:
    """What ``chmod 700`` is on POSIX: one entry (the connecting user, full control, inherited by
    what is created inside), inheritance from the parent cut, the user the owner, written onto the
    directory just created (or already there)."""
    tree = pwsh.assert_parses(ps.mkdir(path, private=True))
    plain = pwsh.parse(ps.mkdir(path))
    calls = invocations(tree)
    # the same directory as without `private`, created first, its DirectoryInfo kept
    (create,) = [c for c in invocations(plain) if c[1] == "CreateDirectory"]
    assert calls[0] == create and assignments(tree)["$cbDir"].startswith(create[0] + "::CreateDirectory(")
    # the path stays one literal (quotes doubled), the only other one is the inheritance flags
    assert string_literals(tree) == [*string_literals(plain), "'ContainerInherit, ObjectInherit'"]
    # whose identity: the user this session runs as (not a name: a SID, whatever the account's locale)
    assert assignments(tree)["$cbMe"] == "[System.Security.Principal.WindowsIdentity]::GetCurrent().User"
    # a new, empty descriptor (nothing copied from the parent or the profile)...
    (descriptor,) = [c for c in pwsh.commands(tree) if c.arguments[:1] == [f"{ACL}.DirectorySecurity"]]
    assert descriptor.name == "New-Object" and descriptor.parameters == ["-typename"]
    assert assignments(tree)["$cbAcl"] == f"New-Object -TypeName {ACL}.DirectorySecurity"
    # ...given exactly: owner, protection without keeping inherited entries, one entry
    on_acl = [(method, args) for target, method, args in calls if target == "$cbAcl"]
    assert on_acl[0] == ("SetOwner", ["$cbMe"])
    assert on_acl[1] == ("SetAccessRuleProtection", ["$true", "$false"])
    assert [method for method, _ in on_acl[2:]] == ["AddAccessRule"]
    (rule,) = [n for n in pwsh.walk(tree.root_node) if n.type == "array_literal_expression"]
    assert [(e.text or b"").decode() for e in rule.children if e.type != ","] == [
        "$cbMe",
        f"[{ACL}.FileSystemRights]::FullControl",
        f"[{ACL}.InheritanceFlags]'ContainerInherit, ObjectInherit'",
        f"[{ACL}.PropagationFlags]::None",
        f"[{ACL}.AccessControlType]::Allow",
    ]
    (new_rule,) = [c for c in pwsh.commands(tree) if c.arguments[:1] == [f"{ACL}.FileSystemAccessRule"]]
    assert new_rule.parameters == ["-typename", "-argumentlist"]
    # written onto the directory last, with the .NET method (not Set-Acl: no audit list, no privilege)
    assert calls[-1] == ("$cbDir", "SetAccessControl", ["$cbAcl"])
    assert "Set-Acl" not in {c.name for c in pwsh.commands(tree)}


def test_a_plain_directory_keeps_what_it_inherits() -> None:
    script = ps.mkdir("~/cluster-bootstrap/code")
    assert [m for _, m, _ in invocations(pwsh.assert_parses(script))] == [
        "CreateDirectory",
        "GetUnresolvedProviderPathFromPSPath",
    ]


def test_sections_parse_and_frame_like_posix() -> None:
    sections = [("one", "'hello'"), ("two", ps.native(["nvidia-smi", "-L"])), ("three", "throw 'boom'")]
    script = ps.sectioned(sections, NONCE)
    tree = pwsh.assert_parses(script)
    said = [c.arguments for c in pwsh.commands(tree) if c.name == "Out-CbRecord"]
    # one record per section: its lines joined by "\n", a NUL, its exit code
    assert said == [
        ["'section'", f"@('{name}', (($cbSectionLines -join \"`n\") + [char]0 + [string]$cbCode))"]
        for name, _ in sections
    ]
    assert any(c.name == "Out-String" and c.has("-Stream") for c in pwsh.commands(tree))
    assert sections_asked(script) == [(NONCE, name) for name, _ in sections]
    # what those records carry (a throwing section: its message, code 1), read by the shared parser
    stdout = sections_said(NONCE, {"one": ("hello", 0), "three": ("error: boom", 1)}).replace("\n", "\r\n")
    assert split_sections(stdout, NONCE) == {"one": ("hello", 0), "three": ("error: boom", 1)}


@settings(max_examples=100, deadline=None)
@given(script=text)
def test_encoded_command_round_trip(script: str) -> None:
    line = ps.login_command(script)
    words = line.split(" ")
    assert words[:-1] == [
        "powershell.exe",
        "-NoProfile",
        "-NonInteractive",
        "-ExecutionPolicy",
        "Bypass",
        "-EncodedCommand",
    ]
    assert base64.b64decode(words[-1]).decode("utf-16-le") == script


def test_long_scripts_need_the_file_route() -> None:
    script = ps.wrap("\n".join(f"'line {i}'" for i in range(400)))
    assert len(ps.login_command(script)) > MAX_COMMAND_LINE == 8191
    line = ps.file_command("C:\\Users\\Jo Smith\\AppData\\Local\\Temp\\bootstrap-1.ps1")
    assert split_command_line(line) == [
        "powershell.exe",
        "-NoProfile",
        "-NonInteractive",
        "-ExecutionPolicy",
        "Bypass",
        "-File",
        "C:\\Users\\Jo Smith\\AppData\\Local\\Temp\\bootstrap-1.ps1",
    ]
    with pytest.raises(ValueError, match=r"\.ps1"):
        ps.file_command("C:\\x.txt")
    data = ps.script_file("'h\u00e9'")
    assert data.startswith(b"\xef\xbb\xbf") and data[3:].decode("utf-8") == "'h\u00e9'"


def test_stop_on_hangup_leaves_it_to_the_job_object() -> None:
    script = ps.wrap("python train.py")
    assert ps.stop_on_hangup(script) == script


def test_kill_tree_and_stop_run_scripts() -> None:
    run_dir = "C:/runs/x'; Remove-Item C:\\ -Recurse; '/win1"
    for script in (ps.kill_tree(4242), WindowsRuns(ps).stop(run_dir)):
        tree = pwsh.assert_parses(script)
        stop = find(tree, "Stop-Process")[0]
        assert stop.has("-Id") and stop.has("-Force")
        assert any(
            c.has("-ClassName") and "Win32_Process" in c.arguments for c in find(tree, "Get-CimInstance")
        )
        assert not find(tree, "Remove-Item")  # a run directory is only ever a quoted literal
    assert "'ProcessId = 4242'" in ps.kill_tree(4242)
    # a run is found by the identities in its directory (tests/unit/test_runs_windows.py), not by name
    assert "'C:\\runs\\x''; Remove-Item C:\\ -Recurse; ''\\win1'" in WindowsRuns(ps).stop(run_dir)
    for bad in (0, -1, True):
        with pytest.raises(ValueError):
            ps.kill_tree(bad)


def test_platform_for_windows_is_powershell() -> None:
    assert isinstance(platform_for("windows"), PowerShell)


def test_transfer_scripts_take_home_relative_paths_and_long_scripts_go_to_a_ps1() -> None:
    put = pwsh.assert_parses(ps.upload_script("~/data/it's.bin", "ab" * 32))
    literals = [
        (n.text or b"").decode() for n in pwsh.walk(put.root_node) if n.type == "verbatim_string_characters"
    ]
    assert ps.quote("data\\it's.bin") in literals  # relative to the profile, as the WinRS shell starts there
    assert ps.quote("data\\x") in ps.download_script("~/data/x") and "-LiteralPath 'x'" in ps.remove_file(
        "~/x"
    )
    file = ps.long_script("Write-Output 'h\u00e9'")
    assert (
        file.suffix == ".ps1" and file.mode is None and file.data == ps.script_file("Write-Output 'h\u00e9'")
    )
    assert split_command_line(ps.run_long_script("C:\\T\\bootstrap-1.ps1", "x"))[-2:] == [
        "-File",
        "C:\\T\\bootstrap-1.ps1",
    ]
    argv = ps.local_argv("Write-Output 1")
    assert argv[0] == "powershell.exe" and base64.b64decode(argv[-1]).decode("utf-16-le") == "Write-Output 1"


def test_the_shell_quota_a_failed_command_met_is_named_from_windows_own_message() -> None:
    """A WinRS shell's job refuses a process with ERROR_NOT_ENOUGH_QUOTA's text and an allocation with
    ERROR_COMMITMENT_LIMIT's: each names its setting; anything else (a Python MemoryError, an ssh
    node) names none."""
    ps = PowerShell()
    memory = "The paging file is too small for this operation to complete.\r\n"
    processes = (
        'Exception calling "Start" with "1" argument(s): '
        '"Not enough quota is available to process this command."'
    )
    assert ps.shell_quota("some output\n" + memory) == "MaxMemoryPerShellMB"
    assert ps.shell_quota(processes) == "MaxProcessesPerShell"
    assert ps.shell_quota("MemoryError") is None
    assert platform_for("linux").shell_quota(memory) is None
