"use strict";
// One websocket (/chat/ws); the database is the history, so this page keeps nothing that
// matters: a message not yet accepted is resent with the same client_id after a reconnect,
// which the server records only once.
const $ = (id) => document.getElementById(id);
const state = {
  name: localStorage.getItem("superagent.name") || "admin",
  thread: decodeURIComponent(location.hash.slice(1)) || null,
  ws: null,
  ready: false,
  retry: 0,
  lastError: "",
  pending: new Map(), // client_id -> say frame, until accepted (or refused)
  held: [], // said in a new conversation before it had an id: sent once it has one
  shown: new Map(), // message id or client_id -> element, in the current conversation
};

function newId() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  bytes[6] = (bytes[6] & 0x0f) | 0x40;
  bytes[8] = (bytes[8] & 0x3f) | 0x80;
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

function status(text, bad) {
  $("status").textContent = text;
  $("status").className = bad ? "bad" : "";
}

function note(text, bad) {
  const el = document.createElement("div");
  el.className = "note" + (bad ? " bad" : "");
  el.textContent = text;
  $("messages").appendChild(el);
  el.scrollIntoView({block: "end"});
  return el;
}

function bubble(role, author, text, at) {
  const el = document.createElement("div");
  el.className = `msg ${role}`;
  if (at) el.dataset.at = at;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = author + (at ? " · " + new Date(at).toLocaleTimeString() : "");
  el.appendChild(who);
  // The agent writes Markdown; what a person typed is shown as they typed it.
  el.appendChild(role === "person" ? document.createTextNode(text) : markdown(text));
  return el;
}

// The Markdown the agent's replies use: fenced code blocks, `code`, **bold** and links.
// Built as DOM nodes whose text is set as text, never parsed as HTML: nothing in a message
// can become markup, whatever it holds.
function markdown(text) {
  const out = document.createDocumentFragment();
  // Odd parts are the fenced blocks' contents (the language after the fence is dropped).
  text.split(/```[^\n]*\n?([\s\S]*?)```/).forEach((part, i) => {
    if (i % 2) {
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      code.textContent = part.replace(/\n$/, "");
      pre.appendChild(code);
      out.appendChild(pre);
    } else {
      inline(part, out);
    }
  });
  return out;
}

