"""How little ``messaging`` loads to start (issue 42, item 9): each command's modules are
imported when it runs, so ``--version`` loads no HTTP library and ``publish URL TOPIC DATA``
sends its one request without asyncio or aiohttp (messaging.cli.quick), handing over to the
async client, with the same producer, only when the first broker does not settle it.

What a command imported is read from ``python -X importtime`` in the subprocess itself (never
from a timing: ``make bench-cli`` measures the time).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import messaging
from messaging.cli.main import COMMANDS
from messaging.client.client import Client
from tests.conftest import BrokerProcess
from tests.proxy import FaultProxy

#: What a command that needs no event loop, no HTTP client and no server must not import.
HEAVY = ("aiohttp", "asyncio", "messaging.client", "messaging.http", "messaging.config",
         "messaging.frames")


def imported(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``python -X importtime -m messaging ARGS``: its result (the import lines taken
    out of its standard error) and the modules it imported."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "messaging", *args],
                            capture_output=True, text=True, timeout=60)
    modules: set[str] = set()
    rest: list[str] = []
    for line in result.stderr.splitlines(keepends=True):
        if line.startswith("import time:"):
            modules.add(line.rsplit("|", 1)[1].strip())
        else:
            rest.append(line)
    result.stderr = "".join(rest)
    return result, modules


def heavy(modules: set[str]) -> set[str]:
    """The modules of :data:`HEAVY` (or inside them) among ``modules``."""
    return {m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)}


def test_version_and_help_load_no_command() -> None:
    result, modules = imported("--version")
    assert (result.returncode, result.stdout, result.stderr) == (
        0, f"messaging {messaging.__version__}\n", "")
    assert heavy(modules) == set()
    assert not {m for m in modules if m.startswith("messaging.cli.")} - {
        "messaging.cli.main", "messaging.cli.parsing"}
    result, modules = imported("--help")
    assert result.returncode == 0 and heavy(modules) == set()
    for name, (help_text, _module, _function) in COMMANDS.items():
        assert f"    {name}" in result.stdout and help_text.split()[0] in result.stdout


def test_every_command_builds_its_own_help() -> None:
    """Each command's parser is added only when it runs: each still has its full help."""
    for name in COMMANDS:
        result = subprocess.run([sys.executable, "-m", "messaging", name, "--help"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and result.stderr == "", (name, result)
        assert result.stdout.startswith(f"usage: messaging {name} "), (name, result.stdout)


def test_publish_of_one_message_loads_no_event_loop(broker_process) -> None:
    broker: BrokerProcess = broker_process().start()
    result, modules = imported("publish", broker.url, "4", "quick")
    assert (result.returncode, result.stdout, result.stderr) == (0, "1\n", "")
    assert heavy(modules) == set(), "publish of DATA loaded " + ", ".join(sorted(heavy(modules)))
    # Standard input goes through the async client, as before.
    lines = subprocess.run([sys.executable, "-m", "messaging", "publish", broker.url, "4"],
                           input="a\nb\n", capture_output=True, text=True, timeout=60)
    assert lines.returncode == 0 and lines.stdout.startswith(
        "published 2 messages to topic 4 in 1 request, indexes 2..3 ("), lines


async def test_a_lost_answer_is_sent_again_by_the_client_and_stored_once(
        broker_process) -> None:
    """The first broker takes the one request but its answer never comes (the proxy closes
    the connection as it starts): the async client sends it again as the same producer, and
    the broker answers with the index it stored it at the first time."""
    broker: BrokerProcess = broker_process()
    await asyncio.to_thread(broker.start)
    port = int(broker.url.rsplit(":", 1)[1])
    proxy = await FaultProxy(port).start()
    proxy.drop_connections = {1}
    try:
        result = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "messaging", "publish", proxy.url, "6",
                             "once"], capture_output=True, text=True, timeout=60)
    finally:
        await proxy.stop()
    assert proxy.connections >= 2  # the quick attempt, then the client's
    async with Client(broker.url) as client:
        stored = await client.read(6)
    assert [m.data for m in stored] == [b"once"]
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{stored[0].index}\n", "")
