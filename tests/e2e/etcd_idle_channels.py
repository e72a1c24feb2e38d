"""The cluster log's etcd client with a channel to every endpoint, idle but one: run as
``python -m tests.e2e.etcd_idle_channels ENDPOINTS SECONDS``.

It reads through every endpoint (each channel connects), keeps a watch open on the first,
waits SECONDS with nothing else to do, then reads through every endpoint again and prints
``ok``. Whatever grpc's core says about the connections meanwhile (a GOAWAY when etcd finds
the keepalive pings too many) comes out on standard error.

Each read is retried until READ_WITHIN seconds have passed: on a loaded machine a channel's
first connect can take longer than one call's deadline (``UNAVAILABLE ... connection attempt
timed out`` before the SETTINGS frame), which says nothing about idle channels.
"""

from __future__ import annotations

import asyncio
import functools
import sys

import grpc

from messaging.config import EtcdSettings
from messaging.log.etcd.client import EtcdClient
from tests.retry import retry_until

KEY = b"/messaging/idle-channels/log"
#: How long each endpoint's read may keep failing (connecting) before the helper gives up.
READ_WITHIN = 30.0
#: One read's own deadline.
READ_TIMEOUT = 5.0


def _not_there_yet(err: BaseException) -> bool:
    return isinstance(err, grpc.aio.AioRpcError) and err.code() in (
        grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def read_through_each(client: EtcdClient, endpoints: list[str]) -> None:
    """One read through each endpoint's channel, each retried until READ_WITHIN."""
    for i, endpoint in enumerate(endpoints):
        await retry_until(functools.partial(client.get, KEY, endpoint=i, timeout=READ_TIMEOUT),
                          within=READ_WITHIN, what=f"a read through {endpoint}",
                          retry_on=_not_there_yet)


async def main(endpoints: list[str], seconds: float) -> None:
    client = EtcdClient(EtcdSettings(endpoints=tuple(endpoints), cluster="idle-channels"))
    try:
        await read_through_each(client, endpoints)
        watch = await client.watch(KEY, 1, 0)
        try:
            await asyncio.sleep(seconds)
        finally:
            watch.cancel()
        await read_through_each(client, endpoints)
    finally:
        await client.close()
    print("ok", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1].split(","), float(sys.argv[2])))
