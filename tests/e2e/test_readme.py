"""The README pasted in order works: every shell snippet of its Quick start (everything before
"## HTTP API"), "## Time", "## Security" and "## Operations" sections runs, as a new user
would paste it, in a fresh copy of the repository, and every command exits 0.

How a user's session is reproduced, the rules the test follows (the commands themselves are
read from the README each run, so a snippet added to those sections is covered too):

- The copy holds the repository's tracked files (``git ls-files``) and a ``.venv`` symlink to
  this checkout's virtual environment, whose install stamps are newer than every copied file,
  so ``make run`` starts the broker without installing anything (checked with ``make -n``).
- ``make run`` is the broker in the user's first terminal: it runs beside the other commands
  (they all run, in order, in one bash in the second terminal, sharing variables and jobs),
  is waited for until ``/healthz`` answers, and is stopped at the end with Ctrl-C's SIGINT.
- ``make test`` (the suite itself) is the one command that is not run.
- Lines starting with ``#`` are output examples, not commands; a line ending in ``\\`` goes
  on on the next one.
- Ports: every ``:PORT`` from 8000 to 8099 in a command is replaced by a free port of its own
  (the same README port, the same free port), and ``make run`` gets ``PORT=`` the free port of
  the Makefile's default; so the README's ports must differ where its brokers run side by
  side, and the test collides with nothing running on the machine.
- A command's background job (``... &``) must not die by itself (a busy port, a signal it
  does not handle); what is still running at the end is stopped by PID (SIGTERM, waited for).
- Where the README says what a command prints, EXPECTED checks it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import free_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
#: The sections whose snippets are run, by heading; the Quick start is what precedes the first.
FIRST_SECTION = "## HTTP API"
SECTIONS = ("## Time", "## Security", "## Operations")
#: Port numbers the README's commands use for brokers (rewritten to free ports).
README_PORT = re.compile(r"(?<=:)(80\d\d)\b")
#: Seconds all the snippets may take together, and ``make run`` to answer.
SESSION_TIMEOUT = 240.0
START_TIMEOUT = 60.0


# -- reading the README ---------------------------------------------------------------------


def sections(text: str) -> Iterator[tuple[str, str]]:
    """(heading, body) of the Quick start and each section of SECTIONS (its ### too)."""
    quick_start, found, _rest = text.partition(f"\n{FIRST_SECTION}\n")
    assert found, f"README has no {FIRST_SECTION!r} section"
    yield "Quick start", quick_start
    for heading in SECTIONS:
        match = re.search(rf"^{re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
        assert match, f"README has no {heading!r} section"
        yield heading, match.group(1)


def snippet_commands(body: str) -> Iterator[str]:
    """The commands of a section's ```sh blocks, in order."""
    for block in re.findall(r"^```sh\n(.*?)^```", body, re.M | re.S):
        pending = ""
        for line in block.splitlines():
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            yield pending + line
            pending = ""
        assert not pending, f"a README snippet ends in a continuation: {pending!r}"


@dataclass(frozen=True)
class Command:
    """One command of a README snippet: as the README writes it, and as it is run."""

    section: str
    text: str
    run: str = ""


def readme_commands() -> list[Command]:
    text = README.read_text()
    return [Command(heading, command) for heading, body in sections(text)
            for command in snippet_commands(body)]


def words(command: str) -> list[str]:
    return command.split("#", 1)[0].split()


def is_make(command: str, target: str) -> bool:
    parts = words(command)
    return parts[:2] == ["make", target]


# -- what the README says some commands print -----------------------------------------------


def _json(output: str) -> list[object]:
    """The JSON values output lines start with: a background broker's log lines share the
    terminal, and bash may print a job's notice right after a value."""
    values = []
    for line in output.splitlines():
        try:
            values.append(json.JSONDecoder().raw_decode(line.strip())[0])
        except json.JSONDecodeError:
            continue
    return values


#: (a pattern the command matches, the check of its output, what the README says). Each must
#: match a command, so that a README change that drops one shows up here.
EXPECTED: list[tuple[str, Callable[[str], bool], str]] = [
    (r"-XPOST .*/messaging/messages\?topicID=1'", lambda out: "X-Broker-Index: 1" in out,
     "The first answers `X-Broker-Index: 1`"),
    (r"streaming=true.*\| xxd", lambda out: "hello" in out,
     "the second prints the stored frame"),
    (r"/healthz\s*(#|$)", lambda out: {"status": "ok", "version": _version()} in _json(out),
     '{"status": "ok", "version": ...}'),
    (r"/readyz", lambda out: {"ready": True} in _json(out), "200 when ... ready"),
    (r"/metrics \| grep", lambda out: "messaging_build_info" in out, "messaging_build_info"),
    (r"messaging --version", lambda out: f"messaging {_version()}" in out.splitlines(),
     "the version"),
]


def _version() -> str:
    import messaging

    return messaging.__version__


# -- the user's copy of the repository ------------------------------------------------------


def fresh_clone(target: Path) -> None:
    """The tracked files into ``target``, and this checkout's .venv, already installed."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                            check=True, timeout=30).stdout.decode().split("\0")
    venv = REPO / ".venv"
    stamps = list(venv.glob(".installed*"))
    assert stamps, f"{venv} has no install stamps: run make test (or make run) once first"
    older = min(stamp.stat().st_mtime for stamp in stamps) - 60
    for name in filter(None, listed):
        source = REPO / name
        if not source.is_file():  # deleted in the working tree
            continue
        copy = target / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, copy)
        os.utime(copy, (older, older))
    (target / ".venv").symlink_to(venv)
    plan = subprocess.run(["make", "-n", "run"], cwd=target, capture_output=True, text=True,
                          timeout=30)
    assert plan.returncode == 0 and "pip" not in plan.stdout, (
        "make run would install into the shared .venv:\n" + plan.stdout + plan.stderr)


def makefile_port() -> int:
    match = re.search(r"^PORT \?= (\d+)$", (REPO / "Makefile").read_text(), re.M)
    assert match, "the Makefile names no default PORT"
    return int(match.group(1))


class Ports:
    """README port → free port, one each, the same every time it is asked."""

    def __init__(self) -> None:
        self.map: dict[str, str] = {}

    def __call__(self, port: str) -> str:
        if port not in self.map:
            self.map[port] = str(free_port())
        return self.map[port]

    def rewrite(self, command: str) -> str:
        return README_PORT.sub(lambda m: self(m.group(1)), command)


# -- running ----------------------------------------------------------------------------------


MARK = "@@@ readme command "


def session_script(commands: list[str], status: Path, jobs: Path) -> str:
    """One bash session running ``commands`` in order: each one's output follows a marker
    line, its exit status goes to ``status`` (``N CODE``); it stops at the first failure, as
    a user would. Each background job a command starts is noted; at the end, one still
    running is stopped by its PID with SIGTERM and waited for (``N stopped CODE`` in
    ``jobs``), and one that ended by itself reports how (``N ended CODE``)."""
    lines = ["exec 2>&1", "__bg=()",
             "__end() { for __job in \"${__bg[@]}\"; do set -- $__job;"
             f" if kill -0 $1 2>/dev/null; then kill $1; wait $1; echo $2 stopped $? >> {jobs};"
             f" else wait $1; echo $2 ended $? >> {jobs}; fi; done; }}",
             "trap __end EXIT"]
    for number, command in enumerate(commands):
        lines += [f"printf '\\n{MARK}{number}\\n'", command,
                  f"__rc=$?; echo {number} $__rc >> {status}",
                  f'[ -z "$!" ] || [ "$!" = "$__seen" ] || {{ __seen=$!; __bg+=("$! {number}"); }}',
                  "[ $__rc = 0 ] || exit $__rc"]
    return "\n".join(lines) + "\n"


def wait_for_broker(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        assert process.poll() is None, f"make run exited {process.returncode}:\n" + (
            log.read_text(errors="replace"))
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"make run did not answer at {url} within {START_TIMEOUT:g} s:\n"
                         + log.read_text(errors="replace"))


def stop_group(process: subprocess.Popen[bytes], sig: int, timeout: float) -> int | None:
    """Send ``sig`` to the process group this test started ``process`` in; its exit code."""
    if process.poll() is None:
        os.killpg(process.pid, sig)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        return None


def outputs(stdout: str) -> dict[int, str]:
    """Each command's output, by number, from the session's marked stdout."""
    found: dict[int, str] = {}
    parts = re.split(rf"^{re.escape(MARK)}(\d+)\n", stdout, flags=re.M)
    for mark, text in zip(parts[1::2], parts[2::2], strict=True):
        found[int(mark)] = text
    return found


def test_readme_snippets_run_in_order(tmp_path: Path) -> None:
    commands = readme_commands()
    assert any(is_make(c.text, "run") for c in commands), "the Quick start has no make run"
    clone = tmp_path / "messaging"
    fresh_clone(clone)
    ports = Ports()
    run_port = ports(str(makefile_port()))

    shell: list[Command] = []
    servers: list[tuple[Command, subprocess.Popen[bytes], Path]] = []
    session: subprocess.Popen[bytes] | None = None
    try:
        for command in commands:
            if is_make(command.text, "test"):
                continue  # the test suite itself: the one command not run here
            if is_make(command.text, "run"):
                # The first terminal: a broker in the foreground until Ctrl-C.
                log = tmp_path / f"make-run-{len(servers)}.log"
                with log.open("wb") as out:
                    server = subprocess.Popen(
                        [*words(ports.rewrite(command.text)), f"PORT={run_port}"], cwd=clone,
                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
                servers.append((command, server, log))
                wait_for_broker(f"http://127.0.0.1:{run_port}", server, log)
                continue
            shell.append(Command(command.section, command.text, ports.rewrite(command.text)))

        status, jobs = tmp_path / "status", tmp_path / "jobs"
        script = tmp_path / "session.sh"
        script.write_text(session_script([c.run for c in shell], status, jobs))
        env = {k: v for k, v in os.environ.items() if not k.startswith("MESSAGING_")}
        session = subprocess.Popen(["bash", str(script)], cwd=clone, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            stdout, _ = session.communicate(timeout=SESSION_TIMEOUT)
        except subprocess.TimeoutExpired:
            stop_group(session, signal.SIGKILL, 10)
            stdout, _ = session.communicate(timeout=10)
        printed = outputs(stdout.decode(errors="replace"))
        codes: dict[int, int] = {}
        for line in status.read_text().splitlines() if status.exists() else []:
            mark, code = line.split()
            codes[int(mark)] = int(code)
        for number, command in enumerate(shell):
            assert codes.get(number) == 0, (
                f"README {command.section}: `{command.text}` "
                + (f"exited {codes[number]}" if number in codes
                   else f"did not finish within {SESSION_TIMEOUT:g} s of the session")
                + f"; it printed:\n{printed.get(number, '')}\n(ports {ports.map})")
        # A broker started in the background must not have died (a busy port, a signal).
        for line in jobs.read_text().splitlines() if jobs.exists() else []:
            mark, how, code = line.split()
            command = shell[int(mark)]
            assert how == "stopped" or code == "0", (
                f"README {command.section}: the background job of `{command.text}` ended by "
                f"itself with status {code}; the session printed:\n"
                + "".join(printed[n] for n in sorted(printed) if n >= int(mark)))

        for pattern, check, claim in EXPECTED:
            matching = [n for n, c in enumerate(shell) if re.search(pattern, c.text)]
            assert matching, f"no README command matches {pattern!r} any more"
            for number in matching:
                assert check(printed[number]), (
                    f"README: `{shell[number].text}` should print {claim}; it printed:\n"
                    f"{printed[number]}")
    finally:
        if session is not None and session.poll() is None:
            stop_group(session, signal.SIGKILL, 10)
        stopped = [stop_group(server, signal.SIGINT, 30) for _c, server, _log in servers]
    for (_command, _server, log), exit_code in zip(servers, stopped, strict=True):
        text = log.read_text(errors="replace")
        assert exit_code is not None, f"make run did not stop on Ctrl-C:\n{text}"
        assert "Traceback" not in text, text
