"""The README pasted in order works: every ```sh block and every Python program in it runs, top
to bottom, as a new user would paste them, in a fresh copy of the repository, and prints what
its comments say it prints; every server a block leaves running stops with the block's
commented stop line; and everything the blocks create is in .gitignore.

The commands are read from the README each run (tests/e2e/readme_session.py reads and runs
them), so a block added anywhere is covered. How a user's session is reproduced, and the rules
the README has to follow for it:

- The copy holds the repository's tracked files (``git ls-files``, committed into a git
  repository of its own, so that ``git status`` finds what the blocks created) and a ``.venv``
  symlink to this checkout's virtual environment, which ``make test`` set up: its install
  stamps are newer than every copied file, so no ``make`` target of the README installs
  anything (checked with ``make -n`` first). ``make spark``, ``make s3`` and ``make dist``
  run for real and find everything installed, which is how the test avoids the minutes of
  downloads a fresh machine spends there, yet still runs every command; ``make dist`` builds
  the wheel and the sdist (its isolated build environment comes from the package index).
- ``make run`` is the broker in the user's first terminal: it runs beside the other commands
  (they all run, in order, in one bash in the second terminal, sharing variables and jobs),
  is waited for until ``/healthz`` answers, and is stopped at the end with Ctrl-C's SIGINT.
  ``make test`` (the suite itself) is the one command not run.
- ``sh`` blocks are split into commands as bash parses them (a ``for`` loop, a here-document
  or a line ending in ``\\`` is one command). A line that is only a comment is not a command,
  except a stop line (``... stop it with: CMD``, ``stop them with:``), which runs after every
  block has: then nothing the blocks started may still be running, and a broker a stop line
  stopped must have exited 0 (its clean shutdown on SIGTERM).
- ``python`` blocks are programs, each run with ``.venv/bin/python`` from a file outside the
  copy; an indented block (inside a list item) goes on from the section's previous program.
  Blocks without a language (usage, layouts, file formats) and ``js`` (a browser's) are not
  run; a block in any other language fails the test until this test knows what to do with it.
- Every command must exit 0, except a ``curl --max-time`` that ends a follow (exit 28), and a
  command whose comment says Ctrl-C ends it: it gets SIGINT after FOLLOW_S seconds (exit 124
  from ``timeout``) and must still be running then.
- Ports: every port the README names (``127.0.0.1:N``, ``localhost:N``, ``-x.port=N``, and the
  numbers of a ``for port in ...`` loop) is replaced by a free port of its own wherever the
  number stands alone, in every command and program; ``make run`` gets ``PORT=`` the free port
  of the Makefile's default. So the README's servers that run side by side must use
  different ports, and the test collides with nothing running on the machine.
- The session runs in a process group of its own, with HOME in a temporary directory (the CLI
  keeps contexts there) and no MESSAGING_, PYSPARK_, SPARK_ or AWS_ variables. A background
  job that ends by itself before the stop lines must end with status 0 (or a signal a
  command sent it). What is left after the stop lines is killed by PID and fails the test;
  if the session fails or hangs (COMMAND_TIMEOUT_S per command), its group is killed.
- Where the README says what a command prints, EXPECTED checks it; no output has a Python
  traceback, nor does any ``*.log`` a block wrote.

It takes about 3 minutes on 2 cores, half of it the two Spark programs (a JVM each); the
clusters' start-up, ``make dist`` and the Durable Streams long-poll (10 s) take most of the rest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from examples.journal_failover import expected_state
from tests.e2e.readme_session import (
    COMMAND_TIMEOUT_S,
    SESSION_TIMEOUT_S,
    STOP_TIMEOUT_S,
    Command,
    Ports,
    Session,
    describe,
    prepared,
    readme_commands,
    readme_ports,
    records,
    session_processes,
    session_script,
    shell_commands,
)

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
#: How long ``make run`` may take to answer.
START_TIMEOUT_S = 60.0
#: weed makes a Unix socket per port here, whatever $TMPDIR says.
WEED_SOCKETS = Path("/tmp")


# -- what the README says commands print ----------------------------------------------------


def _json(output: str) -> list[object]:
    """The JSON values output lines start with (a job's notice may follow one)."""
    values = []
    for line in output.splitlines():
        try:
            values.append(json.JSONDecoder().raw_decode(line.strip())[0])
        except json.JSONDecodeError:
            continue
    return values


def _version() -> str:
    """The package's version, as --version, healthz and the wheel's name say it."""
    import messaging

    return messaging.__version__


def _lines(output: str) -> list[str]:
    """The output's lines that are not blank, stripped."""
    return [line.strip() for line in output.splitlines() if line.strip()]


def _topic_settings(output: str) -> object:
    """The ``max-topic-size`` setting of the topic the output describes."""
    values = [v for v in _json(output) if isinstance(v, dict) and "settings" in v]
    return values[0]["settings"].get("max-topic-size") if values else None


def _offloaded(output: str) -> bool:
    """Whether the topic the output describes has bytes in the object store."""
    values = [v for v in _json(output) if isinstance(v, dict) and "size" in v]
    return bool(values) and int(values[0].get("offloaded_size") or 0) > 0


def _status(code: int) -> Callable[[str], bool]:
    """The check that ``curl -i`` printed an answer with status ``code``."""
    return lambda out: re.search(rf"^HTTP/1\.1 {code} ", out, re.M) is not None


def _ready_nodes(output: str) -> int:
    """How many ``node N ready`` lines the output has."""
    return sum(1 for line in _lines(output) if re.fullmatch(r"node \d+ ready", line))


def _runs(output: str) -> list[object]:
    """The first indexes of the runs a ``/messaging/times`` answer lists."""
    values = [v for v in _json(output) if isinstance(v, dict) and "runs" in v]
    return [run[0] for run in values[0]["runs"]] if values else []


def _journal_state(output: str) -> bool:
    """Whether the output's last JSON object is the state of all 500 changes, each once."""
    values = [v for v in _json(output) if isinstance(v, dict)]
    return bool(values) and values[-1] == expected_state(500)


def _aggregates(output: str) -> bool:
    """5 keys in each of 5 minutes (the generator's events), each row once."""
    rows = [v for v in (_row(line) for line in _lines(output)) if v is not None]
    keys = {(r.get("minute"), r.get("key")) for r in rows}
    return len(rows) == len(keys) == 25 and all(str(k).startswith("sensor-") for _m, k in keys)


def _row(line: str) -> dict[str, object] | None:
    """The JSON object a ``messaging tail`` line prints, after its index."""
    start = line.find("{")
    try:
        value = json.loads(line[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


#: (a pattern the command matches, the check of its output, what the README says). Each must
#: match a command, so that a README change that drops one shows up here.
EXPECTED: list[tuple[str, Callable[[str], bool], str]] = [
    (r"^make help", lambda out: all(f"make {t}" in out for t in ("run", "spark", "s3", "dist")),
     "every target"),
    (r"-XPOST '.*/messaging/messages\?topicID=1' --data-binary 'hello'$",
     lambda out: "X-Broker-Index: 1" in out, "The first answers `X-Broker-Index: 1`"),
    (r"streaming=true.*\| xxd", lambda out: "hello" in out, "the second prints the stored frame"),
    (r"^curl localhost:\d+/messaging/topics/7 ",
     lambda out: _topic_settings(out) == {"value": 1073741824, "source": "default"},
     '"settings": {"max-topic-size": {"value": 1073741824, "source": "default"}, ...}'),
    (r"--aws-sigv4", lambda out: _lines(out)[-1:] == ["200"],
     "200: the bucket made"),
    (r"/messaging/topics/1 +# \"size\"", _offloaded, '"size": ..., "offloaded_size": ...'),
    (r"tail http://127.0.0.1:\d+ 1 --format json \| wc -l", lambda out: "40" in _lines(out),
     "40: the store, then the disk"),
    (r"-X PUT \$B/chat -H 'Content-Type: text/plain' +# 201", _status(201), "201 Created"),
    (r"-d 'hello ' +# 204", _status(204), "204"),
    (r"Producer-Seq: 0' +# 200$", _status(200), "200"),
    (r"Producer-Seq: 0' +# 204: a retry", _status(204), "204: a retry, stored once"),
    (r'"\$B/chat\?offset=-1" ', lambda out: "hello world" in out, "hello world"),
    (r"live=sse", lambda out: "event: data" in out and "event: control" in out,
     "event: data / event: control"),
    (r"Stream-Closed: true' +# closed", _status(204), "closed"),
    (r'"\$B/events"', lambda out: [{"n": 1}, {"n": 2}] in _json(out), '[{"n":1},{"n":2}]'),
    (r"tail \$U 4 --consumer reporter +# prints one and two",
     lambda out: "one" in out and "two" in out, "one and two"),
    (r"tail \$U 4 --consumer reporter +# prints only three",
     lambda out: "three" in out and "one" not in out and "two" not in out, "only three"),
    (r"times\?topicID=1&index=0'", lambda out: _runs(out)[:1] == [1], '{"runs": [[1, ...]]}'),
    (r"--since 10m --format json",
     lambda out: any(isinstance(v, dict) and v.get("index") == 1 and v.get("data") == "hello"
                     for v in _json(out)), '{"index": 1, ..., "data": "hello"}'),
    (r"tail -n 1 secondary.log", _journal_state, "the state of all 500 changes"),
    (r"messaging tail http://127.0.0.1:\d+ 2(\s+#.*)?$", _aggregates,
     "25 rows: each key's events and total in each minute"),
    (r"/readyz \\\n.*node\$port.log", lambda out: _ready_nodes(out) == 3, "node N ready, 3 times"),
    (r"/readyz \\\n.*g\$port.log", lambda out: _ready_nodes(out) == 4, "node N ready, 4 times"),
    (r"tail http://127.0.0.1:\d+ 1 +# hello", lambda out: "hello" in out, "hello"),
    (r"ping http://127.0.0.1:\d+ +# the three nodes",
     lambda out: len([line for line in _lines(out) if line.startswith("http://")]) == 3,
     "the three nodes"),
    (r"tail http://127.0.0.1:\d+ 42 .*hello", lambda out: "hello" in out, "hello"),
    (r"token list", lambda out: [line.split() for line in _lines(out)] == [
        ["NAME", "SCOPES"], ["admin", "admin"],
        ["reporter", "read=1,chat/*", "consume=reporter-*"]], "NAME SCOPES, admin, reporter"),
    (r"/messaging/topics +# 401", lambda out: _lines(out)[-1:] == ["401"], "401: no token"),
    (r"--data-binary 'secured' +# 200", lambda out: _lines(out)[-1:] == ["200"], "200"),
    (r"/healthz\s*(#|$)", lambda out: any(
        isinstance(v, dict) and v.get("status") == "ok" and v.get("version") == _version()
        and isinstance(v.get("time_ms"), int) for v in _json(out)),
     '{"status": "ok", "version": ..., "time_ms": ...}'),
    (r"/readyz(\s*#.*)?$", lambda out: {"ready": True} in _json(out), "200, ready"),
    (r"/metrics \| grep", lambda out: "messaging_build_info" in out, "messaging_build_info"),
    (r"messaging --version", lambda out: f"messaging {_version()}" in out.splitlines(),
     "the version"),
    (r"tail -n 1 ops-broker.log", lambda out: any(isinstance(v, dict) for v in _json(out)),
     "one JSON object"),
    (r"^make dist", lambda out: bool(re.search(rf"messaging-{_version()}-cp3\d+-\S+\.whl", out))
     and f"messaging-{_version()}.tar.gz" in out, "the wheel and the sdist"),
    (r"conn = client.conn\(1, data_url", lambda out: "b'data'" in out, "index, type, data"),
    (r"Consumer\(client, \[5\]", lambda out: "'words': 4" in out, "the state: 4 words"),
    (r"deposed primary", lambda out: "deposed primary:" in out, "deposed primary: ..."),
    (r"MessagingDataSource\)", lambda out: "Batch: 0" in out, "the rows (the console sink)"),
    (r"-t greetings -C -e", lambda out: "k1=hello @1" in out and "k2=world @2" in out,
     "k1=hello @1, k2=world @2"),
    (r"messaging topics http://127.0.0.1:\d+ +# greetings/0",
     lambda out: any(line.split()[:1] == ["greetings/0"] for line in _lines(out)),
     "greetings/0"),
    (r"orders read by group billing",
     lambda out: "30 orders read by group billing" in out, "30 orders read by group billing"),
]


# -- the user's copy of the repository ------------------------------------------------------


def git(*args: str, cwd: Path) -> str:
    """Run git in ``cwd`` (as a committer of its own); what it printed."""
    done = subprocess.run(["git", "-c", "user.name=readme", "-c", "user.email=readme@test",
                           *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout


def fresh_clone(target: Path, make_targets: set[str]) -> None:
    """The tracked files, committed, and this checkout's .venv, already installed."""
    venv = REPO / ".venv"
    stamps = list(venv.glob(".installed*"))
    assert stamps, f"{venv} has no install stamps: run make test (or make run) once first"
    older = min(stamp.stat().st_mtime for stamp in stamps) - 60
    for name in filter(None, git("ls-files", "-z", cwd=REPO).split("\0")):
        source = REPO / name
        if not source.is_file():  # deleted in the working tree
            continue
        copy = target / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, copy)
        os.utime(copy, (older, older))
    (target / ".venv").symlink_to(venv)
    git("init", "-q", cwd=target)
    git("add", "-A", cwd=target)
    git("commit", "-q", "-m", "the README's repository", cwd=target)
    for make_target in sorted(make_targets):
        plan = subprocess.run(["make", "-n", make_target], cwd=target, capture_output=True,
                              text=True, timeout=30)
        assert plan.returncode == 0 and "pip " not in plan.stdout, (
            f"make {make_target} would install into the shared .venv (run make test first):\n"
            + plan.stdout + plan.stderr)


def makefile_port() -> str:
    """The port ``make run`` binds by default."""
    match = re.search(r"^PORT \?= (\d+)$", (REPO / "Makefile").read_text(), re.M)
    assert match, "the Makefile names no default PORT"
    return match.group(1)


def session_env(home: Path) -> dict[str, str]:
    """The user's environment: a home of its own, none of the variables the README sets."""
    dropped = ("MESSAGING_", "PYSPARK_", "SPARK_", "AWS_", "VIRTUAL_ENV", "XDG_CONFIG_HOME")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pip"
    env.setdefault("PIP_CACHE_DIR", str(cache))  # the packages already downloaded
    env["HOME"] = str(home)
    return env


# -- running ----------------------------------------------------------------------------------


def wait_for_broker(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until ``make run``'s broker answers ``/healthz`` (bounded)."""
    deadline = time.monotonic() + START_TIMEOUT_S
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
    raise AssertionError(f"make run did not answer at {url} within {START_TIMEOUT_S:g} s:\n"
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


@pytest.mark.timeout(SESSION_TIMEOUT_S + STOP_TIMEOUT_S + 180)
def test_readme_runs_in_order(tmp_path: Path) -> None:
    """Every block, in order, as the module's docstring says."""
    commands = readme_commands(README.read_text())
    assert [c.kind for c in commands].count("make-run") == 1, "the Quick start has no make run"
    ports = Ports(readme_ports([c.text for c in commands]) | {makefile_port()})
    run_port = ports.map[makefile_port()]
    make_targets = {c.text.split()[1] for c in commands
                    if c.text.split()[:1] == ["make"] and len(c.text.split()) > 1
                    and c.kind != "make-test"}
    clone, files, home = tmp_path / "messaging", tmp_path / "session", tmp_path / "home"
    for directory in (clone, files, home):
        directory.mkdir()
    fresh_clone(clone, make_targets)
    shell = prepared(commands, ports, files)
    (files / "session.sh").write_text(session_script(shell, files))

    run_command = next(c for c in commands if c.kind == "make-run")
    log = tmp_path / "make-run.log"
    with log.open("wb") as out:  # the first terminal
        server = subprocess.Popen(
            [*run_command.text.split("#")[0].split(), f"PORT={run_port}"], cwd=clone,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env=session_env(home))
    session: Session | None = None
    try:
        wait_for_broker(f"http://127.0.0.1:{run_port}", server, log)
        session = Session(files / "session.sh", clone, session_env(home))
        overran = session.wait()
        (files / "timings").write_text("".join(  # where the time goes, slowest first
            f"{seconds:7.1f} s  {mark}\n" for mark, seconds in
            sorted(session.took.items(), key=lambda item: -item[1])))
        left = {pid: describe(pid) for pid in session_processes(session.process.pid)}
        session.kill()  # what is left of it, if anything
        assert overran is None, (
            (f"{shell[int(overran)].label()} did not end within {COMMAND_TIMEOUT_S:g} s"
             if overran.isdigit() else f"the README's {overran} did not end in time")
            + f"; it printed:\n{session.output(overran)}\n(ports {ports.map})")
        check_session(session, shell, files, ports)
        assert not left, f"still running after the stop lines (killed now): {left}"
    finally:
        if session is not None:
            session.kill()
        code = stop_group(server, signal.SIGINT, 30)
        for socket_file in WEED_SOCKETS.glob("seaweedfs-*.sock"):
            if socket_file.stem.rpartition("-")[2] in ports.map.values():
                socket_file.unlink(missing_ok=True)
    text = log.read_text(errors="replace")
    assert code is not None, f"make run did not stop on Ctrl-C:\n{text}"
    assert "Traceback" not in text, text
    check_files(clone, shell)


def check_session(session: Session, shell: list[Command], files: Path, ports: Ports) -> None:
    """Every command ended as it may, background jobs as they should, and printed what the
    README says."""
    codes = {int(number): int(code) for number, code in records(files / "status")}
    for number, command in enumerate(shell):
        printed = session.output(number)
        assert number in codes and codes[number] in command.accept, (
            f"{command.label()} "
            + (f"exited {codes[number]}" if number in codes else "did not run")
            + f"; it printed:\n{printed}\n(ports {ports.map})")
        assert "Traceback (most recent call last)" not in printed, (
            f"{command.label()} printed a traceback:\n{printed}")
    started = {pid: int(number) for pid, number in records(files / "jobs")}
    not_stopped = [pid for (pid,) in records(files / "not-stopped")]
    assert not not_stopped, "no stop line stopped " + ", ".join(
        f"the background job of {shell[started[pid]].label()}" for pid in not_stopped)
    stopped = {pid for (pid,) in records(files / "running")}
    for pid, how in records(files / "ended"):
        command = shell[started[pid]]
        if pid in stopped and "messaging broker" in command.text:
            assert how == "0", (f"a broker {command.label()} started ended with status {how} "
                                "on its stop line's SIGTERM, not 0")
        assert how == "waited" or int(how) == 0 or int(how) > 128, (
            f"the background job of {command.label()} ended by itself with status {how}; "
            f"the session printed:\n{session.output(started[pid])}")
    for pattern, check, claim in EXPECTED:
        matching = [n for n, c in enumerate(shell) if re.search(pattern, c.text, re.M)]
        assert matching, f"no README command matches {pattern!r} any more"
        for number in matching:
            assert check(session.output(number)), (
                f"{shell[number].label()} should print {claim}; it printed:\n"
                f"{session.output(number)}")


def check_files(clone: Path, shell: list[Command]) -> None:
    """No log a block wrote has a traceback; what ``make dist`` says it makes is there;
    everything the blocks made is ignored by git."""
    for command in shell:
        if command.text.startswith("make dist"):
            named = re.findall(r"dist/\S+", command.text.partition("#")[2])
            assert named and all((clone / name).is_file() for name in named), (
                f"{command.label()}: dist/ holds {sorted(os.listdir(clone / 'dist'))}")
    for log in clone.glob("*.log"):
        text = log.read_text(errors="replace")
        assert "Traceback (most recent call last)" not in text, f"{log.name}:\n{text}"
        assert "NoSuchBucket" not in text, f"{log.name}:\n{text}"
    untracked = git("status", "--porcelain", "--untracked-files=all", cwd=clone)
    assert untracked == "", f"the README's blocks made files .gitignore does not cover:\n" \
                            f"{untracked}"


# -- what the README promises besides its blocks --------------------------------------------


def test_make_help_lists_every_target() -> None:
    """``make`` alone prints the help, and it names every target the Makefile declares."""
    makefile = (REPO / "Makefile").read_text()
    declared = re.search(r"^\.PHONY:(.*?)(?<!\\)$", makefile, re.M | re.S)
    assert declared, "the Makefile declares no .PHONY targets"
    phony = set(declared.group(1).replace("\\\n", " ").split())
    helped = subprocess.run(["make", "--no-print-directory"], cwd=REPO, capture_output=True,
                            text=True, timeout=30)
    assert helped.returncode == 0, helped.stderr
    listed = {m.group(1) for m in re.finditer(r"^make ([\w-]+)", helped.stdout, re.M)}
    assert listed == phony, (f"targets without a '## make TARGET: ...' line: {phony - listed}; "
                             f"listed but not targets: {listed - phony}")


def test_a_missing_obstore_names_make_s3(tmp_path: Path) -> None:
    """The core install has no obstore: the error says what installs it, and never the bare
    ``pip install 'messaging[s3]'`` that another environment's pip takes for another package."""
    blocker = tmp_path / "obstore.py"
    blocker.write_text("raise ImportError('No module named obstore')\n")
    probe = ("from messaging.errors import ConfigError\n"
             "try:\n    import messaging.objects.s3\n"
             "except ConfigError as err:\n    print(err)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    said = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=60).stdout.strip()
    assert "make s3" in said and f"{sys.executable} -m pip install 'obstore" in said, said
    assert "messaging[s3]" not in said and "\n" not in said, said


# -- how the README is read ---------------------------------------------------------------------


def test_blocks_are_split_into_commands_as_bash_reads_them() -> None:
    block = textwrap.dedent("""\
        # a comment, not a command
        echo one   # what it prints
        cat > f.json <<'JSON'
        {"a": 1}
        JSON
        for port in 8091 8092; do
          echo $port \\
            again
        done
        # it keeps running; stop it with: kill "$(cat x.pid)"
        """)
    assert list(shell_commands(block)) == [
        ("echo one   # what it prints", False),
        ("cat > f.json <<'JSON'\n{\"a\": 1}\nJSON", False),
        ("for port in 8091 8092; do\n  echo $port \\\n    again\ndone", False),
        ('kill "$(cat x.pid)"', True),
    ]


def test_every_port_form_is_found_and_rewritten_where_it_stands_alone() -> None:
    sources = ["curl http://127.0.0.1:8091/x localhost:8092",
               "weed -s3.port=8333 -x.port.grpc=18333", "for port in 9086 9087; do echo; done",
               "head -c 20000 --snapshot-count 2000"]
    found = readme_ports(sources)
    assert found == {"8091", "8092", "8333", "18333", "9086", "9087"}
    ports = Ports(found)
    rewritten = ports.rewrite("kill $(cat node8091.pid) :8333 18333 2000 180913")
    assert rewritten == (f"kill $(cat node{ports.map['8091']}.pid) :{ports.map['8333']} "
                         f"{ports.map['18333']} 2000 180913")
