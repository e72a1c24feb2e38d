// Consumers: each stored position, its lag in messages and in time, when it was last seen;
// sortable (by lag first); reset and delete for admin tokens.

import { call, json } from "./api.js";
import { clear, h, status } from "./dom.js";
import { duration, time } from "./format.js";

const POLL_MS = 2000;
const COLUMNS = [
  ["topic", "Topic"], ["name", "Consumer"], ["index", "Position"], ["last_index", "Last"],
  ["lag", "Lag (messages)"], ["lag_ms", "Lag (time)"], ["last_seen", "Last heartbeat"],
  ["idle", "Idle"], ["live", "Live"],
];

export function mount(root, { caps }) {
  let rows = [];
  let sortKey = "lag";
  let descending = true;
  let timer = null;
  let stopped = false;
  const line = h("p", { id: "consumers-status", class: "status" });
  const head = h("tr", {});
  const body = h("tbody", { id: "consumer-rows" });
  root.append(h("section", {}, h("h2", { text: "Consumers" }), line,
    h("table", { class: "grid" }, h("thead", {}, head), body)));

  function header() {
    clear(head);
    for (const [key, label] of COLUMNS) {
      head.append(h("th", {}, h("button", { type: "button", class: `sort${key === sortKey ? " sorted" : ""}${key === sortKey && descending ? " desc" : ""}`,
        "data-key": key, text: label, onclick: () => {
          descending = sortKey === key ? !descending : ["lag", "lag_ms", "idle"].includes(key);
          sortKey = key;
          draw();
        } })));
    }
    if (caps.admin) head.append(h("th", { text: "Admin" }));
  }

  function admin(row) {
    const index = h("input", { type: "number", min: 0, class: "narrow", value: String(row.index),
                               "aria-label": "new position" });
    const remove = h("button", { type: "button", class: "danger", text: "Delete" });
    remove.addEventListener("click", async () => {
      if (remove.dataset.armed !== "yes") {
        remove.dataset.armed = "yes";
        remove.textContent = "Confirm delete";
        return;
      }
      await act(`Deleted ${row.name} on topic ${row.topic}.`, "DELETE", { topicID: row.topic });
    });
    const reset = h("button", { type: "button", text: "Reset",
      onclick: () => act(`Reset ${row.name} on topic ${row.topic} to ${index.value}.`, "PUT",
                         { topicID: row.topic, index: index.value }) });
    async function act(done, method, params) {
      try {
        await call(`/messaging/consumers/${encodeURIComponent(row.name)}`, { method, params });
        status(line, done, "ok");
        poll(true);
      } catch (err) {
        status(line, `${method === "PUT" ? "Reset" : "Delete"} failed: ${err.message}`, "error");
      }
    }
    return h("td", { class: "actions" }, index, reset, remove);
  }

  function cell(row, key) {
    const value = row[key];
    if (key === "lag_ms") return duration(value);
    if (key === "last_seen") return time(value === null ? null : value * 1000);
    if (key === "idle") return duration(value * 1000);
    if (key === "live") return value ? "yes" : "no";
    return String(value);
  }

  function draw() {
    header();
    const sign = descending ? -1 : 1;
    const sorted = rows.slice().sort((a, b) => {
      const x = a[sortKey] ?? -1;
      const y = b[sortKey] ?? -1;
      const nx = typeof x === "string" && /^\d+$/.test(x) ? Number(x) : x;
      const ny = typeof y === "string" && /^\d+$/.test(y) ? Number(y) : y;
      return (nx < ny ? -1 : nx > ny ? 1 : 0) * sign;
    });
    clear(body);
    for (const row of sorted) {
      body.append(h("tr", { "data-consumer": row.name },
        COLUMNS.map(([key]) => h("td", { class: key === "name" ? "" : "num", text: cell(row, key) })),
        caps.admin ? admin(row) : null));
    }
    if (!rows.length) status(line, "No consumers: a consumer appears with its first heartbeat.", "info");
  }

  async function poll(force = false) {
    if (timer) clearTimeout(timer);
    timer = null;
    try {
      rows = await json("/messaging/consumers");
      if (stopped) return;
      // Keep an admin's half-typed position: redraw only when nothing has the focus there.
      if (force || !body.contains(document.activeElement)) draw();
    } catch (err) {
      if (!stopped) status(line, `Cannot list consumers: ${err.message}`, "error");
    }
    if (!stopped) timer = setTimeout(poll, POLL_MS);
  }

  poll();
  return () => {
    stopped = true;
    if (timer) clearTimeout(timer);
  };
}
