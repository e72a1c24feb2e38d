"""Many topics: 20,000 topics start and serve under ``ulimit -n 1024``.

An idle topic holds no descriptor and a broker keeps at most ``max_open_files`` (a quarter of
RLIMIT_NOFILE) topics with a write file open, so the number of topics is bounded by the disk,
not by the descriptor limit. A broker process runs with a soft limit of 1024 while 20,000
topics are created in one POST, it is killed and restarted, and thousands of topics are
written again; its descriptor count is sampled all along.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from types import TracebackType

import aiohttp
import pytest

from messaging.frames import FRAMES_CONTENT_TYPE, Message, decode, encode_many
from tests.conftest import BrokerProcess

NOFILE = 1024
TOPICS = 20_000
#: "Well under 1024": the write-file budget (1024 // 4) plus sockets, readers and Python's own.
MAX_DESCRIPTORS = 512


class DescriptorWatch:
    """Samples ``/proc/PID/fd`` on a thread while the block runs.

    ``peak`` is the largest number of descriptors seen, ``segment_peak`` the largest number
    of them open on segment files for writing (readers open theirs briefly, per read).
    Polling is the only way to watch another process's descriptor table; the loop is bounded
    by ``limit`` seconds and stops when the block ends or the process is gone.
    """

    def __init__(self, pid: int, interval: float = 0.005, limit: float = 300.0) -> None:
        self.pid = pid
        self.interval = interval
        self.limit = limit
        self.peak = 0
        self.segment_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> tuple[int, int]:
        """(descriptors, of which segment files open for writing) right now."""
        fds = os.listdir(f"/proc/{self.pid}/fd")
        writing = 0
        for fd in fds:
            with contextlib.suppress(FileNotFoundError):  # closed since the listing
                if not os.readlink(f"/proc/{self.pid}/fd/{fd}").endswith(".seg"):
                    continue
                info = Path(f"/proc/{self.pid}/fdinfo/{fd}").read_text()
                flags = int(re.search(r"^flags:\s*([0-7]+)", info, re.M).group(1), 8)
                writing += flags & os.O_ACCMODE != os.O_RDONLY  # not a reader's
        return len(fds), writing

    def _run(self) -> None:
        deadline = time.monotonic() + self.limit
        while time.monotonic() < deadline:
            try:
                total, segments = self.sample()
            except FileNotFoundError:
                return  # the process exited
            self.peak = max(self.peak, total)
            self.segment_peak = max(self.segment_peak, segments)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> DescriptorWatch:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(10)


def soft_nofile(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no 'Max open files' line")


async def post_frames(session: aiohttp.ClientSession, url: str,
                      messages: Iterable[tuple[int, bytes]]) -> int:
    """POST frames for many topics (no topicID); returns the first index assigned."""
    batch = list(messages)
    body = encode_many(Message(0, 1, topic, data) for topic, data in batch)
    async with session.post(f"{url}/messaging/messages", data=io.BytesIO(body),
                            headers={"Content-Type": FRAMES_CONTENT_TYPE}) as resp:
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
    assert answer["count"] == len(batch)
    return int(answer["first"])


async def post_one(session: aiohttp.ClientSession, url: str, topic: int, data: bytes) -> int:
    async with session.post(f"{url}/messaging/messages", params={"topicID": str(topic)},
                            data=data) as resp:
        assert resp.status == 200, await resp.text()
        return int(resp.headers["X-Broker-Index"])


async def bounded(jobs: list[Callable[[], Awaitable[None]]], concurrency: int) -> None:
    """Run the jobs, at most ``concurrency`` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def run(job: Callable[[], Awaitable[None]]) -> None:
        async with gate:
            await job()

    await asyncio.gather(*(run(job) for job in jobs))


async def check_topics(session: aiohttp.ClientSession, url: str,
                       model: dict[int, list[Message]], sample: list[int]) -> None:
    """Each sampled topic reads back exactly: the same indexes and the same bytes."""
    for topic in sample:
        async with session.get(f"{url}/messaging/messages",
                               params={"topicID": str(topic)}) as resp:
            assert resp.status == 200, await resp.text()
            raw = await resp.read()
        messages, used = decode(raw, after=0)
        assert [m.index for m in messages] == [m.index for m in model[topic]], topic
        assert used == len(raw) and raw == encode_many(model[topic]), topic


def start(broker_process: Callable[..., BrokerProcess], data: Path) -> BrokerProcess:
    process = broker_process(data, nofile=NOFILE).start(timeout=90)
    assert soft_nofile(process.pid) == NOFILE
    return process


