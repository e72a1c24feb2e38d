"""The latency budget's report: the measurements' names, the table rows, the paragraph
computed from the figures, the detail table and the budget PNG."""

from __future__ import annotations

import statistics
from typing import Any

from bench.harness import results
from bench.harness.figures import Row, fmt
from bench.harness.plots import plt

#: Every measurement's key and name, in run order.
LABELS = {
    "disk-append": "disk (a): append 126 B + fdatasync, growing file",
    "disk-zeroed": "disk (b): overwrite 126 B + fdatasync, zero-filled preallocated file",
    "disk-fallocate": "disk (c): overwrite 126 B + fdatasync, posix_fallocate'd file",
    "disk-dsync": "disk (d): pwrite 126 B with O_DSYNC, appending",
    "handoff": "hand-off alone: loop → writer thread → loop (uvloop, no I/O)",
    "handoff-disk": "hand-off with (a) on the writer thread",
    "floor-inline": "Python floor: uvloop server, fdatasync inline on the loop",
    "floor-thread": "Python floor: the same, fdatasync on a writer thread (LocalLog hand-off)",
    "floor-inline-prealloc": "Python floor, inline, preallocated file",
    "floor-thread-prealloc": "Python floor, writer thread, preallocated file",
    "ours": "ours: POST per message → streaming GET, --fsync always (lean client)",
    "ours-nofsync": "ours with --fsync never (lean client)",
    "redis": "Redis XADD → XREAD BLOCK, appendfsync always (lean client, hiredis)",
}
DISK = ("disk-append", "disk-zeroed", "disk-fallocate", "disk-dsync")
FLOOR = ("floor-inline", "floor-thread", "floor-inline-prealloc", "floor-thread-prealloc")

#: A run beside other processes using this much CPU (cores) is counted as disturbed.
DISTURBED_CORES = 0.25

Summary = dict[str, Any]


def p50_of(summaries: dict[str, Summary], key: str) -> float | None:
    """The p50 (µs) of ``key``, None when it was not measured."""
    value = summaries.get(key, {}).get("p50_us")
    return float(value) if value is not None else None


def table_rows(summaries: dict[str, Summary]) -> list[Row]:
    """Our p50 and p99 against Redis's; every end-to-end path against Redis's p50; every
    component against our p50 (its ratio is its share of our p50)."""
    rows: list[Row] = []
    redis, ours = summaries.get("redis", {}), summaries.get("ours", {})

    def add(name: str, value: float | None, base_name: str, base: float | None,
            target: str = "", met: bool | None = None) -> None:
        if value is not None:
            rows.append(Row(name, value, "µs", base_name if base is not None else "", base,
                            target, met))

    redis_p50, ours_p50 = redis.get("p50_us"), ours.get("p50_us")
    add("ours p50 vs Redis p50 (publish → subscriber at 1,000 msg/s)", ours_p50,
        "Redis p50", redis_p50, "≤ 1x Redis",
        None if ours_p50 is None or redis_p50 is None else ours_p50 <= redis_p50)
    add("ours p99 vs Redis p99", ours.get("p99_us"), "Redis p99", redis.get("p99_us"))
    for key in ("ours-nofsync", *FLOOR):
        add(f"{LABELS[key]}: p50 vs Redis", p50_of(summaries, key), "Redis p50", redis_p50)
    for key in (*DISK, "handoff", "handoff-disk"):
        add(f"{LABELS[key]}: p50, share of ours", p50_of(summaries, key), "ours p50", ours_p50)
    return rows


def us(value: float) -> str:
    """Microseconds, rounded, for the prose."""
    return f"{value:,.0f} µs"


def less(saving: float) -> str:
    """``saving`` µs as "N µs less" (or "N µs more" when it is negative)."""
    return f"{us(abs(saving))} {'less' if saving >= 0 else 'more'}"


