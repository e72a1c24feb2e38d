// The message browser: a page of a topic's messages from an index, from a time (since=) or
// the last N, with paging both ways; each message's data as text, pretty JSON or hex.

import { big, json, readMessages, timesOf, topicParam } from "./api.js";
import { clear, h, status } from "./dom.js";
import { render, time } from "./format.js";

const MAX_LIMIT = 10000;

export function mount(root, { params }) {
  const topicInput = h("input", { id: "browse-topic", placeholder: "topic id or stream name",
                                  value: params.get("topic") || "", list: "topic-names" });
  const names = h("datalist", { id: "topic-names" });
  const mode = h("select", { id: "browse-mode" },
    h("option", { value: "last", text: "the last N" }),
    h("option", { value: "index", text: "from index" }),
    h("option", { value: "since", text: "from time" }));
  mode.value = params.get("mode") || "last";
  const from = h("input", { id: "browse-from", placeholder: "index, or 2026-01-02T10:00:00Z / 10m",
                            value: params.get("from") || "" });
  const limit = h("input", { id: "browse-limit", type: "number", min: 1, max: MAX_LIMIT, value: "50" });
  const line = h("p", { id: "browse-status", class: "status" });
  const body = h("tbody", { id: "browse-rows" });
  const older = h("button", { type: "button", id: "browse-older", text: "◀ Older", disabled: true,
                              onclick: () => run(() => page("older")) });
  const newer = h("button", { type: "button", id: "browse-newer", text: "Newer ▶", disabled: true,
                              onclick: () => run(() => page("newer")) });
  let first = null;  // BigInt indexes of the page shown
  let last = null;
  let busy = false;

  const form = h("form", { class: "toolbar", id: "browse-form",
    onsubmit: (event) => { event.preventDefault(); run(load); } },
  h("label", {}, "Topic ", topicInput), names, h("label", {}, "Show ", mode), from,
  h("label", {}, "Limit ", limit), h("button", { type: "submit", id: "browse-load", text: "Load" }),
  older, newer);
  root.append(h("section", {}, h("h2", { text: "Messages" }), form, line,
    h("table", { class: "messages" },
      h("thead", {}, h("tr", {}, ["Index", "Time", "Type", "Format", "Data"].map((t) => h("th", { text: t })))),
      body)));

  json("/messaging/topics").then((topics) => {
    for (const topic of topics.slice(0, 2000)) {
      names.append(h("option", { value: topic.name !== undefined ? topic.name : String(topic.id) }));
    }
  }).catch(() => {});

  function topic() {
    const value = topicParam(topicInput.value);
    if (!value) throw new Error("give a topic id or a stream name");
    return value;
  }

  function size() {
    const n = Math.floor(Number(limit.value));
    if (!(n >= 1 && n <= MAX_LIMIT)) throw new Error(`the limit is 1 to ${MAX_LIMIT}`);
    return n;
  }

  async function run(action) {
    if (busy) return;
    busy = true;
    try {
      await action();
    } catch (err) {
      status(line, err.message, "error");
    } finally {
      busy = false;
    }
  }

  async function load() {
    const t = topic();
    const n = size();
    if (mode.value === "last") {
      const info = await json(`/messaging/topics/${encodeURIComponent(t)}`, { params: { last: n } });
      if (info.index === null || info.index === undefined) return show(t, [], "The topic holds no messages.");
      return show(t, await readMessages({ topicID: t, index: big(info.index), limit: n }));
    }
    const value = from.value.trim();
    if (mode.value === "index") {
      if (!/^\d+$/.test(value)) throw new Error("from index: give an index (a whole number)");
      return show(t, await readMessages({ topicID: t, index: value, limit: n }));
    }
    if (!value) throw new Error("from time: give a time (RFC 3339, ms since the epoch, or 10m back)");
    const local = /^\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d+)?)?$/.test(value)
      ? String(new Date(value).getTime()) : value;  // no zone: the browser's own
    return show(t, await readMessages({ topicID: t, since: local, limit: n }));
  }

  async function page(direction) {
    const t = topic();
    const n = size();
    if (direction === "newer") {
      const next = await readMessages({ topicID: t, index: last + 1n, limit: n });
      if (!next.length) return status(line, "No newer messages yet.", "info");
      return show(t, next);
    }
    const start = await indexBefore(t, first, n);
    if (start === null) return status(line, "This is the oldest message kept.", "info");
    return show(t, await readMessages({ topicID: t, index: start, end: first, limit: n }));
  }

  // Where the n messages before index ``before`` start: the API counts back from the end
  // (topics/{id}?last=k), so find how many messages are at or after ``before`` first.
  async function indexBefore(t, before, n) {
    const path = `/messaging/topics/${encodeURIComponent(t)}`;
    const info = await json(path);
    if (big(info.first_index) >= before) return null;
    const back = async (k) => big((await json(path, { params: { last: k } })).index);
    let low = 0;  // messages at or after ``before``: at least low, fewer than high
    let high = n;
    for (let round = 0; round < 64 && (await back(high)) >= before; round++) {
      low = high;
      high *= 2;
    }
    for (let round = 0; round < 64 && high - low > 1; round++) {
      const middle = Math.floor((low + high) / 2);
      if ((await back(middle)) >= before) low = middle;
      else high = middle;
    }
    return back(low + n);
  }

  async function show(t, messages, empty = "No messages there.") {
    clear(body);
    if (!messages.length) {
      first = last = null;
      older.disabled = newer.disabled = true;
      return status(line, empty, "info");
    }
    first = messages[0].index;
    last = messages[messages.length - 1].index;
    const timeOf = await timesOf(t, first, last);
    for (const message of messages) body.append(row(message, timeOf(message.index)));
    older.disabled = newer.disabled = false;
    status(line, `${messages.length} messages, index ${first} to ${last}.`, "ok");
  }

  function row(message, at) {
    const shown = render(message.data);
    const pre = h("pre", { class: "data", text: shown.text });
    const format = h("select", { class: "format", "aria-label": "format",
      onchange: () => { pre.textContent = render(message.data, format.value).text; } },
    ["text", "json", "hex"].map((m) => h("option", { value: m, text: m })));
    format.value = shown.mode;
    return h("tr", { "data-index": String(message.index) },
      h("td", { class: "num", text: String(message.index) }),
      h("td", { class: "time", text: time(at) }),
      h("td", { class: "num", text: String(message.type) }),
      h("td", {}, format),
      h("td", {}, pre));
  }

  if (params.get("topic")) run(load);
  return () => {};
}
