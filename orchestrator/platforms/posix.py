"""POSIX ``sh``: Linux nodes (and, later, commands inside WSL distributions)."""

from __future__ import annotations

import base64
import re
import shlex
import uuid
from collections.abc import Mapping, Sequence

import orchestrator.platforms.transfer as transfer
from orchestrator.platforms.base import UNSAFE_DIR_EXIT, Platform, ScriptFile, check_env_name
from orchestrator.records import RAW_SECTION, check_kind, check_nonce

#: exit code reported when ``cd`` into the working directory fails (what ``env -C`` uses: 125).
CWD_FAILED_EXIT = 125
#: a script ``login_command`` sends as it is: inside single quotes, sh, bash, zsh, csh and fish all
#: keep these characters literally (csh: not "!" or a newline; fish: not "\\")
_PLAIN_LINE = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9 _./:@%+=,<>-]*")

#: what sudo prints when ``-n`` refuses because it would have to ask for a password
SUDO_PASSWORD_MARKERS = ("a password is required", "a terminal is required")

#: Shell functions that decide whether a directory path can be trusted against the node's other users
#: (issue 27): ``_cb_walk PATH`` checks every existing component from ``/`` (and, for a symbolic
#: link, the link itself and then every component of what it names): each must belong to root or to
#: the connecting user, and a directory others can write to must have the sticky bit (``/tmp``: in
#: it, others cannot rename or remove what is ours). It leaves ``_cb_p``, the physical path of the
#: deepest existing component, and ``_cb_rest``, the components still missing. A refusal is one line
#: on stderr and exit UNSAFE_DIR_EXIT.
_DIR_FUNCTIONS = (
    "_cb_me=$(id -u) _cb_links=0\n"
    "_cb_fix='choose a workdir whose every directory only you or root can write to, e.g. under your"
    " home (a directory all can write to, such as /tmp, only with the sticky bit)'\n"
    f'_cb_refuse() {{ printf \'refusing %s: %s\\n\' "$1" "$2" >&2; exit {UNSAFE_DIR_EXIT}; }}\n'
    "_cb_who() { stat -c 'owner %U (uid %u), mode %04a' -- \"$1\" 2>/dev/null || echo 'owner unknown'; }\n"
    "_cb_ok() {\n"
    '  set -- "$1" $(stat -c \'%u %a\' -- "$1" 2>/dev/null)\n'
    '  [ -n "$3" ] || _cb_refuse "$1" "cannot read its owner and mode (stat -c)"\n'
    '  if [ "$2" != 0 ] && [ "$2" != "$_cb_me" ]; then\n'
    '    _cb_refuse "$1" "it belongs to another user ($(_cb_who "$1")), who could replace what bootstrap'
    ' writes or reads below it; $_cb_fix"\n'
    "  fi\n"
    '  if [ ! -L "$1" ] && [ $((0$3 & 022)) -ne 0 ] && [ $((0$3 & 01000)) -eq 0 ]; then\n'
    '    _cb_refuse "$1" "other users can write to it ($(_cb_who "$1")) and it has no sticky bit, so they'
    ' could replace what bootstrap writes or reads below it; $_cb_fix, or chmod go-w it"\n'
    "  fi\n"
    "}\n"
    "_cb_walk() {\n"
    "  case $1 in /*) _cb_r=$1 ;; *) _cb_r=$PWD/$1 ;; esac\n"
    "  _cb_p=/ _cb_rest=\n"
    "  _cb_ok /\n"
    '  while [ -n "$_cb_r" ]; do\n'
    "    _cb_c=${_cb_r%%/*}\n"
    "    case $_cb_r in */*) _cb_r=${_cb_r#*/} ;; *) _cb_r= ;; esac\n"
    "    case $_cb_c in '' | .) continue ;; esac\n"
    "    _cb_n=${_cb_p%/}/$_cb_c\n"
    '    if [ ! -e "$_cb_n" ] && [ ! -L "$_cb_n" ]; then _cb_rest=$_cb_c${_cb_r:+/$_cb_r}; return 0; fi\n'
    '    _cb_ok "$_cb_n"\n'
    '    if [ -L "$_cb_n" ]; then\n'
    '      [ "$_cb_links" -lt 16 ] || _cb_refuse "$_cb_n" "too many symbolic links"\n'
    '      _cb_t=$(readlink -- "$_cb_n") || _cb_refuse "$_cb_n" "cannot read the symbolic link"\n'
    "      case $_cb_t in /*) ;; *) _cb_t=${_cb_p%/}/$_cb_t ;; esac\n"
    # in a subshell: the walk of the link's target keeps its own variables
    '      (_cb_l=$_cb_n _cb_links=$((_cb_links + 1)); _cb_walk "$_cb_t"\n'
    '        [ -z "$_cb_rest" ] || _cb_refuse "$_cb_l" "a symbolic link to a path that does not exist")'
    f" || exit {UNSAFE_DIR_EXIT}\n"
    "    fi\n"
    # a real directory below a canonical one is canonical already: no subshell (a fork) for it
    '    if [ -L "$_cb_n" ] || [ "$_cb_c" = .. ]; then\n'
    '      _cb_p=$(cd -P -- "$_cb_n" 2>/dev/null && pwd -P) || _cb_refuse "$_cb_n" "not a directory"\n'
    '    elif [ -d "$_cb_n" ]; then _cb_p=$_cb_n; else _cb_refuse "$_cb_n" "not a directory"; fi\n'
    "  done\n"
    "}\n"
)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class PosixShell(Platform):
    name = "posix"

    #: stop_on_hangup's watcher ends the job when the channel's stdin closes
    stops_on_stdin_eof = True

    def as_posix(self) -> PosixShell:
        return self

    def quote(self, value: str) -> str:
        # Single quotes keep every byte except the single quote itself, which shlex closes,
        # escapes and reopens ('"'"'). For POSIX shells (sh, dash, bash, zsh, ksh): transports hand
        # scripts to /bin/sh themselves, never to the login shell (see login_command).
        return shlex.quote(value)

    def _script(self, command: str, env: Mapping[str, str] | None, cwd: str | None) -> str:
        lines: list[str] = []
        if cwd:
            lines.append(f"cd {self.path_word(cwd)} || exit {CWD_FAILED_EXIT}")
        for name, value in (env or {}).items():
            lines.append(f"export {check_env_name(name)}={self.quote(value)}")
        lines.append(command)
        return "\n".join(lines)

    def path_word(self, path: str) -> str:
        # "~" and "~/x" must expand on the node (the user's home there), the rest stays literal.
        if path == "~":
            return '"$HOME"'
        if path.startswith("~/"):
            return '"$HOME"/' + self.quote(path[2:])
        if path.startswith("-"):  # a relative path, never an option of cd, mkdir, python...
            return self.quote("./" + path)
        return self.quote(path)

    def wrap(
        self,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        become: bool = False,
    ) -> str:
        script = self._script(command, env, cwd)
        if not become:
            return script
        # Root already: no sudo (containers, root logins). Otherwise sudo -n never prompts: it fails
        # at once with "a password is required", which the caller turns into a clear error.
        return f'if [ "$(id -u)" = 0 ]; then /bin/sh -c {self.quote(script)}; else {self.sudo(script)}; fi'

    def sudo(self, script: str) -> str:
        """``script`` as root through ``sudo -n`` (never a prompt), as ``wrap(become=True)`` runs it for
        a user who is not root."""
        return f"sudo -n -- /bin/sh -c {self.quote(script)}"

    def stop_on_hangup(self, script: str, *, silence: float | None = None) -> str:
        """``script`` run as its own process group, stopped with everything it started when our
        stdin reaches EOF or, with ``silence``, when no byte arrived on it for that many seconds.

        A remote command outlives its SSH channel (no pty, no SIGHUP), so a timeout or a Ctrl-C on
        the controller would leave it running. The transport keeps the channel's stdin open and
        closes it to cancel (or closes the channel when the command is done); a controller killed
        outright closes it too (its TCP connection ends). A node cut off from the network hears
        nothing at all: the transport writes a heartbeat byte every few seconds and the watcher
        gives up after ``silence`` seconds without one (a partitioned node's training ran on
        unseen). The watcher then TERMs the job's process group and every process carrying
        the job's token (CB_WATCH, inherited by every descendant: torchrun's workers live in
        sessions of their own), and KILLs what is left 5 s later (ranks that ignore TERM).
        ``setsid`` makes the group (dash refuses ``set -m`` without a terminal); the job's stdin is
        /dev/null, so it cannot eat the watcher's EOF. Whatever must outlive a command has to leave
        the group and drop the token itself (detached launches do).
        """
        # Background jobs of a non-interactive sh get /dev/null as stdin (POSIX): the channel's
        # stdin is kept on fd 3 for the watcher.
        job = f"/bin/sh -c {self.quote(script)} </dev/null 3<&- &"
        if silence is None:
            listen = "cat <&3 >/dev/null"
        else:
            # a heartbeat (one line) goes on, EOF or silence ends. One bash reads them all with a
            # bounded `read -t`: no process per heartbeat, on every node for every running command.
            # Without bash: one bounded read at a time (timeout, dd and wc for each heartbeat).
            seconds = max(1, round(silence))
            read_one = f"timeout {seconds} dd bs=64 count=1 <&3 2>/dev/null | wc -c"
            listen = (
                "if command -v bash >/dev/null 2>&1; then"
                f" bash --norc --noprofile -c 'while IFS= read -r -t {seconds} _; do :; done' <&3;"
                " elif command -v timeout >/dev/null 2>&1; then"
                f' while [ "$({read_one})" -gt 0 ]; do :; done;'
                " else cat <&3 >/dev/null; fi"
            )
        return (
            "exec 3<&0\n"
            # the job's token, in the environment of everything the job starts, wherever that runs
            # (not in ours: the watcher would find itself)
            # `read` is a builtin: no subshell and no `cat` for every command the transports send
            "{ read -r tok < /proc/sys/kernel/random/uuid; } 2>/dev/null || tok=$(date +%s)\n"
            "tok=$$.$tok\n"
            # the job's process group; without setsid (rare) the job's first process only. The
            # script appears once: a command line holds at most 128 KiB (Linux's MAX_ARG_STRLEN)
            "s= g=\n"
            "command -v setsid >/dev/null 2>&1 && s=setsid g=-\n"
            f'CB_WATCH="$tok" $s {job}\n'
            "job=$! target=$g$!\n"
            '_cb_tok() { grep -lzxF "CB_WATCH=$tok" /proc/[0-9]*/environ 2>/dev/null'
            ' | sed -n "s#^/proc/\\([0-9]*\\)/environ\\$#\\1#p"; }\n'
            # After a normal end (the job's process is gone, or a zombie: no signal from the script,
            # which could come before the watcher can catch it, and end it) only the group's leftovers
            # are stopped (the script TERMs them itself at once; what ignores that is KILLed 5 s
            # later): a daemon the command started on purpose (chronyd) carries the token too. While
            # the job still runs (cancel, timeout, silence, a controller gone), everything with the
            # token goes. EOF can come before the job has called setsid: no group yet, the job's
            # process itself is stopped.
            "{ "
            f"{listen};"
            ' if ! { { IFS= read -r l < "/proc/$job/stat"; } 2>/dev/null'
            ' && set -- ${l##*) } && [ "$1" != Z ]; }; then kill -TERM "$target" && { i=0;'
            ' while [ $i -lt 50 ] && kill -0 "$target"; do sleep 0.1; i=$((i + 1)); done;'
            ' kill -KILL "$target"; }; exit 0; fi;'
            ' kill -TERM "$target" || kill -TERM "$job"; p=$(_cb_tok); [ -n "$p" ] && kill -TERM $p;'
            ' i=0; while [ $i -lt 50 ] && { kill -0 "$target" || [ -n "$(_cb_tok)" ]; }; do'
            " sleep 0.1; i=$((i + 1)); done;"
            ' kill -KILL "$target" || kill -KILL "$job"; p=$(_cb_tok); [ -n "$p" ] && kill -KILL $p; }'
            " >/dev/null 2>&1 &\n"
            "exec 3<&-\n"
            # the job is over: stop what it left in its group now, and KILL what ignores TERM 5 s
            # later (the watcher is blocked reading stdin, which a transport may close only once
            # the command has ended, and a child holding our stdout would keep wsl.exe, and so a
            # WinRM command, from ever ending). An empty group costs one failed kill.
            'wait "${target#-}"; rc=$?\n'
            'if kill -TERM "$target" 2>/dev/null; then i=0;'
            ' while [ $i -lt 50 ] && kill -0 "$target" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done;'
            ' kill -KILL "$target" 2>/dev/null; fi\n'
            'exit "$rc"'
        )

    def try_writing_in(self, directory: str) -> str:
        """Write 64 KiB into a new file in ``directory`` and remove it: on failure the shell's own
        words for why (its errno's: "Read-only file system", "No space left on device", the file's
        creation succeeding on a full disk) on stdout with the KiB free there, exit 1."""
        where = self.path_word(directory.rstrip("/") or "/")
        probe = self.path_word(f"{directory.rstrip('/')}/.bootstrap-write-test-{uuid.uuid4().hex[:12]}")
        return (
            # noclobber: a new file, never one planted under that name (nor through a link)
            f"if _cb_e=$({{ set -C; head -c 65536 /dev/zero > {probe}; }} 2>&1)\n"
            f"then rm -f {probe}; exit 0; fi\n"
            f"rm -f {probe}\n"
            f"_cb_f=$(df -Pk {where} 2>/dev/null | awk 'NR == 2 {{ print $4 }}')\n"
            'printf \'%s%s\\n\' "${_cb_e##*: }" "${_cb_f:+ ($_cb_f KiB free there)}"; exit 1'
        )

    def say_file(self, path: str, kind: str, missing: str, limit: int = 16 << 20) -> str:
        """After :meth:`record_functions`: a record ``kind`` holding the regular file ``path`` (its
        first ``limit`` bytes; never through a link), or a record ``missing`` when there is none."""
        word = self.path_word(path)
        return (
            f"if [ -f {word} ] && [ ! -L {word} ]; then head -c {int(limit)} {word}"
            f" | _cb_recin {check_kind(kind)}; else _cb_rec {check_kind(missing)}; fi"
        )

    def say_if_exists(self, path: str, word: str) -> str:
        """A line that prints ``word`` and ends the script (exit 0) when ``path`` exists."""
        return f"if [ -e {self.path_word(path)} ]; then echo {self.quote(word)}; exit 0; fi"

    def say_if_listening(self, port: int, kind: str, *, holder_env: str) -> str:
        """After :meth:`record_functions`: lines that print the record ``kind`` and end the script
        (exit 0) when a TCP socket of this machine listens on ``port`` (IPv4 or IPv6, any address;
        /proc/net: Linux and WSL). Its field: the value of ``holder_env`` in the environment of the
        process that holds that socket, up to its first "/", when that process is ours (another
        user's may carry any value); empty for anyone else's. The process is found from the socket's
        inode among the descriptors in /proc, never from another program's text (``ss -p`` prints a
        process's name as it is, and a name can hold ``pid=N`` and a newline)."""
        name = check_env_name(holder_env)
        return (
            f'_cb_i=$(awk -v p=:{int(port):04X} \'$4 == "0A" && substr($2, length($2) - 4) == p'
            " { print $10; exit }' /proc/net/tcp /proc/net/tcp6 2>/dev/null)\n"
            'case $_cb_i in ""|*[!0-9]*) ;; *)\n'
            '  _cb_h=$(find /proc/[0-9]*/fd -maxdepth 1 -lname "socket:\\[$_cb_i\\]" 2>/dev/null'
            " | sed -n 's#^/proc/\\([0-9][0-9]*\\)/fd/.*#\\1#p' | head -n 1)\n"
            '  _cb_v=; [ -n "$_cb_h" ] && [ -O "/proc/$_cb_h" ]'
            " && _cb_v=$(tr '\\0' '\\n' < \"/proc/$_cb_h/environ\" 2>/dev/null"
            f" | sed -n 's#^{name}=\\([^/]*\\).*#\\1#p' | head -n 1)\n"
            f'  _cb_rec {check_kind(kind)} "$_cb_v"; exit 0 ;;\nesac'
        )

    def line_into_fifo(self, path: str, words: Sequence[str]) -> str:
        """Write ``words`` as one line into the FIFO ``path``, opened read-write: it never waits for a
        reader, even one that is gone. Plain words go by ``echo`` (no quotes: the login shell gets the
        line as it is, see ``login_command``), others by ``printf``."""
        line = " ".join(words)
        writer = f"echo {line}" if _PLAIN_LINE.fullmatch(line) else f"printf '%s\\n' {self.quote(line)}"
        return f"{writer} 1<>{self.path_word(path)}"

    def run_script(self, path: str) -> str:
        """Run the script file at ``path`` (on the node) with /bin/sh."""
        return f"/bin/sh {self.path_word(path)}"

    def mkdir(self, path: str, *, private: bool = False) -> str:
        """``mkdir -p``; ``private``: the directory itself only for its owner (0700), so files put
        into it (a launch script holding secrets) cannot be opened by anyone else, even for the
        moment before their own mode is set."""
        word = self.path_word(path)
        return f"mkdir -p -- {word}" + (f" && chmod 700 -- {word}" if private else "")

    def new_private_dir(self, path: str) -> str:
        """Create ``path``, which must not exist, owner-only (0700), with its missing parents, or
        refuse (one line on stderr, exit UNSAFE_DIR_EXIT) when another user could have planted it or
        could change it: every existing component of the path must belong to root or to us, and may
        be writable by others only with the sticky bit (``_DIR_FUNCTIONS``). Parents are created
        without group or other write (whatever the umask); ``path`` itself with ``mkdir -m 700``,
        which fails on anything already there, so a directory raced in beside us is refused too. A
        parent made meanwhile by another node sharing the file system is taken when it passes the
        same checks."""
        word = self.path_word(path)
        return (
            _DIR_FUNCTIONS + f"_cb_walk {word}\n" + 'if [ -z "$_cb_rest" ]; then\n'
            f'  _cb_refuse {word} "the run directory exists already ($(_cb_who "$_cb_p")): a run\'s directory'
            " is created new by bootstrap; choose another --run-id (and remove this directory if it is"
            " an earlier launch's that failed)\"\n"
            "fi\n"
            "_cb_um=$(umask); umask \"$(printf '%o' $((0$_cb_um | 022)))\"\n"
            'while [ -n "$_cb_rest" ]; do\n'
            "  _cb_c=${_cb_rest%%/*}\n"
            "  case $_cb_rest in */*) _cb_rest=${_cb_rest#*/} ;; *) _cb_rest= ;; esac\n"
            "  case $_cb_c in '' | .) continue ;;"
            f" ..) _cb_refuse {word} \"'..' after a directory that does not exist\" ;; esac\n"
            "  _cb_n=${_cb_p%/}/$_cb_c\n"
            '  if [ -z "$_cb_rest" ]; then\n'
            '    if ! _cb_e=$(mkdir -m 700 -- "$_cb_n" 2>&1); then\n'
            '      [ -e "$_cb_n" ] || [ -L "$_cb_n" ] || { printf \'%s\\n\' "$_cb_e" >&2; exit 1; }\n'
            '      _cb_refuse "$_cb_n" "it appeared while bootstrap was creating it ($(_cb_who "$_cb_n"));'
            ' another user may be attacking this node; $_cb_fix"\n'
            "    fi\n"
            '  elif ! _cb_e=$(mkdir -- "$_cb_n" 2>&1); then\n'
            '    [ -d "$_cb_n" ] || { printf \'%s\\n\' "$_cb_e" >&2; exit 1; }\n'
            '    _cb_ok "$_cb_n"\n'
            '    [ ! -L "$_cb_n" ] || _cb_refuse "$_cb_n" "it appeared as a symbolic link while bootstrap'
            ' was creating it"\n'
            "  fi\n"
            "  _cb_p=$_cb_n\n"
            "done\n"
            'umask "$_cb_um"'
        )

    def no_group_write(self, script: str) -> str:
        """``script`` with group and other write left out of what it creates, whatever the umask."""
        return (
            "_cb_um=$(umask); umask \"$(printf '%o' $((0$_cb_um | 022)))\"\n" + script + '\numask "$_cb_um"'
        )

    def check_path(self, path: str) -> str:
        """Refuse (one line on stderr, exit UNSAFE_DIR_EXIT) a ``path`` whose existing directories,
        from ``/`` down, another user could change (``new_private_dir``'s checks): what runs from
        there (the training script, and what it imports beside it) is then ours alone."""
        return self.check_paths([path])

    def check_paths(self, paths: Sequence[str]) -> str:
        """``check_path`` for each of ``paths``, in order (the functions once)."""
        return _DIR_FUNCTIONS + "\n".join(f"_cb_walk {self.path_word(path)}" for path in paths)

    def check_own_dir(self, path: str) -> str:
        """Refuse (one line on stderr, exit UNSAFE_DIR_EXIT) to read or act on anything in ``path``
        unless it is a directory of the connecting user that no one else can write to, on a path
        that passes ``new_private_dir``'s checks: the files in it (a pid file naming what to signal)
        are then ours. A ``path`` that does not exist passes: there is nothing in it to trust."""
        word = self.path_word(path)
        return (
            _DIR_FUNCTIONS + f"if [ -e {word} ] || [ -L {word} ]; then\n"
            f"  _cb_walk {word}\n"
            "  set -- $(stat -c '%u %a' -- \"$_cb_p\" 2>/dev/null)\n"
            '  if [ "$1" != "$_cb_me" ] || [ $((0${2:-777} & 022)) -ne 0 ]; then\n'
            f'    _cb_refuse {word} "the run directory is not yours alone ($(_cb_who "$_cb_p")): its pid and'
            " exit-code files are not trusted, so nothing it names is read or signalled; find out who"
            ' made it"\n'
            "  fi\n"
            "fi"
        )

    def mkdir_marked(self, path: str, marker: str) -> str:
        """Create ``path`` (and its parents) when it is not there, with an empty file ``marker`` in
        it: a directory this command created is known later as bootstrap's own."""
        word = self.path_word(path)
        marker_word = self.path_word(f"{path.rstrip('/')}/{marker}")
        return f"if [ ! -d {word} ]; then mkdir -p -- {word} && : > {marker_word}; fi"

    def login_command(self, script: str) -> str:
        """One line any login shell passes to ``/bin/sh`` unchanged: the script travels base64-encoded.

        sshd runs commands through the user's login shell, which may be csh (no multi-line quoted
        strings) or fish (other escapes). Base64 text has no character any of them treats specially;
        stdin stays the channel's (eval, not a pipe into sh), which ``stop_on_hangup`` relies on.
        """
        if _PLAIN_LINE.fullmatch(script):
            # one line of letters, digits, spaces and punctuation no login shell treats specially
            # inside single quotes: as it is (no base64 process)
            return f"/bin/sh -c '{script}'"
        encoded = base64.b64encode(script.encode()).decode()
        return f"/bin/sh -c 'eval \"$(printf %s {encoded} | base64 -d)\"'"

    def record_functions(self, nonce: str) -> str:
        """``_cb_rec KIND FIELD...`` prints one record, each field an argument; ``_cb_recin KIND
        FIELD...`` takes one more field, its stdin (binary-safe: NUL bytes and trailing newlines
        kept, which neither arguments nor command substitution can carry). ``base64`` wraps its
        output unless told not to (``-w 0``, coreutils): busybox's newlines are removed by ``tr``."""
        return (
            f"_cb_nonce={self.quote(check_nonce(nonce))}\n"
            "if base64 -w 0 </dev/null >/dev/null 2>&1; then _cb_64() { base64 -w 0; }\n"
            "else _cb_64() { base64 | tr -d '\\n'; }; fi\n"
            "_cb_f() { printf ' :'; printf '%s' \"$1\" | _cb_64; }\n"
            '_cb_rec() { printf \'@@%s %s\' "$_cb_nonce" "$1"; shift;'
            ' for _cb_a in "$@"; do _cb_f "$_cb_a"; done; echo; }\n'
            '_cb_recin() { printf \'@@%s %s\' "$_cb_nonce" "$1"; shift;'
            ' for _cb_a in "$@"; do _cb_f "$_cb_a"; done; printf \' :\'; _cb_64; echo; }'
        )

    def section_answer(self, nonce: str, kind: str, *fields: str) -> str:
        """Shell text for a command inside a section of a :meth:`sectioned` script: its stdin framed
        as one record of ``nonce`` (chosen by whoever reads that section; orchestrator/records.py):
        ``KIND FIELD... STDIN``, binary-safe. What a section's tools print (a rule comment, a policy
        description) then stays a field of its own answer, never the start of another one."""
        # the fields are known here: encoded here (no process); the stdin by the script's _cb_64
        q = self.quote
        head = f"printf '@@%s %s' {q(check_nonce(nonce))} {q(check_kind(kind))}"
        encoded = "".join(f" :{_b64(field)}" for field in fields) + " :"
        return "{ " + f"{head}; printf %s {q(encoded)}; _cb_64; echo; " + "}"

    def sectioned(self, sections: Sequence[tuple[str, str]], token: str) -> str:
        """Each section's command in a subshell (stdin /dev/null; its stderr is noise, missing tools:
        each fact reports failures itself), answered as a raw section of ``token`` (orchestrator/
        records.py): a ``section-raw NAME BOUNDARY`` record, the command's stdout as it printed it
        (binary-safe), a newline and ``@@BOUNDARY CODE``, the moment the command is done.

        BOUNDARY is drawn once per script from the kernel's random source by ``read`` (a builtin):
        a shell variable, exported to no command, so no output can hold it. The subshell's EXIT trap
        prints the end line, also after an ``exit`` in the command. No encoder process, no command
        substitution, no nested subshell: a read script asks a dozen sections of every node, and each
        process less is CPU every node saves (benchmarks/fanout.py). The encoder of records (and its
        probe of ``base64``) cost a process only when a section prints records of its own
        (:meth:`section_answer`: ``_cb_64``, which asks ``base64`` how to encode each time: it runs in
        a pipeline's subshell, where nothing it learnt would stay)."""
        parts = [
            f"_cb_nonce={self.quote(check_nonce(token))}",
            "_cb_64() { if base64 -w 0 </dev/null >/dev/null 2>&1; then base64 -w 0;"
            " else base64 | tr -d '\\n'; fi; }",
            # 32 hex digits: the uuid's five groups (or 16 random bytes in hex); none: nothing is sent
            "{ IFS=- read -r _cb_b _cb_b2 _cb_b3 _cb_b4 _cb_b5 </proc/sys/kernel/random/uuid; }"
            " 2>/dev/null && _cb_b=$_cb_b$_cb_b2$_cb_b3$_cb_b4$_cb_b5 ||"
            " _cb_b=$(od -An -N16 -tx1 /dev/urandom 2>/dev/null | tr -dc 0-9a-f)",
            '[ "${#_cb_b}" = 32 ] || { echo "no random source to frame the answers" >&2; exit 1; }',
            f'_cb_sec() {{ printf \'@@%s {RAW_SECTION} :%s :%s\\n\' "$_cb_nonce" "$1" "$_cb_b"; }}',
        ]
        for name, command in sections:
            label = _b64(name)
            ended = 'trap \'printf "\\n@@%s %s\\n" "$_cb_b" "$?"\' EXIT'
            # `|| :`: the script's own exit code is 0, whatever its last command's was
            parts.append(f"_cb_sec {label}\n( {ended}; {command}\n) 2>/dev/null </dev/null || :")
        return "\n".join(parts)

    def transfer_path(self, path: str) -> str:
        # SFTP paths are relative to the login directory; "~/" means exactly that.
        if path == "~":
            return "."
        if path.startswith("~/"):
            return path[2:]
        return path

    def local_argv(self, script: str) -> list[str]:
        return ["/bin/sh", "-c", script]

    # -- files through a command (protocol: platforms/transfer.py) ----------------------------------------

    def upload_script(
        self, remote: str | None, expected_sha256: str, *, mode: int | None = None, suffix: str = ".tmp"
    ) -> str:
        if remote is None:
            remote = f"/tmp/bootstrap-{uuid.uuid4().hex}{suffix}"
        return transfer.posix_put_script(self, remote, expected_sha256, mode=mode)

    def download_script(self, remote: str, chunk: int = transfer.GET_CHUNK) -> str:
        return transfer.posix_get_script(self, remote, chunk)

    def remove_file(self, remote: str) -> str:
        return transfer.posix_remove_script(self, remote)

    def long_script(self, script: str) -> ScriptFile:
        # private: a long script may carry secrets (a launch environment)
        return ScriptFile(script.encode("utf-8"), ".sh", 0o600)

    def run_long_script(self, path: str, script: str) -> str:
        return self.login_command(self.run_script(path))

    def ensure_authorized_key(self, public_line: str) -> str:
        """Add ``public_line`` to ~/.ssh/authorized_keys unless present; prints ``added`` or ``present``.

        Permissions follow sshd's StrictModes (700 dir, 600 file); a file without a final newline
        gets one first, so the new key never fuses with the last line.
        """
        key = self.quote(public_line)
        return (
            "umask 077\n"
            'd="$HOME/.ssh"; f="$d/authorized_keys"\n'
            'mkdir -p "$d" && chmod 700 "$d" && touch "$f" && chmod 600 "$f" || exit 1\n'
            f'if grep -qxF -- {key} "$f"; then echo present; exit 0; fi\n'
            'if [ -s "$f" ] && [ -n "$(tail -c 1 "$f")" ]; then echo >> "$f"; fi\n'
            f"printf '%s\\n' {key} >> \"$f\" && echo added"
        )

    @staticmethod
    def sudo_refused(stderr: str) -> bool:
        return any(marker in stderr for marker in SUDO_PASSWORD_MARKERS)
