// Publish one message (text, JSON or a file) to a topic (native API) or a named stream
// (Durable Streams, with the stream's own content type).

import { ApiError, call, topicParam } from "./api.js";
import { h, status } from "./dom.js";

export function mount(root, { params }) {
  const target = h("input", { id: "publish-topic", placeholder: "topic id or stream name",
                              value: params.get("topic") || "", required: true });
  const type = h("input", { id: "publish-type", type: "number", min: 0, max: 32767, value: "1" });
  const kind = h("select", { id: "publish-kind" },
    ["text", "json", "file"].map((k) => h("option", { value: k, text: k })));
  const text = h("textarea", { id: "publish-data", rows: 8, cols: 70 });
  const file = h("input", { id: "publish-file", type: "file", hidden: true });
  const line = h("p", { id: "publish-status", class: "status" });
  kind.addEventListener("change", () => {
    text.hidden = kind.value === "file";
    file.hidden = kind.value !== "file";
  });

  async function body() {
    if (kind.value === "file") {
      if (!file.files.length) throw new Error("choose a file");
      return [await file.files[0].arrayBuffer(), file.files[0].type || "application/octet-stream"];
    }
    if (kind.value === "json") {
      try {
        JSON.parse(text.value);
      } catch (err) {
        throw new Error(`not JSON: ${err.message}`);
      }
      return [text.value, "application/json"];
    }
    return [text.value, "text/plain; charset=utf-8"];
  }

  async function send(event) {
    event.preventDefault();
    try {
      const topic = topicParam(target.value);
      if (!topic) throw new Error("give a topic id or a stream name");
      const [data, contentType] = await body();
      if (/^\d+$/.test(topic)) {
        const response = await call("/messaging/messages", { method: "POST", body: data,
          params: { topicID: topic, type: type.value || 1 } });
        status(line, `Published to topic ${topic} at index ${response.headers.get("X-Broker-Index")}.`, "ok");
        return;
      }
      const path = `/v1/stream/${topic.split("/").map(encodeURIComponent).join("/")}`;
      let streamType = contentType;
      try {  // a stream takes appends of its own content type
        const head = await call(path, { method: "HEAD" });
        streamType = head.headers.get("Content-Type") || contentType;
      } catch (err) {
        if (err instanceof ApiError && err.status === 404) throw new Error(`no stream named ${topic}`);
        throw err;
      }
      const response = await call(path, { method: "POST", body: data,
                                          headers: { "Content-Type": streamType } });
      status(line, `Appended to stream ${topic}; next offset ${response.headers.get("Stream-Next-Offset")}.`, "ok");
    } catch (err) {
      status(line, `Not published: ${err.message}`, "error");
    }
  }

  root.append(h("section", {}, h("h2", { text: "Publish" }),
    h("form", { id: "publish-form", class: "card", onsubmit: send },
      h("p", {}, h("label", {}, "Topic or stream ", target), " ",
        h("label", { title: "native topics only" }, "Type ", type), " ", h("label", {}, "As ", kind)),
      h("p", {}, text, file),
      h("button", { type: "submit", id: "publish-send", text: "Publish" }), line)));
  return () => {};
}
