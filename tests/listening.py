"""Whether a commit reached a topic's listeners (the fan-out) before its publisher was
answered: the order a log hands a written group to the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol


class Listenable(Protocol):
    """What a topic offers its fan-out."""

    def listen(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the running loop after every commit."""


async def followers_heard_first(topic: Listenable,
                                publish: Callable[[], Awaitable[object]]) -> bool:
    """Run ``publish()`` (a publisher awaiting its answer) once and say whether the topic's
    listeners ran before the publisher resumed (both within 10 s, or the test fails)."""
    answered: list[int] = []
    heard: list[int] = []
    topic.listen(lambda: heard.append(len(answered)))

    async def publisher() -> None:
        await publish()
        answered.append(1)

    await asyncio.wait_for(publisher(), 10)
    for _ in range(10):  # the listeners run in a loop callback of their own
        if heard:
            break
        await asyncio.sleep(0)
    assert heard and answered == [1], f"listeners ran {len(heard)} times"
    return heard[0] == 0