@pytest.mark.timeout(400)  # 25 s on 2 idle cores; 20,000 topics are 60,000 fsyncs
async def test_twenty_thousand_topics_under_ulimit_1024(broker_process,
                                                        tmp_path: Path) -> None:
    rng = random.Random(TOPICS)
    data = tmp_path / "data"
    model: dict[int, list[Message]] = {}
    timeout = aiohttp.ClientTimeout(total=180)
    peaks: dict[str, int] = {}
    segment_peaks: dict[str, int] = {}

    # 1. One POST of 20,000 frames, each for its own topic, in shuffled order.
    broker = start(broker_process, data)
    order = list(range(1, TOPICS + 1))
    rng.shuffle(order)
    first_batch = [(topic, f"topic {topic}: ".encode() + rng.randbytes(rng.randrange(40)))
                   for topic in order]
    with DescriptorWatch(broker.pid) as watch:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            first = await post_frames(session, broker.url, first_batch)
        peaks["first publish"] = watch.peak
        segment_peaks["first publish"] = watch.segment_peak
    for k, (topic, payload) in enumerate(first_batch):
        model[topic] = [Message(first + k, 1, topic, payload)]
    broker.kill()  # SIGKILL: everything acknowledged was fsynced

    # 2. Restart under the same limit; it must start, list and read every topic it had.
    started = time.monotonic()
    broker = start(broker_process, data)
    start_seconds = time.monotonic() - started
    with DescriptorWatch(broker.pid) as watch:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(f"{broker.url}/messaging/topics") as resp:
                listed = {t["id"]: t["last_index"] for t in await resp.json()}
            assert listed == {t: ms[-1].index for t, ms in model.items()}
            await check_topics(session, broker.url, model, rng.sample(order, 300))
            peaks["restart and reads"] = watch.peak
            segment_peaks["restart and reads"] = watch.segment_peak

            # 3. Thousands of distinct topics again, old and new: batches of 100 frames
            # four at a time (a group commit then spans more topics than the file budget)
            # and single-message POSTs sixteen at a time.
            again = rng.sample(order, 2_500) + list(range(TOPICS + 1, TOPICS + 501))
            rng.shuffle(again)
            payloads = {t: f"topic {t} again".encode() for t in again}
            batches, singles = again[:2_800], again[2_800:]

            def send_batch(topics: list[int]) -> Callable[[], Awaitable[None]]:
                async def job() -> None:
                    index = await post_frames(session, broker.url,
                                              [(t, payloads[t]) for t in topics])
                    for k, topic in enumerate(topics):
                        model.setdefault(topic, []).append(
                            Message(index + k, 1, topic, payloads[topic]))
                return job

            def send_one(topic: int) -> Callable[[], Awaitable[None]]:
                async def job() -> None:
                    index = await post_one(session, broker.url, topic, payloads[topic])
                    model.setdefault(topic, []).append(Message(index, 1, topic,
                                                               payloads[topic]))
                return job

            await bounded([send_batch(batches[k:k + 100])
                           for k in range(0, len(batches), 100)], 4)
            await bounded([send_one(topic) for topic in singles], 16)
            peaks["second publish"] = watch.peak
            segment_peaks["second publish"] = watch.segment_peak
            await check_topics(session, broker.url, model, rng.sample(again, 300))
            async with session.get(f"{broker.url}/messaging/diagnostics") as resp:
                diagnostics = await resp.json()
            async with session.get(f"{broker.url}/metrics") as resp:
                assert resp.status == 200
            peaks["end"] = watch.peak
            segment_peaks["end"] = watch.segment_peak
    assert len(diagnostics["topics"]) == TOPICS + 500
    assert diagnostics["max_open_files"] == NOFILE // 4
    assert diagnostics["open_files"] <= diagnostics["max_open_files"]
    assert broker.terminate() == 0  # a clean close of 20,500 topics, under the limit too
    assert max(peaks.values()) < MAX_DESCRIPTORS, peaks
    # No more topics with a write file open than the budget, even while a group is written.
    assert max(segment_peaks.values()) <= NOFILE // 4, segment_peaks
    assert start_seconds < 30, f"start-up with {TOPICS} topics took {start_seconds:.1f} s"
    log = broker.log.read_text()
    assert "Traceback" not in log and "Too many open files" not in log
    print(f"start-up {start_seconds:.2f} s; descriptor peaks {peaks}; "
          f"on segment files {segment_peaks}")