def budget(summaries: dict[str, Summary]) -> tuple[str, dict[str, float]]:
    """The paragraph computed from the figures: our p50 split into disk, thread hops, HTTP
    and the rest; the single-threaded Python floor; preallocation; what reaching Redis's p50
    takes. Also the computed figures, for the JSON."""
    def get(key: str) -> float | None:
        return p50_of(summaries, key)

    ours, redis, nofsync = get("ours"), get("redis"), get("ours-nofsync")
    append, zeroed, fallocated, dsync = (get(k) for k in DISK)
    handoff, handoff_disk = get("handoff"), get("handoff-disk")
    inline, thread = get("floor-inline"), get("floor-thread")
    inline_pre, thread_pre = get("floor-inline-prealloc"), get("floor-thread-prealloc")
    computed: dict[str, float] = {}
    out: list[str] = []

    if ours is not None:
        o = ours

        def part(name: str, value: float, what: str, how: str) -> str:
            computed[name] = value
            return f"{what} {us(value)} ({value / o:.0%}; {how})"

        head = f"**Budget.** Our p50 was {us(o)}"
        if redis is not None:
            head += (f" against Redis's {us(redis)} ({o / redis:.2f}x, "
                     f"{us(abs(o - redis))} {'above' if o > redis else 'at or below'} it)")
        pieces = []
        if append is not None:
            pieces.append(part("disk_us", append, "the disk",
                               "append 126 B + fdatasync alone, row a"))
        if inline is not None and thread is not None:
            pieces.append(part("thread_hops_us", thread - inline,
                               "the thread hops", "the Python floor with the LocalLog "
                               "hand-off minus the same server fsyncing inline"))
        if thread is not None:
            pieces.append(part("http_us", o - thread,
                               "the HTTP/aiohttp path", "our broker minus the Python floor "
                               "with the same hand-off: request parsing, the handler, the "
                               "follower's wake-up, the chunked write"))
        if inline is not None and append is not None:
            pieces.append(part("rest_us", inline - append,
                               "the rest", "the inline floor minus the disk: loopback "
                               "sockets, the lean clients, the server's Python work per "
                               "message"))
        out.append(head + (": of it, " + "; ".join(pieces) if pieces else "") + ". These are "
                   "differences of medians, so they add up only roughly.")
        checks = []
        if handoff is not None:
            checks.append(f"the hand-off round trip alone took {us(handoff)}")
        if handoff_disk is not None and append is not None:
            computed["hop_over_disk_us"] = handoff_disk - append
            checks.append(f"with the append + fdatasync on the writer thread {us(handoff_disk)}"
                          f", {us(handoff_disk - append)} over the disk alone")
        if nofsync is not None:
            computed["fsync_in_broker_us"] = o - nofsync
            checks.append(f"our broker with --fsync never took {us(nofsync)}, so the durable "
                          f"write costs {us(o - nofsync)} inside the broker")
        if checks:
            out.append("Measured apart: " + "; ".join(checks) + ".")

    if inline is not None or thread is not None:
        floors = []
        for name, value in (("fsyncing inline on the loop", inline),
                            ("with the hop to a writer thread", thread)):
            if value is not None:
                versus = f", {value / redis:.2f}x Redis" if redis is not None else ""
                floors.append(f"{us(value)} {name}{versus}")
        text = "**Floor.** A single-threaded Python server on this disk: " + "; ".join(floors)
        if redis is not None and append is not None:
            text += (f". Beyond the disk's {us(append)}, Redis spends {us(redis - append)}"
                     + (f" and the inline Python floor {us(inline - append)}"
                        if inline is not None else ""))
        out.append(text + ".")

    if append is not None and zeroed is not None:
        saving = append - zeroed
        computed["prealloc_saving_us"] = saving
        text = (f"**Preallocation.** Overwriting a zero-filled preallocated file took "
                f"{us(zeroed)} against {us(append)} appending ({less(saving)}, "
                f"{saving / append:.0%} of the disk's p50)")
        if fallocated is not None:
            text += (f"; a posix_fallocate'd file (unwritten extents) {us(fallocated)} "
                     f"({less(append - fallocated)})")
        if dsync is not None:
            text += f"; pwrite with O_DSYNC {us(dsync)} ({less(append - dsync)})"
        text += "."
        if ours is not None:
            projected = ours - saving
            computed["ours_prealloc_projected_us"] = projected
            text += (f" With zero-filled preallocated segments our p50 would be about "
                     f"{us(projected)}"
                     + (f" ({projected / redis:.2f}x Redis)" if redis is not None else "") + ".")
        measured = [f"{us(v)} {name}" + (f" ({less(base - v)} than appending)"
                                          if base is not None else "")
                    for name, v, base in (("with the hand-off", thread_pre, thread),
                                          ("inline", inline_pre, inline)) if v is not None]
        if measured:
            text += " Measured with a preallocated file, the Python floor took " + \
                " and ".join(measured) + "."
        out.append(text)

    if ours is not None and redis is not None:
        out.append(reaching_redis(ours, redis, append, zeroed, thread, thread_pre, inline_pre,
                                  computed))
    return "\n\n".join(out), computed


