// Topics and streams: one row per topic, virtualised (only the rows in view are in the
// page), sorted and filtered client-side, polled every POLL_MS; the message rate comes from
// successive polls. A topic's message count is its row's ``count`` (broker indexes are
// shared by every topic, so last - first is not one); the column shows once the broker
// gives it.

import { json, big } from "./api.js";
import { clear, h, sparkline, status } from "./dom.js";
import { rate, size } from "./format.js";

const POLL_MS = 2000;
const ROW = 28;
const OVERSCAN = 8;
const HISTORY = 30;

const COLUMNS = [
  ["id", "Topic"], ["count", "Messages"], ["size", "Size"], ["first_index", "First"],
  ["last_index", "Last"], ["segments", "Segments"], ["rate", "msg/s"],
  ["subscribers", "Subscribers"],
];
// The class of a column's header and cells (the message count's is hidden without counts).
const COLUMN_CLASS = { count: "messages-col" };

export function mount(root, { navigate }) {
  let rows = [];          // every topic, as polled
  let shown = [];         // filtered and sorted
  let sortKey = "id";
  let descending = false;
  let filter = "";
  let timer = null;
  let stopped = false;
  let firstRender = true;
  const history = new Map(); // topic id → {last, size, at, rates: []}
  const line = h("p", { class: "status" });
  const count = h("span", { class: "muted", id: "topic-count" });
  const search = h("input", { type: "search", id: "topic-filter", placeholder: "filter by id or name",
                              oninput: () => { filter = search.value.trim().toLowerCase(); refresh(); } });
  const header = h("div", { class: "vrow vhead topics" },
    COLUMNS.map(([key, label]) => h("button", { type: "button",
      class: `sort ${COLUMN_CLASS[key] || ""}`.trim(), "data-key": key,
      text: label, onclick: () => {
        descending = sortKey === key ? !descending : key !== "id";
        sortKey = key;
        refresh();
      } })));
  const spacer = h("div", { class: "vspacer" });
  const viewport = h("div", { class: "vlist", id: "topic-list", onscroll: () => paint() }, spacer);
  const section = h("section", { id: "topics" },
    h("div", { class: "toolbar" }, h("h2", { text: "Topics and streams" }), search, count),
    line, header, viewport,
    h("p", { class: "muted small", text: "msg/s: the rise of the topic's last index per second " +
      "between polls; broker indexes are shared by topics, so it is exact when the topic was " +
      "the only one written in the interval and an upper bound (≤) otherwise." }));
  root.append(section);

  function key(topic) {
    return topic.name !== undefined ? topic.name : String(topic.id);
  }

  function value(topic, k) {
    if (k === "id") return topic.name !== undefined ? `~${topic.name}` : big(topic.id);
    if (k === "rate") return topic.rate || 0;
    if (k === "subscribers") return Object.keys(topic.subscribers || {}).length;
    if (k === "count") return topic.count === undefined ? -1 : Number(topic.count);
    if (k === "size") return Number(topic.size) + Number(topic.offloaded_size || 0);
    if (k === "first_index" || k === "last_index") return big(topic[k]);
    return Number(topic[k]);
  }

  function refresh() {
    shown = filter ? rows.filter((t) => key(t).toLowerCase().includes(filter) ||
                                        String(t.id).includes(filter)) : rows.slice();
    const sign = descending ? -1 : 1;
    shown.sort((a, b) => {
      const x = value(a, sortKey);
      const y = value(b, sortKey);
      if (typeof x !== typeof y) return (typeof x === "string" ? 1 : -1) * sign;
      return (x < y ? -1 : x > y ? 1 : 0) * sign;
    });
    for (const button of header.querySelectorAll("button")) {
      button.classList.toggle("sorted", button.dataset.key === sortKey);
      button.classList.toggle("desc", button.dataset.key === sortKey && descending);
    }
    count.textContent = `${shown.length.toLocaleString("en")} of ${rows.length.toLocaleString("en")}`;
    spacer.style.height = `${shown.length * ROW}px`;
    paint();
  }

  function cell(topic, k) {
    if (k === "id") {
      return topic.name !== undefined
        ? h("span", {}, h("span", { class: "name", text: topic.name }), h("span", { class: "muted small", text: ` #${topic.id}` }))
        : h("span", { text: String(topic.id) });
    }
    if (k === "size") {
      const local = size(topic.size);
      return topic.offloaded_size !== undefined
        ? h("span", { title: "local + offloaded to object storage",
                      text: `${local} + ${size(topic.offloaded_size)} offloaded` })
        : h("span", { text: local });
    }
    if (k === "rate") {
      const seen = history.get(key(topic));
      return h("span", { class: "rate" }, sparkline(seen ? seen.rates : []),
               h("span", { text: `${topic.bound ? "≤" : ""}${rate(topic.rate)}` }));
    }
    if (k === "subscribers") {
      const names = Object.keys(topic.subscribers || {});
      return h("span", { title: names.join(", "), text: String(names.length) });
    }
    if (k === "count") {
      return h("span", { class: COLUMN_CLASS.count,
                         text: topic.count === undefined ? "—" : big(topic.count).toLocaleString("en") });
    }
    return h("span", { text: String(topic[k]) });
  }

  function paint() {
    const top = viewport.scrollTop;
    const height = viewport.clientHeight || 600;
    const from = Math.max(0, Math.floor(top / ROW) - OVERSCAN);
    const to = Math.min(shown.length, Math.ceil((top + height) / ROW) + OVERSCAN);
    const fragment = document.createDocumentFragment();
    for (let i = from; i < to; i++) {
      const topic = shown[i];
      const row = h("div", { class: "vrow topics", "data-topic": key(topic),
        onclick: () => navigate("messages", { topic: key(topic), mode: "last" }) },
        COLUMNS.map(([k]) => cell(topic, k)));
      row.style.transform = `translateY(${i * ROW}px)`;
      fragment.append(row);
    }
    clear(spacer).append(fragment);
    if (firstRender && rows.length) {
      firstRender = false;
      performance.mark("console-topics-rendered");
    }
  }

  function rates(topics) {
    const now = performance.now();
    let moved = 0;
    const changes = [];
    for (const topic of topics) {
      const k = key(topic);
      const last = big(topic.last_index);
      const seen = history.get(k);
      if (!seen) {
        history.set(k, { last, at: now, rates: [] });
        continue;
      }
      const rise = last > seen.last ? Number(last - seen.last) : 0;
      if (rise) moved++;
      changes.push([topic, seen, rise / Math.max((now - seen.at) / 1000, 0.001), last]);
    }
    for (const [topic, seen, perSecond, last] of changes) {
      topic.rate = perSecond;
      topic.bound = moved > 1 && perSecond > 0;
      seen.rates.push(perSecond);
      if (seen.rates.length > HISTORY) seen.rates.shift();
      seen.last = last;
      seen.at = now;
    }
  }

  async function poll() {
    timer = null;
    try {
      const topics = await json("/messaging/topics");
      if (stopped) return;
      rates(topics);
      rows = topics;
      section.classList.toggle("counted", topics.some((t) => t.count !== undefined));
      status(line, topics.length ? "" : "No topics yet: publish a message to create one.", "info");
      refresh();
    } catch (err) {
      if (stopped) return;
      status(line, `Cannot list topics: ${err.message}`, "error");
    }
    if (!stopped) timer = setTimeout(poll, POLL_MS);
  }

  poll();
  return () => {
    stopped = true;
    if (timer) clearTimeout(timer);
  };
}
