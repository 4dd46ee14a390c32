"""Runs on Linux and WSL nodes, in POSIX sh: the launcher's identity, detached start, stop, status,
the log tail and file listing for `fetch`.

A run's processes are found by what they carry, never by their names: the launcher's session (its
leader checked against the pid and start time written when it started, so a recycled pid is never
taken for it) and the run marker (layout.RUN_MARKER_ENV) every descendant inherits. Everything here
reads /proc: Linux (and WSL2) only.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator import records
from orchestrator.platforms import PosixShell
from orchestrator.runs import tail
from orchestrator.runs.base import LISTING_CAP, RunOps
from orchestrator.runs.layout import RUN_DIR_ENV, RUN_MARKER_ENV, SIGNALLED, STOPPED

#: a shell that outlives TERM/INT/HUP until its foreground command is done (see PosixRuns.logged).
#: A handler, not '': an ignored signal would be inherited by the command itself.
WAIT_FOR_COMMAND = "trap : TERM INT HUP; "
#: the lines after torchrun's last "Root Cause (first observed failure):" up to its closing rule (at
#: most 12, each cut to 400 characters): its root cause's rank and exit code (runs/culprit.py)
CAUSE_AWK = (
    "awk '/^Root Cause \\(first observed failure\\):/{n=0;s=1;next} /^=====/{s=0} "
    "s&&n<12{n++;l[n]=substr($0,1,400)} END{for(i=1;i<=n;i++)print l[i]}'"
)


class PosixRuns(RunOps):
    """Linux and WSL-mode nodes: sessions, the run marker in the environment, /proc."""

    launcher = "launch.sh"
    uses_python = True

    platform: PosixShell

    def __init__(self, platform: PosixShell) -> None:
        self.platform = platform

    # -- a run's identity, and a foreground run's output -------------------------------------------

    def run_identity(self, run_dir: str, marker: str) -> str:
        """Lines that make the current shell the run's known launcher: the marker exported for every
        descendant, ``<run_dir>/pid`` = "PID SESSION STARTTIME" (STARTTIME: field 22 of
        /proc/PID/stat, clock ticks since boot: with the pid it names one process for good).
        Nothing is written unless the run directory is ours alone (``check_own_dir``), and
        ``pid.part`` only as a new file (noclobber): never through a link planted in its place."""
        return (
            self.platform.check_own_dir(run_dir) + "\n"
            f"_cb_d={self.platform.path_word(run_dir)}\n"
            '_cb_self() { set -- $1; printf \'%s %s %s\\n\' "$$" "${4:--}" "${20:--}"; }\n'
            '_cb_token() { set -- $1; printf \'%s-%s\' "$$" "${20:--}"; }\n'
            '{ IFS= read -r _cb_l < "/proc/$$/stat"; } 2>/dev/null || _cb_l=") ?"\n'
            # the marker ends in this launcher's pid and start time (the pid file's): unique, so
            # another launch of the same run id and node (from another directory, or a same-named
            # cluster sharing this machine) is never taken for this one
            f"export {RUN_MARKER_ENV}={self.platform.quote(marker + '/')}"
            '"$(_cb_token "${_cb_l##*) }")"\n'
            # the run directory as this node spells it (the word functions() gives $d): a run whose
            # directory is gone is known by it, not by its id alone (another workdir's run of that id)
            f'export {RUN_DIR_ENV}="$_cb_d"\n'
            '(set -C; _cb_self "${_cb_l##*) }" > "$_cb_d/pid.part") && mv -f "$_cb_d/pid.part" "$_cb_d/pid"'
        )

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
        rc = self.platform.path_word(log + ".rc")
        # a signal that reached this shell (the watcher of a controller that went away or was
        # interrupted, or anyone's) is marked before the exit code, beside what `stop --run` marks
        # (``stopped``, which says who): `status` then says "stopped", not "exited (1)"
        run_dir = log.rsplit("/", 1)[0] if "/" in log else "."
        here = self.platform.path_word(run_dir)
        stopped = self.platform.path_word(f"{run_dir}/{STOPPED}")
        signalled = self.platform.path_word(f"{run_dir}/{SIGNALLED}")
        signalled_part = self.platform.path_word(f"{run_dir}/{SIGNALLED}.part")
        # the exit-code file appears only once tee has written everything: `logs --follow` ends
        # when it sees that file, and must find the log complete then
        part = self.platform.path_word(log + ".rc.part")
        tee = f"(trap '' TERM INT HUP; exec tee -a {self.platform.path_word(log)} >&4 3>&-)"
        # The exit code leaves the pipeline on fd 3, captured (POSIX sh has no pipefail), not
        # through a file: a training script that removed its run directory still gets its own code
        # (the file cannot be written then: one line says so). The command and what it starts hold
        # neither fd 3 nor 4 (a daemon it left would keep the capture open); every subshell waits
        # for the command through a stop, as the trap says.
        return (
            "_cb_sig=; trap '_cb_sig=1' TERM INT HUP\nexec 4>&1\n"
            f"_cb_rc=$({WAIT_FOR_COMMAND}{{ {{ {WAIT_FOR_COMMAND}{command} 3>&- 4>&- 2>&1; echo $? >&3; }}"
            f" | {tee}; }} 3>&1)\n"
            "_cb_rc=${_cb_rc:-1}\n"
            f'if [ -n "$_cb_sig" ] && [ ! -e {stopped} ]; then'
            f" (set -C; date +%s > {signalled_part}) 2>/dev/null && mv -f {signalled_part} {signalled};"
            # the log says it too: read later (`logs`, or on the node), it would end in torchrun's
            # SignalException with nothing saying where the signal came from
            f" printf 'bootstrap: %s: the run was stopped by a signal (TERM, INT or HUP), not by bootstrap"
            " stop: its controller stopped it (another node failed first, or Ctrl-C there), or was lost"
            " (its connection closed or went silent: the node then stops the run by itself), or a"
            " process on this node sent it\\n'"
            f' "$(date -u "+%Y-%m-%d %H:%M:%S UTC")" >> {self.platform.path_word(log)} 2>/dev/null; fi\n'
            # noclobber: the exit code goes into a new file, never through a link planted as .part
            f'{{ set -C; echo "$_cb_rc" > {part} && mv -f {part} {rc}; }} 2>/dev/null || {{'
            # why, as far as the shell can tell: a full disk (the usual one: a log or checkpoints
            # filled it) is said with what is left, not taken for a removed directory
            f' if [ -d {here} ]; then _cb_why="writing there failed (a full disk? $(df -Pk {here} 2>/dev/null'
            " | awk 'NR == 2 { print $4 }') KiB free there; or a file of that name is in the way)\";"
            ' else _cb_why="the run directory is gone (removed while the run ran?)"; fi;'
            " printf 'bootstrap: exit code %s not recorded in %s: %s\\n'"
            f' "$_cb_rc" {rc} "$_cb_why" >&2; }}\n'
            'exit "$_cb_rc"'
        )

    def other_runs(self, own: str, nonce: str, runs_root: str) -> str:
        """One record ``leftover COUNT MARKER`` per run (other than ``own``, a RUN_MARKER_ENV value)
        that still has processes of this user on the node, its run directory below ``runs_root``
        (this workdir's runs: another cluster's or workdir's run on a shared machine is not one
        `stop --run` here could end): what a new launch should know is running beside it."""
        return (
            self.platform.record_functions(nonce) + "\n"
            f"_cb_root={self.platform.path_word(runs_root.rstrip('/'))}/\n"
            # each process's marker and run directory, as "FILE:NAME=VALUE" lines (only ours: a
            # process of another user may carry any marker)
            '(set -- /dev/null; for f in /proc/[0-9]*/environ; do [ -O "$f" ] && set -- "$@" "$f"; done\n'
            f" grep -azoH -e '^{RUN_MARKER_ENV}=[^[:cntrl:]]*'"
            f" -e '^{RUN_DIR_ENV}=[^[:cntrl:]]*' \"$@\" 2>/dev/null)"
            " | tr '\\0' '\\n' | awk -v root=\"$_cb_root\""
            ' \'{ i = index($0, ":"); f = substr($0, 1, i - 1); v = substr($0, i + 1);'
            f' if (index(v, "{RUN_MARKER_ENV}=") == 1) m[f] = substr(v, {len(RUN_MARKER_ENV) + 2});'
            f" else d[f] = substr(v, {len(RUN_DIR_ENV) + 2}) }}"
            ' END { for (f in m) if (index(d[f] "/", root) == 1) print m[f] }\''
            # without the launcher's token (run_identity): one count per run and node
            " | sed 's#/[0-9][0-9]*-[0-9-]*$##'"
            f" | grep -vxF {self.platform.quote(own)} | sort | uniq -c"
            ' | while read -r n m; do _cb_rec leftover "$n" "$m"; done'
        )

    # -- the run's scripts -------------------------------------------------------------------------

    def functions(self, run_dir: str, marker: str) -> str:
        """Shell functions shared by stop, status and the log tail (``$d`` = the run directory)."""
        env_line = self.platform.quote(f"{RUN_MARKER_ENV}={marker}/")
        return (
            f"d={self.platform.path_word(run_dir)}\n"
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
            # the marker with this launch's token (its pid file: "PID SESSION START"); only when
            # the run directory is gone (nothing to tell the token), any launch of the run here whose
            # processes carry this directory as RUN_DIR_ENV (the same run id launched from another
            # workdir is another run). A directory without a pid file: its launcher never started,
            # so nothing carries its marker
            '  if [ -n "$_cb_tok" ]; then grep -lzxF -e "$m$_cb_tok" /proc/[0-9]*/environ 2>/dev/null\n'
            '  elif [ ! -e "$d" ]; then grep -lzF -e "$m" /proc/[0-9]*/environ 2>/dev/null |'
            f' while IFS= read -r _cb_e; do grep -qzxF -e "{RUN_DIR_ENV}=$d" "$_cb_e" 2>/dev/null &&'
            ' echo "$_cb_e"; done; fi'
            ' | sed -n "s#^/proc/\\([0-9]*\\)/environ\\$#\\1#p"\n'
            "  } | sort -u\n"
            "}\n"
            '_cb_in() { set -- $1; [ "$1" != Z ] && [ "$4" = "$_cb_sess" ]; }\n'
            # the pid file is believed only in a directory no other user could have planted or written
            + self.platform.check_own_dir(run_dir)
            + "\n"
            "_cb_sess=\n"
            'if _cb_leader && [ "$_cb_sid" = "$_cb_pid" ]; then _cb_sess=$_cb_pid; fi\n'
            "_cb_tok=\n"
            'if [ -f "$d/pid" ] && read -r _cb_tp _cb_ts _cb_tt < "$d/pid"; then\n'
            "  _cb_tok=$_cb_tp-$_cb_tt\n"
            "fi\n"
        )

    def start(self, run_dir: str, node_log: str, marker: str, nonce: str) -> str:
        """Start the launcher in a session of its own that outlives our connection (setsid; stdin
        /dev/null, output appended to ``node_log``; ``node_log``.rc gets its exit code), then wait
        until it has written its pid file and print that file (record ``started``). Refuses a run
        directory that already has one (record ``started-before``, exit 3)."""
        word = self.platform.path_word
        inner = (
            WAIT_FOR_COMMAND  # a stop ends the script, and only then this shell writes its exit code
            + self.run_identity(run_dir, marker)
            + f"\n/bin/sh {word(f'{run_dir}/{self.launcher}')} >> {word(node_log)} 2>&1 </dev/null"
            + f"\n_cb_rc=$?; set -C; echo $_cb_rc > {word(node_log + '.rc.part')}"
            + f" && mv -f {word(node_log + '.rc.part')} {word(node_log + '.rc')}"
        )
        return (
            self.platform.record_functions(nonce) + "\n"
            f"d={self.platform.path_word(run_dir)}\n" + self.platform.check_own_dir(run_dir) + "\n"
            'if [ -e "$d/pid" ]; then _cb_rec started-before "$(cat "$d/pid")"; exit 3; fi\n'
            "command -v setsid >/dev/null 2>&1 || { echo 'setsid not found (util-linux)' >&2; exit 4; }\n"
            # outside the command's reach on purpose: a session of its own, without the token the
            # command's watcher stops everything by (stop_on_hangup)
            f"(unset CB_WATCH; exec setsid /bin/sh -c {self.platform.quote(inner)}"
            " </dev/null >/dev/null 2>&1) &\n"
            "i=0\n"
            'while [ ! -s "$d/pid" ]; do\n'
            "  i=$((i + 1)); [ $i -gt 200 ] && { echo 'the launcher did not start' >&2; exit 5; }\n"
            "  sleep 0.05\n"
            "done\n"
            '_cb_rec started "$(cat "$d/pid")"'
        )

    def stop(self, run_dir: str, marker: str, grace: float, nonce: str) -> str:
        """TERM every process of the run, KILL what is left after ``grace`` seconds. Prints one record:
        ``stop stopped TERMED KILLED LEFT`` or ``stop earlier TIME|exited CODE|gone|not-started|no-run``
        (earlier: a stop before this one stopped it, at TIME)."""
        hundredths = max(1, int(grace * 100))
        return (
            self.platform.record_functions(nonce)
            + "\n"
            + self.functions(run_dir, marker)
            # deadlines on the uptime clock (hundredths of a second): a loaded node must not
            # stretch the grace period by the time each scan takes
            + "_cb_now() { read -r _cb_up _cb_x < /proc/uptime; _cb_up=${_cb_up%.*}${_cb_up#*.}; }\n"
            "p=$(_cb_members)\n"
            'if [ -z "$p" ]; then\n'
            f'  if [ -f "$d/{STOPPED}" ]; then _cb_rec stop earlier "$(cat "$d/{STOPPED}")"\n'
            f'  elif [ -f "$d/{SIGNALLED}" ]; then _cb_rec stop earlier "$(cat "$d/{SIGNALLED}")"\n'
            '  elif [ -f "$d/node.log.rc" ]; then _cb_rec stop exited "$(cat "$d/node.log.rc")"\n'
            '  elif [ -f "$d/pid" ]; then _cb_rec stop gone\n'
            '  elif [ -d "$d" ]; then _cb_rec stop not-started\n'
            "  else _cb_rec stop no-run; fi\n"
            "  exit 0\n"
            "fi\n"
            'n=$(printf "%s\\n" "$p" | wc -l)\n'
            # said before the signal: status and a foreground launch tell "stopped" from "failed"; not
            # for a run that ended with its code (what its ranks left behind is stopped, it ended)
            '[ -f "$d/node.log.rc" ] || { (set -C; date +%s > "$d/stopped.$$")'
            ' && mv -f "$d/stopped.$$" "$d/stopped"; } 2>/dev/null\n'
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
            '_cb_rec stop stopped "$n" "$k" "$(_cb_members | wc -l)"'
        )

    def status(self, run_dir: str, marker: str, node_log: str, nonce: str) -> str:
        """One record per value (its kind the value's name, one field): node clock, launcher alive,
        start/end times (file mtimes on the node's clock), exit code, log size, last-modified time
        and last line, one ``gpu`` record per GPU where nvidia-smi exists."""
        return (
            self.platform.record_functions(nonce)
            + "\n"
            + self.functions(run_dir, marker)
            + f"f={self.platform.path_word(node_log)}\n"
            '_cb_rec now "$(date +%s)"\n'
            # a run whose directory is gone (its script removed it, or a clean by hand) while its
            # processes live on is running: `stop --run` finds them by their marker all the same
            'if [ ! -d "$d" ]; then\n'
            '  if [ -n "$(_cb_members)" ]; then _cb_rec alive 1; _cb_rec state no-dir\n'
            "  else _cb_rec state no-run; fi\n"
            "  exit 0\n"
            "fi\n"
            'if [ -f "$d/pid" ]; then _cb_rec started "$(stat -c %Y "$d/pid")"; fi\n'
            # alive: the launcher, or any process of the run at all (its record may say otherwise:
            # a launcher killed while ranks that ignore TERM live on)
            'if _cb_leader || [ -n "$(_cb_members)" ]; then _cb_rec alive 1; else _cb_rec alive 0; fi\n'
            'if [ -f "$f.rc" ]; then _cb_rec rc "$(cat "$f.rc")"; _cb_rec ended "$(stat -c %Y "$f.rc")"; fi\n'
            f'if [ -f "$d/{STOPPED}" ]; then _cb_rec stopped "$(cat "$d/{STOPPED}")"\n'
            f'elif [ -f "$d/{SIGNALLED}" ]; then _cb_rec stopped "$(cat "$d/{SIGNALLED}")"; fi\n'
            'if [ -f "$f" ]; then\n'
            '  _cb_rec size "$(wc -c < "$f")"\n'
            # the time of the last output: how long a stopped (killed) run ran, at least
            '  _cb_rec modified "$(stat -c %Y "$f")"\n'
            # when a rank last printed: its own file's time (the log also gets the node's samples
            # every few seconds, so its time says nothing of the ranks: a hung rank shows here)
            '  _cb_s=$(stat -c %Y "$d"/ranks/*.out 2>/dev/null | sort -n | tail -n 1)\n'
            '  [ -n "$_cb_s" ] && _cb_rec spoke "$_cb_s"\n'
            # the last line a rank printed (torchrun's own exit-barrier noise after a good run is not
            # what a user asks about), else the log's last line
            # nor torch's harmless "[c10d] The hostname of the client socket cannot be retrieved" (a
            # reverse DNS miss per connection: docs/troubleshooting.md)
            # nor the rank capture's samples (records of GPU use, CPU load: docs/dashboard.md)
            # (NUL bytes out first: grep reads text with one as binary, and says only that)
            "  _cb_t=$(tail -c 65536 \"$f\" | tr -d '\\r\\000' | grep -v '^[[:space:]]*$'"
            " | grep -v 'hostname of the client socket cannot be retrieved'"
            " | grep -v '^" + records.MARK + "cb-[0-9a-f]\\{12\\} ')\n"
            # nor a metric record (CB_METRIC {...}: the dashboard's, every few steps of the example)
            "  _cb_r=$(printf '%s\\n' \"$_cb_t\" | grep '^\\[default[0-9]*\\]:' | grep -v ']:CB_METRIC {'"
            " | tail -n 1)\n"
            '  [ -n "$_cb_r" ] || _cb_r=$(printf \'%s\\n\' "$_cb_t" | tail -n 1)\n'
            '  _cb_rec last "$(printf \'%s\' "$_cb_r" | cut -c1-400)"\n'
            # an ended run: the fields of torchrun's own last root cause (untagged lines only), so
            # that status names the rank that failed and its exit code, as launch does
            f"  [ -f \"$f.rc\" ] && printf '%s\\n' \"$_cb_t\" | grep -v '^\\[default' | {CAUSE_AWK}"
            ' | while IFS= read -r _cb_l; do _cb_rec cause "$_cb_l"; done\n'
            "fi\n"
            "if command -v nvidia-smi >/dev/null 2>&1; then\n"
            "  nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total"
            " --format=csv,noheader,nounits 2>/dev/null"
            ' | while IFS= read -r _cb_g; do _cb_rec gpu "$_cb_g"; done\n'
            "fi"
        )

    def tail(
        self,
        run_dir: str,
        marker: str,
        node_log: str,
        offset: int,
        *,
        nonce: str,
        follow: bool,
        python: str | None,
        interval: float | None,
        lines: int | None = None,
        samples: str = "",
    ) -> str:
        if python is not None:
            return tail.posix_tail_python(
                self.platform,
                python,
                run_dir,
                node_log,
                offset,
                nonce=nonce,
                follow=follow,
                interval=interval or 0.02,
                lines=lines,
                samples=samples,
            )
        return tail.posix_tail(
            self.platform,
            self.functions(run_dir, marker),
            node_log,
            offset,
            nonce=nonce,
            follow=follow,
            interval=interval or 0.05,
            lines=lines,
            samples=samples,
        )

    def is_absolute(self, path: str) -> bool:
        return path.startswith(("/", "~"))

    def which_exist(self, paths: Sequence[str], nonce: str) -> str:
        lines = [self.platform.record_functions(nonce)]
        lines += [
            f"[ -e {self.platform.path_word(path)} ] && _cb_rec have {i}" for i, path in enumerate(paths)
        ]
        return "\n".join([*lines, "exit 0"])

    def list_files(
        self, candidates: Sequence[Sequence[str]], nonce: str, near: Sequence[Sequence[str]] = ()
    ) -> str:
        """For each entry: the first of its candidate paths that exists, as the record ``file I SIZE
        PATH``, ``dir I PATH LISTING`` (LISTING: ``SIZE NUL RELPATH NUL`` per file below it; names
        hold no NUL) or ``missing I``; a missing one with ``near[I]`` (directories) also ``near I
        NAMES``: the files below them (``RELPATH NUL`` each, 4 levels deep, the first 256 KiB), where
        a mistyped path's right name may be. A LISTING longer than ``LISTING_CAP`` is cut one byte
        after it (the controller then knows it was cut)."""
        parts = [self.platform.record_functions(nonce)]
        for index, paths in enumerate(candidates):
            words = " ".join(self.platform.path_word(p) for p in paths)
            bases = " ".join(self.platform.path_word(p) for p in (near[index] if index < len(near) else ()))
            listed = (
                f'  for b in {bases}; do (cd "$b" 2>/dev/null && find . -maxdepth 4 -type f -print0'
                f" 2>/dev/null); done | head -c 262144 | _cb_recin near {index}\n"
                if bases
                else ""
            )
            parts.append(
                f'found=; for c in {words}; do [ -e "$c" ] && {{ found=$c; break; }}; done\n'
                f'if [ -z "$found" ]; then _cb_rec missing {index}\n{listed}'
                'elif [ -d "$found" ]; then\n'
                '  (cd "$found" && find . -type f -exec sh -c '
                '\'for f; do printf "%s\\0%s\\0" "$(wc -c < "$f")" "$f"; done\' sh {} +)'
                f' | head -c {LISTING_CAP + 1} | _cb_recin dir {index} "$found"\n'
                f'else _cb_rec file {index} "$(wc -c < "$found")" "$found"; fi'
            )
        return "\n".join(parts)
