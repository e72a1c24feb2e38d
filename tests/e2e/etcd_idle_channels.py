"""The cluster log's etcd client with a channel to every endpoint, idle but one: run as
``python -m tests.e2e.etcd_idle_channels ENDPOINTS SECONDS``.

It reads through every endpoint (each channel connects), keeps a watch open on the first,
waits SECONDS with nothing else to do, then reads through every endpoint again and prints
``ok``. Whatever grpc's core says about the connections meanwhile (a GOAWAY when etcd finds
the keepalive pings too many) comes out on standard error.
"""

from __future__ import annotations

import asyncio
import sys

from messaging.config import EtcdSettings
from messaging.log.etcd.client import EtcdClient


async def main(endpoints: list[str], seconds: float) -> None:
    client = EtcdClient(EtcdSettings(endpoints=tuple(endpoints), cluster="idle-channels"))
    try:
        for i in range(len(endpoints)):
            await client.get(b"/messaging/idle-channels/log", endpoint=i)
        watch = await client.watch(b"/messaging/idle-channels/log", 1, 0)
        try:
            await asyncio.sleep(seconds)
        finally:
            watch.cancel()
        for i in range(len(endpoints)):
            await client.get(b"/messaging/idle-channels/log", endpoint=i)
    finally:
        await client.close()
    print("ok", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1].split(","), float(sys.argv[2])))
