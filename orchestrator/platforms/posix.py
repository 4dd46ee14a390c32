"""POSIX ``sh``: Linux nodes (and, later, commands inside WSL distributions)."""

from __future__ import annotations

import base64
import shlex
from collections.abc import Mapping, Sequence

from orchestrator.platforms.base import Platform, check_env_name

#: exit code reported when ``cd`` into the working directory fails (what ``env -C`` uses: 125).
CWD_FAILED_EXIT = 125

#: what sudo prints when ``-n`` refuses because it would have to ask for a password
SUDO_PASSWORD_MARKERS = ("a password is required", "a terminal is required")


#: a shell that outlives TERM/INT/HUP until its foreground command is done (see PosixShell.logged).
#: A handler, not '': an ignored signal would be inherited by the command itself.
_WAIT_FOR_COMMAND = "trap : TERM INT HUP; "


class PosixShell(Platform):
    name = "posix"

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
        inner = f"/bin/sh -c {self.quote(script)}"
        return f'if [ "$(id -u)" = 0 ]; then {inner}; else sudo -n -- {inner}; fi'

    def stop_on_hangup(self, script: str, *, heartbeat: float | None = None) -> str:
        """``script`` run as its own process group, stopped with everything it started when our
        stdin reaches EOF or, with ``heartbeat``, when no byte arrived on it for 3 heartbeats.

        A remote command outlives its SSH channel (no pty, no SIGHUP), so a timeout or a Ctrl-C on
        the controller would leave it running. The transport keeps the channel's stdin open and
        closes it to cancel (or closes the channel when the command is done); a controller killed
        outright closes it too (its TCP connection ends). A node cut off from the network hears
        nothing at all: with ``heartbeat`` the transport writes a byte every ``heartbeat`` seconds
        and the watcher gives up after three missed ones (issue 17: a partitioned node's training
        ran on unseen). The watcher then TERMs the job's process group and every process carrying
        the job's token (CB_WATCH, inherited by every descendant: torchrun's workers live in
        sessions of their own), and KILLs what is left 5 s later (ranks that ignore TERM).
        ``setsid`` makes the group (dash refuses ``set -m`` without a terminal); the job's stdin is
        /dev/null, so it cannot eat the watcher's EOF. Whatever must outlive a command has to leave
        the group and drop the token itself (detached launches do).
        """
        # Background jobs of a non-interactive sh get /dev/null as stdin (POSIX): the channel's
        # stdin is kept on fd 3 for the watcher.
        job = f"/bin/sh -c {self.quote(script)} </dev/null 3<&- &"
        if heartbeat is None:
            listen = "cat <&3 >/dev/null"
        else:
            # one read at a time, each bounded: a heartbeat (or any byte) goes on, EOF or silence ends
            silence = max(1, round(3 * heartbeat))
            read_one = f"timeout {silence} dd bs=64 count=1 <&3 2>/dev/null | wc -c"
            listen = (
                "if command -v timeout >/dev/null 2>&1; then"
                f' while [ "$({read_one})" -gt 0 ]; do :; done;'
                " else cat <&3 >/dev/null; fi"
            )
        return (
            "exec 3<&0\n"
            # the job's token, in the environment of everything the job starts, wherever that runs
            # (not in ours: the watcher would find itself)
            "tok=$$.$(cat /proc/sys/kernel/random/uuid 2>/dev/null || date +%s)\n"
            "if command -v setsid >/dev/null 2>&1; then\n"
            f'  CB_WATCH="$tok" setsid {job}\n'
            "  job=$! target=-$!\n"  # the job's process group
            "else\n"
            f'  CB_WATCH="$tok" {job}\n'
            "  job=$! target=$!\n"  # no setsid (rare): the job's first process only
            "fi\n"
            '_cb_tok() { grep -lzxF "CB_WATCH=$tok" /proc/[0-9]*/environ 2>/dev/null'
            ' | sed -n "s#^/proc/\\([0-9]*\\)/environ\\$#\\1#p"; }\n'
            # After a normal end (USR1 from below) only the group's leftovers are stopped: a daemon the
            # command started on purpose (chronyd) carries the token too. While the job still runs
            # (cancel, timeout, silence, a controller gone), everything with the token goes. EOF can
            # come before the job has called setsid: no group yet, the job's process itself is stopped.
            "{ trap 'ended=1' USR1; "
            f"{listen};"
            ' if [ -n "$ended" ]; then kill -TERM "$target"; exit 0; fi;'
            ' kill -TERM "$target" || kill -TERM "$job"; p=$(_cb_tok); [ -n "$p" ] && kill -TERM $p;'
            ' i=0; while [ $i -lt 50 ] && { kill -0 "$target" || [ -n "$(_cb_tok)" ]; }; do'
            " sleep 0.1; i=$((i + 1)); done;"
            ' kill -KILL "$target" || kill -KILL "$job"; p=$(_cb_tok); [ -n "$p" ] && kill -KILL $p; }'
            " >/dev/null 2>&1 &\n"
            "w=$!\n"
            "exec 3<&-\n"
            'wait "${target#-}"; rc=$?; kill -USR1 "$w" 2>/dev/null; exit "$rc"'
        )

    def other_runs(self, own: str) -> str:
        """One line ``@@leftover COUNT MARKER`` per run (other than ``own``, a RUN_MARKER_ENV value)
        that still has processes on the node: what a new launch should know is running beside it."""
        return (
            f"grep -azo '^{self.RUN_MARKER_ENV}=[^[:cntrl:]]*' /proc/[0-9]*/environ 2>/dev/null"
            f" | tr '\\0' '\\n' | sed 's/^[^=]*=//' | grep -vxF {self.quote(own)} | sort | uniq -c"
            ' | while read -r n m; do echo "@@leftover $n $m"; done'
        )

    def say_if_exists(self, path: str, word: str) -> str:
        """A line that prints ``word`` and ends the script (exit 0) when ``path`` exists."""
        return f"if [ -e {self.path_word(path)} ]; then echo {self.quote(word)}; exit 0; fi"

    def run_script(self, path: str) -> str:
        """Run the script file at ``path`` (on the node) with /bin/sh."""
        return f"/bin/sh {self.path_word(path)}"

    def mkdir(self, path: str, *, private: bool = False) -> str:
        """``mkdir -p``; ``private``: the directory itself only for its owner (0700), so files put
        into it (a launch script holding secrets) cannot be opened by anyone else, even for the
        moment before their own mode is set."""
        word = self.path_word(path)
        return f"mkdir -p -- {word}" + (f" && chmod 700 -- {word}" if private else "")

    def logged(self, command: str, log: str) -> str:
        """``command`` with its output (stdout and stderr together) also appended to ``log`` on the
        node, keeping the command's exit code (POSIX sh has no pipefail).

        A stop (TERM, INT or HUP to every process of the run: `stop --run`, Ctrl-C, a lost
        controller) must not cut the log short: the command handles it (torchrun stops its workers,
        the rank capture delivers what they wrote up to then), while the shells around it wait for
        it (a trap runs only once the foreground command is done) and tee ignores the signal, so
        every line still reaches ``log`` and the exit-code file is written last. KILL, the stop's
        last resort after its grace period, still ends them all.
        """
        rc = self.path_word(log + ".rc")
        # the exit-code file appears only once tee has written everything: `logs --follow` ends
        # when it sees that file, and must find the log complete then
        part = self.path_word(log + ".rc.part")
        tee = f"(trap '' TERM INT HUP; exec tee -a {self.path_word(log)})"
        return (
            f"{_WAIT_FOR_COMMAND}\n"
            f"{{ {_WAIT_FOR_COMMAND}{command} 2>&1; echo $? > {part}; }} | {tee}\n"
            f'mv -f {part} {rc}\nexit "$(cat {rc})"'
        )

    # -- runs: identity, detached start, stop, status, log tail from a byte offset ----------------
    # A run's processes are found by what they carry, never by their names: the launcher's session
    # (its leader checked against the pid and start time written when it started, so a recycled pid
    # is never taken for it) and the RUN_MARKER_ENV variable every descendant inherits.

    #: environment variable holding ``<run-id>/<node>`` in every process of a run
    RUN_MARKER_ENV = "CLUSTER_BOOTSTRAP_RUN"

    def run_identity(self, run_dir: str, marker: str) -> str:
        """Lines that make the current shell the run's known launcher: the marker exported for every
        descendant, ``<run_dir>/pid`` = "PID SESSION STARTTIME" (STARTTIME: field 22 of
        /proc/PID/stat, clock ticks since boot: with the pid it names one process for good)."""
        return (
            f"export {self.RUN_MARKER_ENV}={self.quote(marker)}\n"
            f"_cb_d={self.path_word(run_dir)}\n"
            '_cb_self() { set -- $1; printf \'%s %s %s\\n\' "$$" "${4:--}" "${20:--}"; }\n'
            '{ IFS= read -r _cb_l < "/proc/$$/stat"; } 2>/dev/null || _cb_l=") ?"\n'
            '_cb_self "${_cb_l##*) }" > "$_cb_d/pid.part" && mv -f "$_cb_d/pid.part" "$_cb_d/pid"'
        )

    def _run_functions(self, run_dir: str, marker: str) -> str:
        """Shell functions shared by stop, status and the log tail (``$d`` = the run directory)."""
        env_line = self.quote(f"{self.RUN_MARKER_ENV}={marker}")
        return (
            f"d={self.path_word(run_dir)}\n"
            f"m={env_line}\n"
            # the launcher, when it still runs: the pid file's pid with the recorded start time
            "_cb_leader() {\n"
            '  [ -f "$d/pid" ] || return 1\n'
            '  read -r _cb_pid _cb_sid _cb_start < "$d/pid" || return 1\n'
            '  { IFS= read -r _cb_l < "/proc/$_cb_pid/stat"; } 2>/dev/null || return 1\n'
            '  _cb_check "${_cb_l##*) }"\n'
            "}\n"
            '_cb_check() { set -- $1; [ "$1" != Z ] && [ "${20}" = "$_cb_start" ]; }\n'
            # every live process of the run: members of the launcher's session ($_cb_sess, set once
            # while the leader was verified) and every process carrying the marker; zombies excluded
            "_cb_members() {\n"
            "  {\n"
            '  if [ -n "$_cb_sess" ]; then\n'
            "    for _cb_s in /proc/[0-9]*/stat; do\n"
            '      { IFS= read -r _cb_l < "$_cb_s"; } 2>/dev/null || continue\n'
            "      _cb_p=${_cb_s#/proc/}; _cb_p=${_cb_p%/stat}\n"
            '      [ "$_cb_p" = "$$" ] && continue\n'
            '      _cb_in "${_cb_l##*) }" && echo "$_cb_p"\n'
            "    done\n"
            "  fi\n"
            '  grep -lzxF -e "$m" /proc/[0-9]*/environ 2>/dev/null'
            ' | sed -n "s#^/proc/\\([0-9]*\\)/environ\\$#\\1#p"\n'
            "  } | sort -u\n"
            "}\n"
            '_cb_in() { set -- $1; [ "$1" != Z ] && [ "$4" = "$_cb_sess" ]; }\n'
            "_cb_sess=\n"
            'if _cb_leader && [ "$_cb_sid" = "$_cb_pid" ]; then _cb_sess=$_cb_pid; fi\n'
        )

    def start_detached(self, run_dir: str, script: str, log: str, marker: str) -> str:
        """Start ``script`` in a session of its own that outlives our connection (setsid; stdin
        /dev/null, output appended to ``log``; ``log``.rc gets its exit code), then wait until it has
        written its pid file and print that file. Refuses a run directory that already has one."""
        inner = (
            _WAIT_FOR_COMMAND  # a stop ends the script, and only then this shell writes its exit code
            + self.run_identity(run_dir, marker)
            + f"\n/bin/sh {self.path_word(script)} >> {self.path_word(log)} 2>&1 </dev/null"
            + f"\necho $? > {self.path_word(log + '.rc.part')}"
            + f" && mv -f {self.path_word(log + '.rc.part')} {self.path_word(log + '.rc')}"
        )
        return (
            f"d={self.path_word(run_dir)}\n"
            'if [ -e "$d/pid" ]; then echo "@@started-before $(cat "$d/pid")"; exit 3; fi\n'
            "command -v setsid >/dev/null 2>&1 || { echo 'setsid not found (util-linux)' >&2; exit 4; }\n"
            # outside the command's reach on purpose: a session of its own, without the token the
            # command's watcher stops everything by (stop_on_hangup)
            f"(unset CB_WATCH; exec setsid /bin/sh -c {self.quote(inner)} </dev/null >/dev/null 2>&1) &\n"
            "i=0\n"
            'while [ ! -s "$d/pid" ]; do\n'
            "  i=$((i + 1)); [ $i -gt 200 ] && { echo 'the launcher did not start' >&2; exit 5; }\n"
            "  sleep 0.05\n"
            "done\n"
            'echo "@@started $(cat "$d/pid")"'
        )

    def stop_run(self, run_dir: str, marker: str, grace: float = 5.0) -> str:
        """TERM every process of the run, KILL what is left after ``grace`` seconds. Prints one line:
        ``@@stop stopped TERMED KILLED LEFT`` or ``@@stop exited CODE|gone|not-started|no-run``."""
        hundredths = max(1, int(grace * 100))
        return (
            self._run_functions(run_dir, marker)
            # deadlines on the uptime clock (hundredths of a second): a loaded node must not
            # stretch the grace period by the time each scan takes
            + "_cb_now() { read -r _cb_up _cb_x < /proc/uptime; _cb_up=${_cb_up%.*}${_cb_up#*.}; }\n"
            "p=$(_cb_members)\n"
            'if [ -z "$p" ]; then\n'
            '  if [ -f "$d/node.log.rc" ]; then echo "@@stop exited $(cat "$d/node.log.rc")"\n'
            '  elif [ -f "$d/pid" ]; then echo "@@stop gone"\n'
            '  elif [ -d "$d" ]; then echo "@@stop not-started"\n'
            '  else echo "@@stop no-run"; fi\n'
            "  exit 0\n"
            "fi\n"
            'n=$(printf "%s\\n" "$p" | wc -l)\n'
            # said before the signal: status and a foreground launch tell "stopped" from "failed"
            'date +%s > "$d/stopped" 2>/dev/null\n'
            "kill -TERM $p 2>/dev/null\n"
            f"_cb_now; end=$((_cb_up + {hundredths}))\n"
            "while :; do\n"
            '  p=$(_cb_members); [ -z "$p" ] && break\n'
            '  _cb_now; [ "$_cb_up" -ge "$end" ] && break\n'
            "  sleep 0.1\n"
            "done\n"
            "k=0\n"
            'if [ -n "$p" ]; then\n'
            '  k=$(printf "%s\\n" "$p" | wc -l); kill -KILL $p 2>/dev/null\n'
            "  _cb_now; end=$((_cb_up + 300))\n"
            '  while [ -n "$(_cb_members)" ]; do\n'
            '    _cb_now; [ "$_cb_up" -ge "$end" ] && break; sleep 0.1\n'
            "  done\n"
            "fi\n"
            'echo "@@stop stopped $n $k $(_cb_members | wc -l)"'
        )

    def run_status(self, run_dir: str, marker: str, log: str) -> str:
        """``key=value`` lines: node clock, launcher alive, start/end times (file mtimes on the node's
        clock), exit code, log size, last-modified time and last line, one ``gpu=`` line per GPU
        where nvidia-smi exists."""
        return (
            self._run_functions(run_dir, marker) + f"f={self.path_word(log)}\n"
            'echo "now=$(date +%s)"\n'
            'if [ ! -d "$d" ]; then echo "state=no-run"; exit 0; fi\n'
            'if [ -f "$d/pid" ]; then echo "started=$(stat -c %Y "$d/pid")"; fi\n'
            # alive: the launcher, or any process of the run at all (its record may say otherwise:
            # a launcher killed while ranks that ignore TERM live on)
            'if _cb_leader || [ -n "$(_cb_members)" ]; then echo "alive=1"; else echo "alive=0"; fi\n'
            'if [ -f "$f.rc" ]; then echo "rc=$(cat "$f.rc")"; echo "ended=$(stat -c %Y "$f.rc")"; fi\n'
            'if [ -f "$d/stopped" ]; then echo "stopped=$(cat "$d/stopped")"; fi\n'
            'if [ -f "$f" ]; then\n'
            '  echo "size=$(wc -c < "$f")"\n'
            # the time of the last output: how long a stopped (killed) run ran, at least
            '  echo "modified=$(stat -c %Y "$f")"\n'
            # the last line a rank printed (torchrun's own exit-barrier noise after a good run is not
            # what a user asks about), else the log's last line
            "  _cb_t=$(tail -c 65536 \"$f\" | tr -d '\\r' | grep -v '^[[:space:]]*$')\n"
            "  _cb_r=$(printf '%s\\n' \"$_cb_t\" | grep '^\\[default[0-9]*\\]:' | tail -n 1)\n"
            '  [ -n "$_cb_r" ] || _cb_r=$(printf \'%s\\n\' "$_cb_t" | tail -n 1)\n'
            '  echo "last=$(printf \'%s\' "$_cb_r" | cut -c1-400)"\n'
            "fi\n"
            "if command -v nvidia-smi >/dev/null 2>&1; then\n"
            "  nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total"
            " --format=csv,noheader,nounits 2>/dev/null | sed 's/^/gpu=/'\n"
            "fi"
        )

    def tail_log(
        self,
        run_dir: str,
        marker: str,
        log: str,
        offset: int,
        *,
        follow: bool,
        interval: float = 0.05,
        lines: int | None = None,
    ) -> str:
        """Print ``log`` from byte ``offset``, complete lines only (a line starting with ``@@`` gets one
        more ``@``), each batch followed by ``@@. OFFSET`` (the byte offset just past it): a last
        line without its newline is held back until the launcher has ended. Sizes are taken before
        reading, so a line being written is never cut. With ``follow`` it polls until the launcher
        has ended (exit-code file, or its process gone) and everything is read. Ends with
        ``@@end CODE|none OFFSET`` (``@@missing``: no such run).

        ``lines`` (``logs --tail``): start at the ``lines``-th last complete line instead of
        ``offset`` and print ``@@start OFFSET`` first (0 when there is no log yet). Found without
        reading the whole log: ``dd`` seeks to a window before the end (64 KiB, doubled until it
        holds enough newlines) and awk notes the newlines in it, stopping at the size measured
        first. The log is only ever appended to, so the bytes before that size do not change while
        they are read: the start is exact and on a line boundary; what the launcher writes meanwhile
        comes after it and is read by the loop. A last line without newline counts only once the
        launcher has ended (it is sent only then); the end is checked before the size is taken."""
        start = ""
        if lines is not None:
            # newline positions in [base, size) (a ring of the last n + 1); prints the start, or "-"
            # when the window begins after the first byte and holds too few of them
            count = (
                "BEGIN { o = o0 } { e = o + length($0); if (e >= size) exit; c++; p[c % k] = e"
                "; if (e == size - 1) nl = 1; o = e + 1 }"
                " END { need = n + 1; if (fin && !nl) need = n;"
                ' if (need == 0) printf "%.0f\\n", size;'
                ' else if (c >= need) printf "%.0f\\n", p[(c - need + 1) % k] + 1;'
                ' else if (o0 == 0) print 0; else print "-" }'
            )
            start = (
                f"n={max(0, int(lines))}\n"
                "fin=0\n"
                'if [ -f "$f.rc" ]; then fin=1; elif [ -f "$d/pid" ] && ! _cb_leader; then fin=1; fi\n'
                'size=0; [ -f "$f" ] && size=$(wc -c < "$f")\n'
                "off=0\n"
                'if [ "$size" -gt 0 ]; then\n'
                "  w=1; nb=$(((size + 65535) / 65536))\n"
                "  while :; do\n"
                '    skip=$((nb - w)); [ "$skip" -lt 0 ] && skip=0\n'
                '    off=$(dd if="$f" bs=65536 skip="$skip" 2>/dev/null'
                ' | LC_ALL=C awk -v o0=$((skip * 65536)) -v size="$size" -v n="$n" -v k=$((n + 1))'
                f' -v fin="$fin" {self.quote(count)})\n'
                '    [ "$off" != - ] && break\n'
                "    w=$((w * 2))\n"
                "  done\n"
                "fi\n"
                'case $off in ""|*[!0-9]*) echo "cannot find the last $n lines of $f" >&2; exit 1;; esac\n'
                'echo "@@start $off"\n'
            )
        awk = (
            "{ e = o + length($0) + 1; if (e > size) { if (!fin) exit; e = size }"
            ' if (substr($0, 1, 2) == "@@") printf "@"; print; o = e }'
            # "@@. OFFSET": the batch before it arrived whole (the reader holds it until then)
            ' END { printf "@@. %.0f\\n", o; printf "%.0f\\n", o > "/dev/stderr" }'
        )
        return (
            self._run_functions(run_dir, marker) + f"f={self.path_word(log)}\n"
            f"off={int(offset)}\n"
            'if [ ! -d "$d" ]; then echo "@@missing"; exit 0; fi\n'
            "exec 4>&1\n" + start + "while :; do\n"
            "  fin=0\n"
            '  if [ -f "$f.rc" ]; then fin=1; elif [ -f "$d/pid" ] && ! _cb_leader; then fin=1; fi\n'
            '  size=0; [ -f "$f" ] && size=$(wc -c < "$f")\n'
            '  if [ "$size" -gt "$off" ]; then\n'
            # awk stops at the first line ending past $size (bytes written after it was measured)
            '    off=$(tail -c +$((off + 1)) "$f" 2>/dev/null'
            f' | LC_ALL=C awk -v o="$off" -v size="$size" -v fin="$fin" {self.quote(awk)} 2>&1 >&4)\n'
            "  fi\n"
            '  [ "$fin" = 1 ] && break\n' + ("" if follow else "  break\n") + f"  sleep {interval:g}\n"
            "done\n"
            'rc=none; [ -f "$f.rc" ] && read -r rc < "$f.rc"\n'
            'echo "@@end ${rc:-none} $off"'
        )

    def tail_log_python(
        self,
        python: str,
        program: str,
        run_dir: str,
        log: str,
        offset: int,
        *,
        follow: bool,
        interval: float,
        lines: int | None = None,
    ) -> str:
        """``tail_log`` done by one Python process on the node (the interpreter the run uses): no
        process per poll, so lines arrive within ``interval`` even on a busy node. ``program``
        speaks the same protocol (steps/runs.py FOLLOW_PROGRAM); ``lines`` as in ``tail_log``."""
        count = -1 if lines is None else max(0, int(lines))
        return (
            f"d={self.path_word(run_dir)}\n"
            'if [ ! -d "$d" ]; then echo "@@missing"; exit 0; fi\n'
            f"exec {self.quote(python)} -c {self.quote(program)} {self.path_word(log)}"
            f' {self.path_word(log + ".rc")} "$d/pid" {int(offset)} {1 if follow else 0} {interval:g} {count}'
        )

    def list_files(self, candidates: Sequence[Sequence[str]]) -> str:
        """For each entry: the first of its candidate paths that exists, as ``@@file I SIZE PATH``,
        ``@@dir I PATH`` followed by ``SIZE RELPATH`` per file below it, or ``@@missing I``."""
        parts = []
        for index, paths in enumerate(candidates):
            words = " ".join(self.path_word(p) for p in paths)
            parts.append(
                f'found=; for c in {words}; do [ -e "$c" ] && {{ found=$c; break; }}; done\n'
                f'if [ -z "$found" ]; then echo "@@missing {index}"\n'
                f'elif [ -d "$found" ]; then echo "@@dir {index} $found"\n'
                '  (cd "$found" && find . -type f -exec sh -c '
                '\'for f; do printf "%s %s\\n" "$(wc -c < "$f")" "$f"; done\' sh {} +)\n'
                f'else echo "@@file {index} $(wc -c < "$found") $found"; fi'
            )
        return "\n".join(parts)

    def login_command(self, script: str) -> str:
        """One line any login shell passes to ``/bin/sh`` unchanged: the script travels base64-encoded.

        sshd runs commands through the user's login shell, which may be csh (no multi-line quoted
        strings) or fish (other escapes). Base64 text has no character any of them treats specially;
        stdin stays the channel's (eval, not a pipe into sh), which ``stop_on_hangup`` relies on.
        """
        encoded = base64.b64encode(script.encode()).decode()
        return f"/bin/sh -c 'eval \"$(printf %s {encoded} | base64 -d)\"'"

    def sectioned(self, sections: Sequence[tuple[str, str]], token: str) -> str:
        parts = []
        for name, command in sections:
            begin = self.quote(f"@@{token} begin {name}@@")
            # stderr of fact commands is noise (missing tools); each fact reports failures itself.
            parts.append(
                f"printf '%s\\n' {begin}\n"
                f"( {command}\n) 2>/dev/null </dev/null\n"
                f"printf '\\n@@{token} end {name} %s@@\\n' \"$?\""
            )
        return "\n".join(parts)

    def transfer_path(self, path: str) -> str:
        # SFTP paths are relative to the login directory; "~/" means exactly that.
        if path == "~":
            return "."
        if path.startswith("~/"):
            return path[2:]
        return path

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
