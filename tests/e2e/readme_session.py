"""How tests/e2e/test_readme.py reads the README and runs it: its blocks split into commands as
bash parses them, the port numbers it names mapped onto free ports, and the one bash session
(the user's second terminal) that runs every command in order, notes the background jobs each
leaves, runs the stop lines last and says how every job ended. The rules the README follows
for this are in test_readme.py's docstring."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

#: Block languages that are not run, and why.
NOT_RUN = {"": "usage, layouts and file formats", "js": "runs in a browser"}
RUN = ("sh", "python")
#: How long one command may take, and all of them together.
COMMAND_TIMEOUT_S = 240.0
SESSION_TIMEOUT_S = 1200.0
#: How long a command that runs until Ctrl-C runs, and the stop lines may take.
FOLLOW_S = 3.0
STOP_TIMEOUT_S = 60.0
#: Where a comment line names the command that stops what a block left running.
STOP_LINE = re.compile(r"\bstop (?:it|them|the \w+) with: (.+)$")
#: A port the README names: host:port, a -flag.port=N option, the numbers of ``for port in``.
PORT_FORMS = (re.compile(r"(?:127\.0\.0\.1|localhost):(\d{4,5})\b"),
              re.compile(r"\bport(?:\.\w+)?=(\d{4,5})\b"),
              re.compile(r"\bfor \w*port\w* in ((?:\d{4,5}\s*)+);"))


# -- reading the README ---------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """A fenced block of the README."""

    section: str
    language: str
    text: str
    indented: bool


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block, in order, with the heading it is under."""
    blocks = []
    heading = "Quick start"
    fence = re.compile(r"^(?P<indent> *)```(?P<lang>\w*)\n(?P<body>.*?)^(?P=indent)```$",
                       re.M | re.S)
    position = 0
    for match in fence.finditer(text):
        headings = re.findall(r"^#{2,3} (.+)$", text[position:match.start()], re.M)
        heading = headings[-1] if headings else heading
        position = match.end()
        indent = len(match.group("indent"))
        body = textwrap.dedent(match.group("body")) if indent else match.group("body")
        blocks.append(Block(heading, match.group("lang"), body, bool(indent)))
    return blocks


def shell_commands(block: str) -> Iterator[tuple[str, bool]]:
    """(command, is a stop line) for each command of a ``sh`` block, as bash parses them."""
    pending: list[str] = []
    heredoc: str | None = None
    for line in block.splitlines():
        if heredoc is not None:
            pending.append(line)
            if line.strip() == heredoc:
                heredoc = None
                yield "\n".join(pending), False
                pending = []
            continue
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            stop = STOP_LINE.search(line)
            if stop:
                yield stop.group(1), True
            continue
        pending.append(line)
        opened = re.search(r"<<-?\s*(['\"]?)(\w+)\1", line)
        if opened:
            heredoc = opened.group(2)
            continue
        if line.endswith("\\") or not complete("\n".join(pending)):
            continue
        yield "\n".join(pending), False
        pending = []
    assert not pending and heredoc is None, f"a README block ends inside a command: {pending}"


def complete(command: str) -> bool:
    """Whether bash reads ``command`` as whole (not a loop or quote left open)."""
    check = subprocess.run(["bash", "-n"], input=command, capture_output=True, text=True,
                           timeout=30)
    return check.returncode == 0


@dataclass
class Command:
    """One thing the session runs: a shell command, a Python program or a stop line."""

    section: str
    text: str  # as the README writes it (a program: its source)
    kind: str = "sh"  # sh | python | stop | make-run | make-test
    run: str = ""  # as the session runs it
    accept: set[int] = field(default_factory=lambda: {0})

    def label(self) -> str:
        first = self.text.strip().splitlines()[0]
        return f"README {self.section}: " + (f"the Python program `{first} ...`"
                                              if self.kind == "python" else f"`{self.text}`")


