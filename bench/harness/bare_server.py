"""The baseline server: bare aiohttp handlers with no broker behind them.

POST /204 answers 204 after reading the body; GET /stream?bytes=N streams N bytes from memory
in the same chunk size the broker uses.
"""

from __future__ import annotations

import sys

from aiohttp import web

CHUNK = 1 << 20  # the broker's STREAM_CHUNK (messaging.http.follow)
BLOCK = bytes(CHUNK)


async def no_content(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(status=204)


async def stream(request: web.Request) -> web.StreamResponse:
    remaining = int(request.query["bytes"])
    response = web.StreamResponse()
    response.enable_chunked_encoding()
    await response.prepare(request)
    while remaining > 0:
        await response.write(BLOCK[: min(remaining, CHUNK)])
        remaining -= CHUNK
    await response.write_eof()
    return response


def main() -> None:
    from messaging.cli.main import event_loop_factory

    factory = event_loop_factory()  # the same event loop the broker runs on
    # Bodies up to the broker's --max-request-size default, so big batches have a baseline.
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/204", no_content)
    app.router.add_get("/stream", stream)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None,
                print=lambda *_: print("ready", flush=True),
                loop=factory() if factory is not None else None)


if __name__ == "__main__":
    main()
