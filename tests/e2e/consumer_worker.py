"""A transactional consumer process for tests/e2e/test_consumer_crash.py: it consumes topics
1 and 2 into a store and publishes derived messages to topic 3 (the handlers of
tests/client/test_consumer.py), and kills itself with SIGKILL at a chosen step of a chosen
transaction ("handler": inside the handler, at its n-th message; "none": never).

    python -m tests.e2e.consumer_worker URL json|sqlite DIR '{"1": 40, "2": 41}' STEP N
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from messaging.client.client import Client
from messaging.client.consumer import Consumer
from messaging.frames import Message
from tests.client.test_consumer import SOURCES, json_handler, make_store, sqlite_handler


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def main(url: str, kind: str, directory: Path, until: dict[int, int], step: str,
               at: int) -> None:
    base = json_handler if kind == "json" else sqlite_handler
    seen = [0]

    def handler(txn: Any, message: Message) -> None:
        seen[0] += 1
        if step == "handler" and seen[0] == at:
            die()
        base(txn, message)

    def hook(where: str, number: int) -> None:
        if where == step and number == at:
            die()

    async with Client(url) as client:
        consumer = Consumer(client, SOURCES, make_store(kind, directory), handler,
                            name=f"worker-{kind}", max_messages=5, hook=hook)
        await consumer.run(until=until)
    print("done", flush=True)


if __name__ == "__main__":
    url, kind, directory, until, step, at = sys.argv[1:7]
    asyncio.run(main(url, kind, Path(directory),
                     {int(t): int(i) for t, i in json.loads(until).items()}, step, int(at)))