def readme_commands(text: str) -> list[Command]:
    """Everything the README asks to run, in order (stop lines last, in README order)."""
    commands: list[Command] = []
    stops: list[Command] = []
    blocks = readme_blocks(text)
    unknown = {b.language for b in blocks} - set(RUN) - set(NOT_RUN)
    assert not unknown, f"README blocks in {unknown}: run them here, or say why not in NOT_RUN"
    for block in blocks:
        if block.language == "sh":
            for command, is_stop in shell_commands(block.text):
                (stops if is_stop else commands).append(
                    Command(block.section, command, "stop" if is_stop else kind_of(command)))
        elif block.language == "python" and block.indented:
            previous = [c for c in commands if c.kind == "python" and c.section == block.section]
            assert previous, f"README {block.section}: an indented Python block goes on from " \
                             "no program of its section"
            previous[-1].text += "\n" + block.text
        elif block.language == "python":
            commands.append(Command(block.section, block.text, "python"))
    return commands + stops


def kind_of(command: str) -> str:
    parts = command.split("#", 1)[0].split()
    if parts[:2] == ["make", "run"]:
        return "make-run"
    if parts[:2] == ["make", "test"]:
        return "make-test"
    return "sh"


# -- ports ------------------------------------------------------------------------------------


def readme_ports(sources: list[str]) -> set[str]:
    """Every port number the README names."""
    found: set[str] = set()
    for source in sources:
        for form in PORT_FORMS:
            for match in form.finditer(source):
                found.update(match.group(1).split())
    return found


