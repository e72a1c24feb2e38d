// Live tail: a topic's new messages over SSE (read with fetch, so the token goes in a
// header). Events are queued as they arrive and drawn once per animation frame, newest
// first, keeping at most MAX_ROWS rows, so a thousand messages a second leave the page
// responsive. Pausing ends the stream; resuming reads on from the last index shown.

import { big, readSse, topicParam } from "./api.js";
import { clear, h, status } from "./dom.js";
import { fromBase64, render, time, utf8, rate } from "./format.js";

const MAX_ROWS = 500;
const MAX_SHOWN_BYTES = 2048;

export function mount(root, { params }) {
  const topicInput = h("input", { id: "tail-topic", placeholder: "topic id or stream name",
                                  value: params.get("topic") || "" });
  const startButton = h("button", { type: "submit", id: "tail-start", text: "Start" });
  const pauseButton = h("button", { type: "button", id: "tail-pause", text: "Pause", disabled: true,
                                    onclick: () => (controller ? pause() : resume()) });
  const line = h("p", { id: "tail-status", class: "status" });
  const counter = h("span", { id: "tail-count", class: "muted", text: "0 received" });
  const body = h("tbody", { id: "tail-rows" });
  let controller = null;
  let topic = null;
  let next = null;       // BigInt: the index to read from after a pause
  let pausedAt = 0;
  let queue = [];
  let frame = null;
  let received = 0;
  let rows = 0;
  let windowStart = performance.now();
  let windowCount = 0;
  let perSecond = 0;

  root.append(h("section", {}, h("h2", { text: "Live tail" }),
    h("form", { class: "toolbar", onsubmit: (event) => { event.preventDefault(); start(); } },
      h("label", {}, "Topic ", topicInput), startButton, pauseButton, counter),
    line,
    h("table", { class: "messages" },
      h("thead", {}, h("tr", {}, ["Index", "Received", "Data"].map((t) => h("th", { text: t })))),
      body)));

  function draw() {
    frame = null;
    const batch = queue.length > MAX_ROWS ? queue.slice(queue.length - MAX_ROWS) : queue;
    queue = [];
    const fragment = document.createDocumentFragment();
    for (let i = batch.length - 1; i >= 0; i--) {
      const [index, bytes, at] = batch[i];
      const shown = render(bytes, "auto", MAX_SHOWN_BYTES);
      fragment.append(h("tr", { "data-index": index },
        h("td", { class: "num", text: index }),
        h("td", { class: "time", text: time(at) }),
        h("td", {}, h("pre", { class: "data", text: shown.text }))));
    }
    body.prepend(fragment);
    rows += batch.length;
    while (rows > MAX_ROWS && body.lastChild) {
      body.lastChild.remove();
      rows--;
    }
    counter.textContent = `${received.toLocaleString("en")} received, ${rate(perSecond)} msg/s`;
  }

  function receive(event) {
    if (event.event === "control") return;
    const bytes = event.event === "data-base64" ? fromBase64(event.data) : utf8(event.data);
    queue.push([event.id, bytes, Date.now()]);
    if (event.id !== null) next = big(event.id) + 1n;
    received++;
    windowCount++;
    const now = performance.now();
    if (now - windowStart >= 1000) {
      perSecond = (windowCount * 1000) / (now - windowStart);
      windowStart = now;
      windowCount = 0;
    }
    if (queue.length > MAX_ROWS * 4) queue = queue.slice(queue.length - MAX_ROWS);
    if (frame === null) frame = requestAnimationFrame(draw);
  }

  async function follow(from, described) {
    controller = new AbortController();
    const mine = controller;
    pauseButton.disabled = false;
    pauseButton.textContent = "Pause";
    status(line, `Following ${topic} from ${described}.`, "ok");
    try {
      await readSse("/messaging/messages", { topicID: topic, format: "sse", ...from },
                    mine.signal, receive);
      if (controller === mine) status(line, "The stream ended.", "info");
    } catch (err) {
      if (err.name === "AbortError") return;
      status(line, `The stream broke off: ${err.message}`, "error");
    } finally {
      if (controller === mine) controller = null;
    }
  }

  function start() {
    stop();
    clear(body);
    rows = received = 0;
    next = null;
    topic = topicParam(topicInput.value);
    if (!topic) return status(line, "Give a topic id or a stream name.", "error");
    // From now by the broker's clock (a topic with no message yet waits for its first).
    follow({ since: "0ms" }, "now");
  }

  function pause() {
    const running = controller;
    controller = null;
    if (running) running.abort();
    pausedAt = performance.now();
    pauseButton.textContent = "Resume";
    status(line, next === null ? "Paused." : `Paused before index ${next}.`, "info");
  }

  function resume() {
    if (topic === null) return;
    if (next !== null) follow({ index: next }, `index ${next}`);
    else follow({ since: `${Math.ceil(performance.now() - pausedAt) + 1000}ms` }, "the pause");
  }

  function stop() {
    const running = controller;
    controller = null;
    if (running) running.abort();
    if (frame !== null) cancelAnimationFrame(frame);
    frame = null;
    queue = [];
  }

  if (params.get("topic")) start();
  return stop;
}