def reaching_redis(ours: float, redis: float, append: float | None, zeroed: float | None,
                   thread: float | None, thread_pre: float | None, inline_pre: float | None,
                   computed: dict[str, float]) -> str:
    """Which changes, taken in order, bring our p50 to Redis's, by the figures."""
    if ours <= redis:
        return (f"**Reaching Redis.** Met: our p50 {us(ours)} is at or below Redis's "
                f"{us(redis)}.")
    steps: list[tuple[str, float]] = []
    if append is not None and zeroed is not None:
        steps.append(("preallocated segments (projected: our p50 minus the disk's saving)",
                      ours - (append - zeroed)))
    if thread_pre is not None:
        steps.append(("also no HTTP/aiohttp path (measured: the Python floor with the hand-off "
                      "and a preallocated file)", thread_pre))
    if inline_pre is not None:
        steps.append(("also no thread hop, fdatasync inline (measured: the inline Python floor "
                      "with a preallocated file)", inline_pre))
    text = f"**Reaching Redis.** Our p50 is {us(ours - redis)} above Redis's {us(redis)}. "
    if not steps:
        return text + "Too few paths were measured to say what would close the gap."
    text += "Taking the changes in turn: " + "; ".join(
        f"({i}) {name} → {us(value)} ({value / redis:.2f}x Redis)"
        for i, (name, value) in enumerate(steps, 1)) + ". "
    reached = next((i for i, (_, value) in enumerate(steps, 1) if value <= redis), None)
    if reached is None:
        nearest = min(value for _, value in steps)
        computed["nearest_gap_us"] = nearest - redis
        text += f"None of them reaches it: the nearest is still {us(nearest - redis)} above."
    else:
        computed["steps_to_redis"] = reached
        text += ("Step 1 alone reaches it." if reached == 1 else
                 f"It takes steps 1 to {reached} together.")
    if thread_pre is not None and thread is not None:
        allowed = redis - thread_pre
        computed["http_allowance_us"] = allowed
        text += (f" Put another way: with preallocated segments and the hand-off, our HTTP path "
                 f"may cost {us(allowed)} at p50 to match Redis; it costs {us(ours - thread)} "
                 f"now." if allowed > 0 else
                 f" With preallocated segments and the hand-off, even a server with no HTTP "
                 f"path at all is {us(-allowed)} above Redis.")
    return text


def detail_table(summaries: dict[str, Summary]) -> str:
    """Every measurement: p50, p99, each round's p50, messages."""
    lines = ["| measurement | p50 | p99 | p50 per round | messages per round | other processes "
             "(cores, per round) | note |", "|---|---|---|---|---|---|---|"]
    for sm in summaries.values():
        rounds = ", ".join(fmt(r["p50_us"]) for r in sm["rounds"]) or "-"
        received = ", ".join(str(r["received"]) for r in sm["rounds"]) or "-"
        others = ", ".join(f"{r['other_cores']:.2f}" for r in sm["rounds"]) or "-"
        note = sm["error"] or ("" if sm["all_delivered"] else "some messages missing")
        p50 = f"{fmt(sm['p50_us'])} µs" if sm["p50_us"] is not None else "-"
        p99 = f"{fmt(sm['p99_us'])} µs" if sm["p99_us"] is not None else "-"
        lines.append(f"| {sm['label']} | {p50} | {p99} | {rounds} | {received} | {others} | "
                     f"{note or '-'} |")
    return "\n".join(lines)


def other_load(summaries: dict[str, Summary]) -> str:
    """How busy other processes kept this machine during the runs (this is a shared machine:
    a figure taken beside someone else's load is slower than the path alone)."""
    runs = [r["other_cores"] for sm in summaries.values() for r in sm["rounds"]]
    if not runs:
        return ""
    disturbed = sum(1 for cores in runs if cores >= DISTURBED_CORES)
    return (f"Other processes on this machine kept {statistics.mean(runs):.2f} cores busy on "
            f"average during the runs, {max(runs):.2f} at most; {disturbed} of {len(runs)} "
            f"runs had {DISTURBED_CORES} of a core or more beside them (the column 'other "
            f"processes' below).")


def plot(summaries: dict[str, Summary]) -> None:
    """results/latency-budget.png: p50 and p99 of every measurement, Redis's p50 as a line."""
    shown = [(sm["label"], sm["p50_us"], sm["p99_us"]) for sm in summaries.values()
             if sm["p50_us"] is not None]
    if not shown:
        return
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(shown) + 1.5))
    names = [label if len(label) <= 60 else label[:57] + "…" for label, _, _ in shown]
    ax.barh(names, [p99 for _, _, p99 in shown], color="tab:blue", alpha=0.3, label="p99")
    ax.barh(names, [p50 for _, p50, _ in shown], color="tab:blue", label="p50")
    redis = summaries.get("redis", {}).get("p50_us")
    if redis is not None:
        ax.axvline(redis, color="tab:red", linestyle="--", linewidth=1, label="Redis p50")
    ax.set_xscale("log")
    ax.set_xlabel("µs at 1,000 msg/s")
    ax.invert_yaxis()
    ax.legend(loc="upper right")
    ax.set_title("Latency budget: p50 and p99 of each path")
    fig.tight_layout()
    fig.savefig(results.RESULTS / "latency-budget.png", dpi=90)
    plt.close(fig)
