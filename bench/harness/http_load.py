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


#: A line of wrk's latency distribution (``--latency``): percentile, value, unit.
_WRK_PERCENTILE = re.compile(r"^\s+(50|75|90|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_TO_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk_latencies(out: str) -> dict[str, float]:
    """``latency_p50_ms`` ... ``latency_p99_ms`` from wrk's ``--latency`` output."""
    return {f"latency_p{p}_ms": float(value) * _TO_MS[unit]
            for p, value, unit in _WRK_PERCENTILE.findall(out)}


def wrk_rate(wrk: str, url: str, path: str, seconds: float) -> Figure:
    """Requests/s of one wrk run POSTing a 100-byte body with 50 connections for
    ``seconds`` (whole seconds, at least one); any non-2xx answer fails the run. Its extras
    hold the requests' latency percentiles under that load (``latency_p50_ms`` ...)."""
    duration = max(1, round(seconds))
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text(f'wrk.method = "POST"\nwrk.body = string.rep("x", {len(PAYLOAD)})\n'
                      f'wrk.headers["Content-Type"] = "application/octet-stream"\n'
                      f'wrk.path = "{path}"\n')
    try:
        out = subprocess.run([wrk, "-t2", f"-c{CONNECTIONS}", f"-d{duration}s", "--latency",
                              "-s", str(script), url], capture_output=True, text=True,
                             timeout=seconds + 60).stdout
    finally:
        script.unlink()
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not match or re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        raise RuntimeError(f"wrk failed against {url}{path}: {out[-300:]}")
    return Figure(float(match.group(1)), duration, wrk_latencies(out))


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