const INLINE = /`([^`\n]+)`|\*\*([^*\n]+)\*\*|\[([^\]\n]+)\]\((https?:\/\/[^)\s]+)\)|(https?:\/\/[^\s<>()]*[^\s<>().,;:!?'"])/g;

function inline(text, into) {
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    into.appendChild(document.createTextNode(text.slice(last, m.index)));
    let el;
    if (m[1] !== undefined) {
      el = document.createElement("code");
      el.textContent = m[1];
    } else if (m[2] !== undefined) {
      el = document.createElement("strong");
      el.textContent = m[2];
    } else {
      el = document.createElement("a");
      el.href = m[4] || m[5];  // http(s) only: the pattern admits nothing else
      el.textContent = m[3] || m[5];
      el.rel = "noopener noreferrer";
      el.target = "_blank";
    }
    into.appendChild(el);
    last = m.index + m[0].length;
  }
  into.appendChild(document.createTextNode(text.slice(last)));
}

function place(el) {
  // In time order: a message may arrive after a later one was shown.
  const box = $("messages");
  const at = el.dataset.at;
  let before = null;
  if (at) {
    for (const other of box.querySelectorAll(".msg[data-at]")) {
      if (other.dataset.at > at) { before = other; break; }
    }
  }
  if (!before) before = box.querySelector(".note.waiting");
  box.insertBefore(el, before);
  el.scrollIntoView({block: "nearest"});
}

function showMessage(f) {
  if (f.thread !== state.thread || state.shown.has(f.id)) return;
  const el = bubble(f.role, f.role === "agent" ? "agent" : f.author, f.text, f.at);
  const mine = f.client_id && state.shown.get(f.client_id);
  if (mine) mine.remove();
  state.shown.set(f.id, el);
  place(el);
  if (f.role === "agent") for (const w of $("messages").querySelectorAll(".note.waiting")) w.remove();
}

function send(frame) {
  if (state.ws && state.ready) state.ws.send(JSON.stringify(frame));
}

function showThread(thread) {
  state.held = [];
  if (state.thread && state.thread !== thread) send({type: "unwatch", thread: state.thread});
  state.thread = thread;
  state.shown = new Map();
  $("messages").replaceChildren();
  history.replaceState(null, "", thread ? "#" + encodeURIComponent(thread) : location.pathname);
  for (const b of $("thread-list").children) b.classList.toggle("current", b.dataset.thread === thread);
  if (thread) send({type: "watch", thread});
  else note("A new conversation: say what you need.");
  $("text").focus();
}

async function loadThreads() {
  const response = await fetch(`/chat/api/threads?name=${encodeURIComponent(state.name)}`, {credentials: "same-origin"});
  if (response.status === 401) return signIn((await response.json()).error?.message);
  if (!response.ok) return status(`conversations unavailable (${response.status})`, true);
  const list = $("thread-list");
  list.replaceChildren();
  for (const t of (await response.json()).threads) {
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.thread = t.thread;
    b.textContent = t.title;
    b.title = `${t.title}\n${t.thread} · ${new Date(t.last_at).toLocaleString()}`;
    b.classList.toggle("current", t.thread === state.thread);
    b.onclick = () => showThread(t.thread);
    list.appendChild(b);
  }
}

function signIn(message) {
  if (state.ws) { state.ws.onclose = null; state.ws.close(); state.ws = null; }
  $("chat").hidden = true;
  $("signin").hidden = false;
  status("signed out", true);
  $("signin-error").textContent = message || "";
  $("signin-error").hidden = !message;
  $("token").focus();
}

$("signin").onsubmit = async (event) => {
  event.preventDefault();
  const response = await fetch("/chat/session", {
    method: "POST", credentials: "same-origin",
    headers: {"Content-Type": "application/json"},
    body: JSON.stringify({token: $("token").value}),
  });
  if (!response.ok) {
    $("signin-error").textContent = (await response.json()).error?.message || `refused (${response.status})`;
    $("signin-error").hidden = false;
    return;
  }
  $("token").value = "";
  $("signin").hidden = true;
  $("chat").hidden = false;
  connect();
};

function onFrame(f) {
  if (f.type === "ready") {
    state.ready = true;
    state.retry = 0;
    status(`connected as ${f.name}`);
    if (state.thread) send({type: "watch", thread: state.thread});
    for (const frame of state.pending.values()) send(frame);
    loadThreads();
  } else if (f.type === "accepted") {
    const said = state.pending.get(f.client_id);
    state.pending.delete(f.client_id);
    if (said && said.thread === null && state.thread === null) {
      state.thread = f.thread;
      history.replaceState(null, "", "#" + encodeURIComponent(f.thread));
      for (const n of $("messages").querySelectorAll(".note")) n.remove();
      for (const frame of state.held.splice(0)) {
        frame.thread = f.thread;
        state.pending.set(frame.client_id, frame);
        send(frame);
      }
    }
    if (f.thread === state.thread) {
      if (f.route === "dropped") note(`The agent will not act on this: ${f.reason}`, true);
      else if (!f.duplicate) note("waiting for the agent…").classList.add("waiting");
    }
    loadThreads();
  } else if (f.type === "message") {
    showMessage(f);
  } else if (f.type === "error") {
    if (f.client_id && state.pending.has(f.client_id)) {
      state.pending.delete(f.client_id);
      const el = state.shown.get(f.client_id);
      if (el) el.classList.replace("pending", "failed");
    }
    state.lastError = f.message;
    note(f.message, true);
  }
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${scheme}//${location.host}/chat/ws?name=${encodeURIComponent(state.name)}`);
  state.ws = ws;
  state.ready = false;
  ws.onmessage = (event) => onFrame(JSON.parse(event.data));
  ws.onclose = (event) => {
    if (state.ws !== ws) return;
    state.ready = false;
    if (event.code === 1008) return signIn(state.lastError || event.reason);
    if (event.code === 4404 || event.code === 4400) return status(event.reason || "refused", true);
    const wait = Math.min(30, 2 ** state.retry++) * (0.8 + Math.random() * 0.4);
    status(`disconnected; reconnecting in ${Math.round(wait)}s`, true);
    setTimeout(() => { if (state.ws === ws) connect(); }, wait * 1000);
  };
}

function say() {
  const text = $("text").value;
  if (!text.trim()) return;
  const frame = {type: "say", thread: state.thread, text, client_id: newId()};
  const opening = state.thread === null && [...state.pending.values()].some((p) => p.thread === null);
  const el = bubble("person", state.name, text, null);
  el.classList.add("pending");
  state.shown.set(frame.client_id, el);
  $("messages").appendChild(el);
  el.scrollIntoView({block: "end"});
  $("text").value = "";
  $("send").disabled = true;
  if (opening) return state.held.push(frame); // one new conversation, not two
  state.pending.set(frame.client_id, frame);
  send(frame); // or, when disconnected, on the next "ready"
}

$("composer").onsubmit = (event) => { event.preventDefault(); say(); };
$("text").oninput = () => { $("send").disabled = !$("text").value.trim(); };
$("text").onkeydown = (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) { event.preventDefault(); say(); }
};
$("new-thread").onclick = () => showThread(null);
$("name").value = state.name;
$("name").onchange = () => {
  state.name = $("name").value.trim() || "admin";
  $("name").value = state.name;
  localStorage.setItem("superagent.name", state.name);
  if (state.ws) { state.ws.onclose = null; state.ws.close(); }
  connect();
};
window.onhashchange = () => {
  const thread = decodeURIComponent(location.hash.slice(1)) || null;
  if (thread !== state.thread) showThread(thread);
};

showThread(state.thread);
connect();
