// The broker's public HTTP API as the console calls it: the token from the tab's
// sessionStorage goes in an Authorization header (never in a URL), errors carry the broker's
// X-Broker-Error text, frames are decoded here, and SSE is read with fetch() so that the
// header goes with it (EventSource cannot send one).

const TOKEN_KEY = "messaging.console.token";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** An answer that was not 2xx: its status and the broker's message. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** A path with query parameters (values null or undefined left out). */
export function url(path, params = {}) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") query.set(key, String(value));
  }
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

/** fetch() with the token; throws ApiError on a status other than 2xx. */
export async function call(path, { params, method = "GET", body, headers = {}, signal } = {}) {
  const sent = { ...headers };
  const current = token();
  if (current) sent.Authorization = `Bearer ${current}`;
  let response;
  try {
    response = await fetch(url(path, params), { method, body, headers: sent, signal,
                                                cache: "no-store" });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, `the broker does not answer (${err.message})`);
  }
  if (!response.ok) {
    let message = response.headers.get("X-Broker-Error");
    if (!message) message = (await response.text()).trim() || response.statusText;
    throw new ApiError(response.status, message);
  }
  return response;
}

/** The JSON of a GET (or another method). */
export async function json(path, options = {}) {
  return (await call(path, options)).json();
}

/** A JSON answer, or ``fallback`` when the route answers 404 (not served by this node). */
export async function optionalJson(path, fallback = null) {
  try {
    return await json(path);
  } catch (err) {
    if (err instanceof ApiError && (err.status === 404 || err.status === 403)) return fallback;
    throw err;
  }
}

/** An index as a BigInt (the API writes indexes of 2^53 and up as strings). */
export function big(value) {
  return BigInt(String(value));
}

const HEADER = 26;

/**
 * Frames (wire format: index u64, crc u32, type u16, topic u64, length u32, data; big
 * endian) → [{index: BigInt, type, topic: BigInt, data: Uint8Array}]. A torn trailing
 * frame is left out.
 */
export function decodeFrames(buffer) {
  const view = new DataView(buffer);
  const bytes = new Uint8Array(buffer);
  const messages = [];
  let at = 0;
  while (at + HEADER <= buffer.byteLength) {
    const length = view.getUint32(at + 22);
    if (at + HEADER + length > buffer.byteLength) break;
    messages.push({
      index: view.getBigUint64(at),
      type: view.getUint16(at + 12),
      topic: view.getBigUint64(at + 14),
      data: bytes.slice(at + HEADER, at + HEADER + length),
    });
    at += HEADER + length;
  }
  return messages;
}

/** A topic's messages: GET /messaging/messages (frames), ``params`` as the API takes them. */
export async function readMessages(params, signal) {
  const response = await call("/messaging/messages", { params, signal });
  return decodeFrames(await response.arrayBuffer());
}

/** When each message was appended: index (string) → ms since the epoch (or null). */
export async function timesOf(topic, first, last) {
  const times = new Map();
  let from = first;
  for (let round = 0; round < 100 && from <= last; round++) {
    const answer = await json("/messaging/times",
      { params: { topicID: topic, index: from, end: last + 1n } });
    const runs = answer.runs.map(([index, at]) => [big(index), at]);
    for (let i = 0; i < runs.length; i++) times.set(runs[i][0], runs[i][1]);
    times.runs = (times.runs || []).concat(runs);
    const through = big(answer.through);
    if (through < from) break;
    from = through + 1n;
  }
  return (index) => {
    let found = null;
    for (const [start, at] of times.runs || []) {
      if (start <= index) found = at;
      else break;
    }
    return found;
  };
}

/**
 * Server-Sent Events read over fetch(): calls ``onEvent({event, id, data})`` for each event
 * until the stream ends or ``signal`` aborts it.
 */
export async function readSse(path, params, signal, onEvent) {
  const response = await call(path, { params, signal, headers: { Accept: "text/event-stream" } });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    buffer = buffer.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event = { event: "message", id: null, data: [] };
      for (const line of block.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") event.event = value;
        else if (field === "id") event.id = value;
        else if (field === "data") event.data.push(value);
      }
      if (event.data.length || event.id !== null) {
        onEvent({ event: event.event, id: event.id, data: event.data.join("\n") });
      }
    }
  }
}

/** The topics of GET /messaging/topics. */
export async function topics() {
  return json("/messaging/topics");
}

/** The API's reference to a topic: its id, or a stream's name. */
export function topicParam(value) {
  return String(value).trim();
}
