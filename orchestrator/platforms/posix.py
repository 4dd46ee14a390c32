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

    def stop_on_hangup(self, script: str) -> str:
        """``script`` run as its own process group, which is stopped when our stdin reaches EOF.

        A remote command outlives its SSH channel (no pty, no SIGHUP), so a timeout or a Ctrl-C on
        the controller would leave it running. The transport keeps the channel's stdin open and
        closes it to cancel (or closes the channel when the command is done): a watcher blocked on
        that stdin then signals the whole group: TERM, and KILL 5 s later for what ignored TERM.
        Processes the command left behind in its group go the same way; whatever must outlive a
        command has to leave the group itself (``setsid``, as detached launches do).
        ``setsid`` makes the group (dash refuses ``set -m`` without a terminal); the job's stdin
        is /dev/null, so it cannot eat the watcher's EOF.
        """
        # Background jobs of a non-interactive sh get /dev/null as stdin (POSIX): the channel's
        # stdin is kept on fd 3 for the watcher.
        job = f"/bin/sh -c {self.quote(script)} </dev/null 3<&- &"
        return (
            "exec 3<&0\n"
            "if command -v setsid >/dev/null 2>&1; then\n"
            f"  setsid {job}\n"
            "  target=-$!\n"  # the job's process group
            "else\n"
            f"  {job}\n"
            "  target=$!\n"  # no setsid (rare): the job's first process only
            "fi\n"
            # A TERM that finds nothing left ends the watcher at once.
            '{ cat <&3 >/dev/null; kill -TERM "$target" || exit 0; sleep 5; kill -KILL "$target"; }'
            " >/dev/null 2>&1 &\n"
            "exec 3<&-\n"
            'wait "${target#-}"'
        )

    def run_script(self, path: str) -> str:
        """Run the script file at ``path`` (on the node) with /bin/sh."""
        return f"/bin/sh {self.path_word(path)}"

    def mkdir(self, path: str) -> str:
        return f"mkdir -p -- {self.path_word(path)}"

    def logged(self, command: str, log: str) -> str:
        """``command`` with its output (stdout and stderr together) also appended to ``log`` on the
        node, keeping the command's exit code (POSIX sh has no pipefail)."""
        rc = self.path_word(log + ".rc")
        return f'{{ {command} 2>&1; echo $? > {rc}; }} | tee -a {self.path_word(log)}\nexit "$(cat {rc})"'

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
