// This node and its cluster: health (/readyz reasons), version, fsync mode, disk space; in a
// cluster the etcd endpoints, applied revisions and lag of every node, the watch and quorum;
// topic groups and their holders; object storage when the node has it.

import { call, json, optionalJson } from "./api.js";
import { clear, h, keyValues, status } from "./dom.js";
import { size } from "./format.js";

const POLL_MS = 3000;

async function readiness() {
  try {
    await call("/readyz");
    return { ready: true, problems: [] };
  } catch (err) {
    if (err.status === 503) {
      try {
        return { ready: false, problems: JSON.parse(err.message).problems || [err.message] };
      } catch {
        return { ready: false, problems: [err.message] };
      }
    }
    throw err;
  }
}

function nodesTable(nodes, etcdRevision) {
  const body = h("tbody", {});
  for (const [url, revision] of Object.entries(nodes || {})) {
    const lag = etcdRevision ? Math.max(0, Number(etcdRevision) - Number(revision)) : null;
    body.append(h("tr", { "data-node": url }, h("td", { text: url }),
      h("td", { class: "num", text: String(revision) }),
      h("td", { class: "num", text: lag === null ? "—" : String(lag) })));
  }
  return h("table", { class: "grid nodes" },
    h("thead", {}, h("tr", {}, ["Node", "Durable revision", "Behind etcd"].map((t) => h("th", { text: t })))),
    body);
}

function etcdLog(log) {
  const watch = log.watch || {};
  return h("div", { class: "card" },
    keyValues({
      cluster: log.cluster, "etcd endpoints": (log.endpoints || []).join(", "),
      "endpoint in use": log.endpoint, "applied revision": log.applied_revision,
      "etcd revision": log.etcd_revision, lag: log.lag,
      watch: watch.live ? `live from revision ${watch.from_revision} (${watch.endpoint})` :
        `down${watch.error ? `: ${watch.error}` : ""}`,
      "watch restarts": watch.restarts, failure: log.failure,
    }),
    h("h4", { text: "Nodes" }), nodesTable(log.nodes, log.etcd_revision));
}

export function mount(root) {
  let timer = null;
  let stopped = false;
  const line = h("p", { id: "cluster-status", class: "status" });
  const content = h("div", { id: "cluster" });
  root.append(h("section", {}, h("h2", { text: "Node and cluster" }), line, content));

  async function poll() {
    timer = null;
    try {
      const [health, ready, diagnostics, ping, disk] = await Promise.all([
        json("/healthz"), readiness(), optionalJson("/messaging/diagnostics", null),
        optionalJson("/messaging/ping", { urls: [] }), optionalJson("/messaging/disk")]);
      // Only a node of a cluster of topic groups serves /messaging/groups (and keeps its
      // diagnostics, with the groups held, for admin tokens).
      const grouped = diagnostics === null || diagnostics.held !== undefined;
      const groups = grouped ? await optionalJson("/messaging/groups") : null;
      if (stopped) return;
      draw(health, ready, diagnostics || {}, ping, disk, groups);
      status(line, "", "info");
    } catch (err) {
      if (!stopped) status(line, `Cannot read the node's state: ${err.message}`, "error");
    }
    if (!stopped) timer = setTimeout(poll, POLL_MS);
  }

  function draw(health, ready, diagnostics, ping, disk, groups) {
    clear(content);
    // Quorum is a cluster's word: a single node is ready when it is writable.
    const clustered = diagnostics.mode === "etcd" || diagnostics.held !== undefined ||
      Boolean(groups) || ((ping && ping.urls) || []).length > 1;
    const readiness = !ready.ready ? `not ready: ${ready.problems.join("; ")}`
      : clustered ? "ready: writable and in quorum" : "ready: writable";
    content.append(h("h3", { text: `This node (${location.host})` }),
      h("p", { id: "readiness", class: `status ${ready.ready ? "ok" : "error"}`, text: readiness }),
      keyValues({
        version: health.version, mode: diagnostics.mode || diagnostics.role || (groups ? "groups" : "—"),
        fsync: diagnostics.fsync ?? (diagnostics.held ? Object.values(diagnostics.held)[0]?.fsync : undefined) ?? "—",
        "broker index": diagnostics.index ?? "—",
        "disk free": disk ? `${size(disk.free)} of ${size(disk.total)}` : "—",
        "open files": diagnostics.open_files ?? "—",
      }));
    const urls = (ping && ping.urls) || [];
    if (urls.length) {
      const list = h("ul", { id: "peers" });
      for (const url of urls) {
        const item = h("li", {});
        if (/^https?:\/\//.test(url)) item.append(h("a", { href: `${url}/console/`, text: url }));
        else item.append(url);
        list.append(item);
      }
      content.append(h("h3", { text: "Live nodes" }), list);
    }
    if (diagnostics.mode === "etcd") content.append(h("h3", { text: "etcd log" }), etcdLog(diagnostics));
    if (diagnostics.held) {
      for (const [group, log] of Object.entries(diagnostics.held)) {
        content.append(h("h3", { text: `Group ${group} (held here)` }), etcdLog(log));
      }
    }
    if (groups && groups.groups) {
      const body = h("tbody", {});
      for (const group of groups.groups) {
        body.append(h("tr", {}, h("td", { class: "num", text: String(group.group) }),
          h("td", { text: (group.holders || []).join(", ") }),
          h("td", { text: (group.etcd || []).join(", ") }),
          h("td", { text: group.here ? `applied ${group.here.applied_revision}, lag ${group.here.lag}` : "not held here" })));
      }
      content.append(h("h3", { text: `Topic groups of ${groups.cluster}` }),
        h("table", { class: "grid" }, h("thead", {}, h("tr", {},
          ["Group", "Holders", "etcd", "Here"].map((t) => h("th", { text: t })))), body));
    }
    if (diagnostics.object_store !== undefined) {
      const store = diagnostics.object_store;
      content.append(h("h3", { text: "Object storage" }),
        store !== null && typeof store === "object" ? keyValues(store) : h("p", { text: String(store) }));
    }
  }

  poll();
  return () => {
    stopped = true;
    if (timer) clearTimeout(timer);
  };
}
