// The console's shell: the token, what its scopes allow, and the screen the URL's hash names.

import { ApiError, forgetToken, json, setToken, token } from "./api.js";
import { clear, h, status } from "./dom.js";
import * as topics from "./topics.js";
import * as messages from "./messages.js";
import * as tail from "./tail.js";
import * as publish from "./publish.js";
import * as consumers from "./consumers.js";
import * as cluster from "./cluster.js";

const SCREENS = { topics, messages, tail, publish, consumers, cluster };
const main = document.getElementById("main");
let unmount = null;
let caps = null;

/** What a whoami answer allows: read, write (publish), admin. */
function capabilities(who) {
  const kinds = new Set(who.scopes.map((scope) => scope.split("=")[0]));
  const admin = kinds.has("admin");
  return {
    name: who.name,
    auth: who.auth,
    scopes: who.scopes,
    read: admin || kinds.has("read"),
    write: admin || kinds.has("write"),
    admin,
  };
}

/** The hash route: "#/messages?topic=3" → ["messages", URLSearchParams]. */
function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [name, query] = hash.split("?");
  return [SCREENS[name] ? name : "topics", new URLSearchParams(query || "")];
}

/** Go to a screen with parameters. */
export function navigate(name, params = {}) {
  const query = new URLSearchParams(params).toString();
  location.hash = `#/${name}${query ? `?${query}` : ""}`;
}

function show() {
  if (unmount) unmount();
  unmount = null;
  if (!caps) return;
  const [name, params] = route();
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.screen === name);
  }
  clear(main);
  if (name === "publish" && !caps.write) {
    main.append(h("p", { class: "status error", text: "This token may not publish." }));
    return;
  }
  unmount = SCREENS[name].mount(main, { caps, params, navigate }) || null;
}

function loginForm(message) {
  clear(main);
  const input = h("input", { type: "password", id: "token", autocomplete: "off",
                             placeholder: "msg_…", size: 50, "aria-label": "token" });
  const line = h("p", { id: "login-status" });
  if (message) status(line, message, "error");
  const form = h("form", { id: "login", class: "card",
    onsubmit: (event) => {
      event.preventDefault();
      const value = input.value.trim();
      if (!value) return;
      setToken(value);
      start();
    } },
  h("h2", { text: "Token" }),
  h("p", { text: "This broker takes tokens. The token is kept in this tab only " +
                 "(sessionStorage) and sent in an Authorization header." }),
  input, " ", h("button", { type: "submit", text: "Open" }), line);
  main.append(form);
  input.focus();
}

async function start() {
  caps = null;
  let who;
  try {
    if (!token()) {  // ask for a token before a request the broker would refuse
      const config = await (await fetch("config.json", { cache: "no-store" })).json();
      if (config.auth) {
        loginForm("");
        return;
      }
    }
    who = await json("/messaging/whoami");
  } catch (err) {
    const had = Boolean(token());
    if (err instanceof ApiError && err.status === 401) {
      forgetToken();
      loginForm(had ? `The broker refused this token: ${err.message}` : "");
    } else if (err instanceof ApiError && err.status === 403) {
      forgetToken();
      loginForm(`This token may not read (the console needs a read scope): ${err.message}`);
    } else {
      clear(main).append(h("p", { class: "status error", text: `Cannot reach the broker: ${err.message}` }));
    }
    document.getElementById("logout").hidden = !token();
    return;
  }
  caps = capabilities(who);
  document.getElementById("who").textContent = caps.auth
    ? `${caps.name}: ${caps.scopes.join(" ")}` : "no tokens (loopback)";
  document.getElementById("nav-publish").hidden = !caps.write;
  document.getElementById("logout").hidden = !caps.auth;
  show();
}

document.getElementById("logout").addEventListener("click", () => {
  forgetToken();
  document.getElementById("who").textContent = "";
  if (unmount) unmount();
  unmount = null;
  start();
});
window.addEventListener("hashchange", show);
start();
