// Showing message data and figures: text, pretty JSON or hex, chosen per message.

const strict = new TextDecoder("utf-8", { fatal: true });
const lenient = new TextDecoder("utf-8");
const encoder = new TextEncoder();
// Control characters other than tab, LF and CR mark binary data.
const CONTROL = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/;

/** "json", "text" or "hex": how ``bytes`` (a Uint8Array) reads best. */
export function detect(bytes) {
  let text;
  try {
    text = strict.decode(bytes);
  } catch {
    return "hex";
  }
  if (CONTROL.test(text)) return "hex";
  const start = text.trimStart()[0];
  if (start === "{" || start === "[") {
    try {
      JSON.parse(text);
      return "json";
    } catch {
      return "text";
    }
  }
  return "text";
}

/** ``bytes`` shown as ``mode`` ("auto", "text", "json", "hex"), at most ``max`` bytes. */
export function render(bytes, mode = "auto", max = 64 * 1024) {
  const shown = mode === "auto" ? detect(bytes) : mode;
  const cut = bytes.length > max ? bytes.subarray(0, max) : bytes;
  const more = bytes.length > max ? `\n… ${bytes.length - max} more bytes` : "";
  if (shown === "hex") return { mode: shown, text: hexdump(cut) + more };
  const text = lenient.decode(cut);
  if (shown === "json") {
    try {
      return { mode: shown, text: JSON.stringify(JSON.parse(text), null, 2) + more };
    } catch {
      return { mode: "text", text: text + more };
    }
  }
  return { mode: shown, text: text + more };
}

/** Offset, 16 bytes in hex, and their printable characters, per line. */
export function hexdump(bytes) {
  const lines = [];
  for (let at = 0; at < bytes.length; at += 16) {
    const row = bytes.subarray(at, at + 16);
    const hex = Array.from(row, (b) => b.toString(16).padStart(2, "0")).join(" ");
    const chars = Array.from(row, (b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : "."));
    lines.push(`${at.toString(16).padStart(6, "0")}  ${hex.padEnd(47)}  ${chars.join("")}`);
  }
  return lines.join("\n");
}

/** UTF-8 bytes of a string. */
export function utf8(text) {
  return encoder.encode(text);
}

/** Bytes of base64 text. */
export function fromBase64(text) {
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

/** 1536 → "1.5 KiB". */
export function size(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Number(n);
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${unit ? value.toFixed(1) : value} ${units[unit]}`;
}

/** ms since the epoch → local ISO-like time with milliseconds ("—" for null). */
export function time(ms) {
  if (ms === null || ms === undefined) return "—";
  const d = new Date(Number(ms));
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

/** A duration in ms → "850 ms", "12.3 s", "4 min", "2.5 h". */
export function duration(ms) {
  if (ms === null || ms === undefined) return "—";
  const v = Number(ms);
  if (v < 1000) return `${Math.round(v)} ms`;
  if (v < 60_000) return `${(v / 1000).toFixed(1)} s`;
  if (v < 3_600_000) return `${(v / 60_000).toFixed(1)} min`;
  if (v < 86_400_000) return `${(v / 3_600_000).toFixed(1)} h`;
  return `${(v / 86_400_000).toFixed(1)} d`;
}

/** A rate to show: "0", "3.5", "1,200". */
export function rate(v) {
  if (!v) return "0";
  return v < 10 ? v.toFixed(1) : Math.round(v).toLocaleString("en");
}
