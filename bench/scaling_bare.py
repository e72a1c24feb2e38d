"""Bare aiohttp for the scaling benchmark: bench/bare_server.py's ``POST /204`` handler in an
application that accepts bodies up to 64 MiB (the broker's --max-request-size default), so
that batches above aiohttp's 1 MiB default have a baseline too."""

from __future__ import annotations

import sys
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bare_server import no_content
from bench.procs import Proc, free_port

MAX_BODY = 64 << 20


def start() -> tuple[Proc, str]:
    """This server in its own process, and its URL."""
    port = free_port()
    return Proc([sys.executable, str(Path(__file__).resolve()), str(port)], "ready"), \
        f"http://127.0.0.1:{port}"


def main() -> None:
    from messaging.cli import event_loop_factory

    factory = event_loop_factory()  # the same event loop the broker runs on
    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post("/204", no_content)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None,
                print=lambda *_: print("ready", flush=True),
                loop=factory() if factory is not None else None)


if __name__ == "__main__":
    main()