def free_ports(count: int) -> list[int]:
    """``count`` different TCP ports on 127.0.0.1 that nothing listens on right now (bound
    all at once: one at a time, the kernel may hand out the same port twice)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


class Ports:
    """README port → free port, a different one each, the same every time it is asked."""

    def __init__(self, names: set[str]) -> None:
        self.map = dict(zip(sorted(names), map(str, free_ports(len(names))), strict=True))
        # Wherever the number stands without other digits around it: node8091.pid too.
        self._number = re.compile(r"(?<!\d)(" + "|".join(map(re.escape, self.map))
                                  + r")(?!\d)") if self.map else None

    def rewrite(self, text: str) -> str:
        if self._number is None:
            return text
        return self._number.sub(lambda m: self.map[m.group(1)], text)


# -- the session ---------------------------------------------------------------------------


MARK = "@@@ readme command "


def prepared(commands: list[Command], ports: Ports, programs: Path) -> list[Command]:
    """The commands the session runs, each with what it runs and the exit codes it may end
    with."""
    session: list[Command] = []
    for command in commands:
        if command.kind in ("make-run", "make-test"):
            continue
        if command.kind == "python":
            program = programs / f"readme-{len(session)}.py"
            program.write_text(ports.rewrite(command.text))
            # A syntax error names the README's section, not the session's file.
            compile(command.text, f"<README {command.section}>", "exec")
            command.run = f".venv/bin/python {program}"
        else:
            command.run = ports.rewrite(command.text)
        code = command.text.split("#", 1)[0]
        if "Ctrl-C" in command.text.partition("#")[2] and command.kind == "sh":
            assert not re.search(r"[|;&]", code), (
                f"{command.label()}: Ctrl-C can only be pressed on a simple command here")
            command.run = f"timeout -s INT {FOLLOW_S:g} {command.run}"
            command.accept = {124}  # still running when Ctrl-C came
        elif command.kind == "sh" and code.lstrip().startswith("curl") and "--max-time" in code:
            command.accept = {0, 28}  # curl's --max-time ended a follow
        session.append(command)
    return session


def session_script(commands: list[Command], files: Path) -> str:
    """One bash session running ``commands`` in order: each one's output follows a marker
    line, its exit status goes to ``status``; it stops at the first that ends otherwise than
    it may, as a user would. The background jobs each command leaves are noted (``jobs``:
    PID, command). After the last command the stop lines run; then each job still running
    before them (``running``) gets STOP_TIMEOUT_S to end, is killed by PID if it does not
    (``not-stopped``), and every job's exit status is collected (``ended``: PID, status, or
    ``waited`` when a command of the README waited for it already)."""
    status, jobs, ended = files / "status", files / "jobs", files / "ended"
    running, not_stopped, waited = files / "running", files / "not-stopped", files / "wait-said"
    lines = ["exec 2>&1", "__known=' '",
             "__track() { local p; for p in $(jobs -p); do case \"$__known\" in"
             f" *\" $p \"*) ;; *) __known+=\"$p \"; echo \"$p $1\" >> {jobs};; esac; done; }}"]
    note_running = ["__running=''", "for __p in $__known; do kill -0 $__p 2>/dev/null"
                    f" && {{ __running+=\" $__p\"; echo $__p >> {running}; }}; done"]
    first_stop = next((n for n, c in enumerate(commands) if c.kind == "stop"), len(commands))
    for number, command in enumerate(commands):
        if number == first_stop:
            lines += note_running
        accept = "|".join(map(str, sorted(command.accept)))
        lines += [f"printf '\\n{MARK}{number}\\n'", command.run,
                  f"__rc=$?; echo {number} $__rc >> {status}", f"__track {number}"]
        if command.kind != "stop":  # every stop line runs, whatever the others did
            lines.append(f"case $__rc in {accept}) ;; *) exit $__rc;; esac")
    if first_stop == len(commands):
        lines += note_running
    lines += [f"printf '\\n{MARK}end\\n'",
              f"__deadline=$((SECONDS + {int(STOP_TIMEOUT_S)}))",
              "while :; do __left=''; for __p in $__running; do"
              " kill -0 $__p 2>/dev/null && __left+=\" $__p\"; done",
              "  [ -z \"$__left\" ] || [ $SECONDS -ge $__deadline ] && break; sleep 0.2; done",
              f"for __p in $__left; do echo $__p >> {not_stopped}; kill -9 $__p; done",
              "for __p in $__known; do",
              f"  wait $__p 2> {waited}; __rc=$?",
              f"  grep -q 'not a child' {waited} && __rc=waited; echo \"$__p $__rc\" >> {ended}",
              "done", "exit 0"]
    return "\n".join(lines) + "\n"


class Session:
    """The second terminal: the session's bash, its output by command, and a watch on how
    long the current command takes."""

    def __init__(self, script: Path, cwd: Path, env: dict[str, str]) -> None:
        #: Everything the session printed, as it comes (to follow a run: tail -f it).
        self.transcript = script.with_suffix(".out")
        self.process = subprocess.Popen(["bash", str(script)], cwd=cwd, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        self.printed: dict[str, list[str]] = {}
        #: Seconds each command took, by its mark.
        self.took: dict[str, float] = {}
        self.current = ("start", time.monotonic())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout, self.transcript.open("w") as transcript:
            for raw in self.process.stdout:
                line = raw.decode(errors="replace")
                transcript.write(line)
                transcript.flush()
                if line.startswith(MARK):
                    mark, since = self.current
                    self.took[mark] = time.monotonic() - since
                    self.current = (line[len(MARK):].strip(), time.monotonic())
                else:
                    self.printed.setdefault(self.current[0], []).append(line)

    def wait(self) -> str | None:
        """Wait for the session to end; the number of the command that overran its time,
        or "session" when all of them together did."""
        started = time.monotonic()
        while self.process.poll() is None:
            mark, since = self.current
            if time.monotonic() - since > (STOP_TIMEOUT_S + 30 if mark == "end"
                                            else COMMAND_TIMEOUT_S):
                return mark
            if time.monotonic() - started > SESSION_TIMEOUT_S:
                return "session"
            time.sleep(0.5)
        self._reader.join(30)
        mark, since = self.current
        self.took[mark] = time.monotonic() - since
        return None

    def output(self, number: int | str) -> str:
        """What the command of that mark printed."""
        return "".join(self.printed.get(str(number), []))

    def kill(self) -> None:
        """Kill the session's process group (only what the session started)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(30)
        for pid in session_processes(self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._reader.join(30)


def session_processes(session_id: int) -> list[int]:
    """The processes still in the session the test started (by their session id)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[3]) == session_id and fields[0] != "Z":  # fields: state, ppid, pgrp, sid
            found.append(int(entry.name))
    return found


def describe(pid: int) -> str:
    """A process's command line, to say what was left running."""
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "(gone)"


def records(path: Path) -> list[list[str]]:
    """The lines of one of the session's notes (``status``, ``jobs``, ...), split."""
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []
