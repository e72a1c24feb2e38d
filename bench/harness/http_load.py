"""Single-POST load on an HTTP server: ``wrk -t2 -c50`` with a 100-byte body, or, where wrk
is missing, 50 aiohttp POST loops in this process."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import aiohttp

from bench.harness.figures import Figure
from bench.harness.loops import loops
from bench.harness.payloads import PAYLOAD

CONNECTIONS = 50


def wrk_rate(wrk: str, url: str, path: str, seconds: float) -> Figure:
    """Requests/s of one wrk run POSTing a 100-byte body with 50 connections for
    ``seconds`` (whole seconds, at least one); any non-2xx answer fails the run."""
    duration = max(1, round(seconds))
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text(f'wrk.method = "POST"\nwrk.body = string.rep("x", {len(PAYLOAD)})\n'
                      f'wrk.headers["Content-Type"] = "application/octet-stream"\n'
                      f'wrk.path = "{path}"\n')
    try:
        out = subprocess.run([wrk, "-t2", f"-c{CONNECTIONS}", f"-d{duration}s",
                              "-s", str(script), url], capture_output=True, text=True,
                             timeout=seconds + 60).stdout
    finally:
        script.unlink()
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not match or re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        raise RuntimeError(f"wrk failed against {url}{path}: {out[-300:]}")
    return Figure(float(match.group(1)), duration)


async def aiohttp_rate(url: str, seconds: float) -> Figure:
    """Requests/s of 50 aiohttp loops POSTing a 100-byte body to ``url`` (when wrk is
    missing)."""
    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=CONNECTIONS)) as session:
        async def post() -> int:
            async with session.post(url, data=PAYLOAD) as resp:
                await resp.read()
                if resp.status >= 300:
                    raise RuntimeError(f"POST {url}: HTTP {resp.status}")
            return 1

        return await loops(CONNECTIONS, seconds, post)
