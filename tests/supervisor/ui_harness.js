// Runs the web UI's app.js under node with a tiny fake DOM and a scripted fetch, then
// prints what the page shows as JSON (used by test_ui_node.py; no browser needed).
"use strict";
const fs = require("fs");
const vm = require("vm");

class Node_ {
  constructor(tag) {
    this.tagName = tag; this.children = []; this.attrs = {}; this.listeners = {};
    this._text = ""; this.value = ""; this.checked = true; this.disabled = false;
    this.files = []; this.scrollTop = 0; this.clientHeight = 0; this.scrollHeight = 0;
  }
  get options() { return this.children.filter((c) => c.tagName === "option"); }
  setAttribute(k, v) { this.attrs[k] = String(v); if (k === "value") this.value = String(v); }
  getAttribute(k) { return this.attrs[k]; }
  removeAttribute(k) { delete this.attrs[k]; }
  // Server data must reach the page as text: any HTML parsing entry point fails the run.
  set innerHTML(v) { throw new Error("innerHTML used"); }
  set outerHTML(v) { throw new Error("outerHTML used"); }
  insertAdjacentHTML() { throw new Error("insertAdjacentHTML used"); }
  prepend(...items) { const before = this.children; this.children = []; this.append(...items); this.children.push(...before); }
  addEventListener(type, fn) { (this.listeners[type] ||= []).push(fn); }
  dispatchEvent(ev) { for (const fn of this.listeners[ev.type] || []) fn(ev); }
  append(...items) {
    for (const it of items) {
      if (it instanceof Node_) {
        this.children.push(it);
        if (this.tagName === "select" && this.children.filter((c) => c.tagName === "option").length === 1) this.value = it.value;
      } else this._text += String(it);
    }
  }
  replaceChildren(...items) { this.children = []; this._text = ""; this.append(...items); }
  get textContent() { return this._text + this.children.map((c) => c.textContent).join(""); }
  set textContent(v) { this.children = []; this._text = String(v); }
  querySelector(sel) {
    const m = sel.match(/^option\[value="(.*)"\]$/);
    return m ? this.options.find((o) => o.value === m[1]) || null : null;
  }
  getContext() { return { drawImage() {}, strokeRect() {}, fillText() {}, getImageData: () => ({ data: [] }), putImageData() {} }; }
}

const ids = {};
for (const id of ["conn", "token-form", "token", "servers", "log-server", "log-follow", "logs",
  "try-form", "try-model", "try-mode", "try-image", "try-params", "try-submit", "try-state",
  "try-output", "try-json", "jobs-model", "jobs-filter", "jobs-state", "jobs-form", "jobs-image",
  "jobs-params", "jobs-submit", "jobs-list", "jobs-result-title", "jobs-output", "jobs-json",
  "jobs-queue", "try-about", "try-image-label", "try-fields", "try-progress", "try-preview",
  "try-panel"]) {
  ids[id] = new Node_(["log-server", "try-model", "try-mode", "jobs-model", "jobs-filter"].includes(id) ? "select" : "div");
}
for (const v of ["", "pending,running"]) { const o = new Node_("option"); o.setAttribute("value", v); ids["jobs-filter"].append(o); }
for (const v of ["sync", "async"]) { const o = new Node_("option"); o.setAttribute("value", v); ids["try-mode"].append(o); }

const scripted = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
const calls = [];
async function fetch(path, opts) {
  const method = opts.method || "GET";
  const body = opts.body instanceof FormData_ ? { form: opts.body.parts } : opts.body || null;
  calls.push({ path, method, auth: opts.headers.Authorization || null, body,
    accept: opts.headers.Accept || null, contentType: opts.headers["Content-Type"] || null });
  const key = `${method} ${path.split("?")[0]}`;
  const answer = scripted[key] || { status: 404, body: { error: "not scripted: " + key } };
  const next = Array.isArray(answer) ? (answer.length > 1 ? answer.shift() : answer[0]) : answer;
  if (next.sse) {  // an event stream: its chunks are read one by one
    const chunks = next.sse.map((c) => new Uint8Array(Buffer.from(c)));
    return { status: next.status, body: { getReader: () => ({
      read: async () => (chunks.length ? { value: chunks.shift(), done: false } : { done: true }) }) } };
  }
  if (next.blob) return { status: next.status, blob: async () => new Blob_(next.blob) };
  return { status: next.status, text: async () => JSON.stringify(next.body) };
}

// FormData and File/Blob as the page uses them: parts recorded as [name, value, filename].
class Blob_ { constructor(content, name) { this.content = content; this.name = name; } }
class FormData_ {
  constructor() { this.parts = []; }
  append(name, value, filename) {
    this.parts.push(value instanceof Blob_ ? [name, { file: value.content }, filename] : [name, value]);
  }
}

const store = {};
const revoked = [];
// The address bar: the page's history.replaceState writes it (each write recorded),
// a followed link's hashchange is fired by the mode that needs it.
const addresses = [];
const windowListeners = {};
const location_ = { hash: scripted.hash || "#token=ui-token", pathname: "/", search: "" };
const sandbox = {
  document: { getElementById: (id) => ids[id], createElement: (t) => new Node_(t) },
  fetch, console, JSON, Promise, Math, Object, Array, String, Number, URLSearchParams,
  Event: class { constructor(type) { this.type = type; } },
  TextDecoder, AbortController, setTimeout,
  localStorage: { getItem: (k) => store[k] ?? null, setItem: (k, v) => { store[k] = v; } },
  location: location_,
  history: { replaceState(_s, _t, url) {
    addresses.push(url); const at = String(url).indexOf("#"); location_.hash = at < 0 ? "" : String(url).slice(at);
  } },
  addEventListener: (type, fn) => { (windowListeners[type] ||= []).push(fn); },
  setInterval: () => 0,
  performance: { now: () => 0 },
  btoa: (s) => Buffer.from(s).toString("base64"),
  URL: { createObjectURL: (b) => "blob:" + ((b && b.content) || "x"), revokeObjectURL(u) { revoked.push(u); } },
  FormData: FormData_, Blob: Blob_,
  Image: class { set src(v) { setTimeout(() => this.onload && this.onload(), 0); } },
  Node: Node_,
  FileReader: class { readAsDataURL() { this.result = "data:image/png;base64,QUJD"; setTimeout(() => this.onload(), 0); } },
};
sandbox.window = sandbox;
vm.createContext(sandbox);
vm.runInContext(fs.readFileSync(process.argv[2], "utf8"), sandbox);

// Every pending promise, I/O callback and timer the page set (FileReader, Image and the
// scripted fetches answer from timers): turns of setImmediate, then a timer, until
// nothing is left to run (bounded).
async function settle() {
  for (let round = 0; round < 10; round++) {
    for (let i = 0; i < 50; i++) await new Promise((r) => setImmediate(r));
    await new Promise((r) => setTimeout(r, 2));
  }
}

function tagsUnder(n) { return n.children.flatMap((c) => [c.tagName, ...tagsUnder(c)]); }

async function sseMode() {
  // The SSE parser on every two-chunk split and on one character at a time.
  const { SseParser, resultImages } = sandbox.mortredUi;
  const parse = (chunks) => { const out = []; const p = new SseParser((e) => out.push(e)); chunks.forEach((c) => p.push(c)); return out; };
  const text = scripted.sse_input;
  const splits = [];
  for (let i = 0; i <= text.length; i++) splits.push(parse([text.slice(0, i), text.slice(i)]));
  process.stdout.write(JSON.stringify({
    whole: parse([text]), splits, chars: parse([...text]),
    images: scripted.results.map((d) => resultImages(d).length) }));
}

async function jobsMode() {
  await settle();
  const rowInfo = () => ids["jobs-list"].children.map((r) => ({
    id: r.attrs["data-job"], events: Number(r.attrs["data-events"]), live: r.attrs["data-live"] || null,
    text: r.children.map((c) => c.textContent), bar: { value: r.cells_.bar.attrs.value ?? null, max: r.cells_.bar.attrs.max },
    cancelDisabled: r.cells_.cancel.disabled, resultDisabled: r.cells_.result.disabled, tags: tagsUnder(r) }));
  const listed = rowInfo();
  const row = ids["jobs-list"].children.find((r) => r.attrs["data-job"] === "job_b");
  row.cells_.cancel.dispatchEvent({ type: "click" });
  await settle();
  const afterCancel = rowInfo();
  ids["jobs-params"].value = '{"delay_ms": 10}';
  ids["jobs-form"].dispatchEvent({ type: "submit", preventDefault() {} });
  await settle();
  process.stdout.write(JSON.stringify({
    listed, afterCancel, final: rowInfo(), calls, jobsState: ids["jobs-state"].textContent,
    modelOptions: ids["jobs-model"].options.map((o) => o.value),
    outputs: ids["jobs-output"].children.map((c) => c.tagName + ":" + (c.attrs.src || "")),
    title: ids["jobs-result-title"].textContent, json: ids["jobs-json"].textContent,
    queue: ids["jobs-queue"].textContent }));
}

// A node as JSON: tag, attributes, value/checked/hidden, own text, children.
function desc(n) {
  return { tag: n.tagName, attrs: { ...n.attrs }, value: n.value, checked: n.checked, hidden: !!n.hidden,
    text: n.textContent, children: n.children.map(desc) };
}

// The try-it form: an SDK model's form filled and submitted async (multipart, the event
// stream's progress, preview and outputs, result files), then a built-in's, sync.
async function formMode() {
  await settle();
  const pick = async (id) => { ids["try-model"].value = id; ids["try-model"].dispatchEvent({ type: "change" }); await settle(); };
  const { tryForm } = sandbox.mortredUi;
  await pick(scripted.form.sdk);
  const sdkForm = { fields: desc(ids["try-fields"]), about: ids["try-about"].textContent,
    imageHidden: !!ids["try-image-label"].hidden, placeholder: ids["try-params"].attrs.placeholder };
  for (const [name, v] of Object.entries(scripted.form.sdk_values)) {
    const node = tryForm.inputs.get(name);
    if (v && v.files) node.files = v.files.map((f) => new Blob_(f, f + ".png")); else node.value = v;
  }
  ids["try-mode"].value = "async";
  ids["try-params"].value = scripted.form.sdk_params || "";
  ids["try-form"].dispatchEvent({ type: "submit", preventDefault() {} });
  await settle();
  const sdkRun = { state: ids["try-state"].textContent, output: desc(ids["try-output"]),
    preview: desc(ids["try-preview"]), progress: desc(ids["try-progress"]), json: ids["try-json"].textContent };
  await pick(scripted.form.builtin);
  const builtinForm = { fields: desc(ids["try-fields"]), imageHidden: !!ids["try-image-label"].hidden,
    placeholder: ids["try-params"].attrs.placeholder };
  for (const [name, v] of Object.entries(scripted.form.builtin_values)) {
    const node = tryForm.inputs.get(name);
    if (typeof v === "boolean") node.checked = v; else node.value = v;
  }
  ids["try-image"].files = [{ name: "x.png" }];
  ids["try-mode"].value = "sync";
  ids["try-params"].value = "";
  ids["try-form"].dispatchEvent({ type: "submit", preventDefault() {} });
  await settle();
  const builtinRun = { state: ids["try-state"].textContent, output: desc(ids["try-output"]) };
  // A bad list item is refused in the page, before any request.
  const before = calls.length;
  const bad = scripted.form.builtin_bad;
  if (bad) { tryForm.inputs.get(bad[0]).value = bad[1]; ids["try-form"].dispatchEvent({ type: "submit", preventDefault() {} }); await settle(); }
  process.stdout.write(JSON.stringify({ sdkForm, sdkRun, builtinForm, builtinRun, calls, revoked,
    badState: ids["try-state"].textContent, callsAfterBad: calls.length - before }));
}

// Links to Try-it: the page opened at #try=<id> picks that model; the servers table
// links each model; a followed link (hashchange) switches; an unknown id is said so;
// params placeholders come from each model's declared inputs.
async function linkMode() {
  await settle();
  const placeholder = (id) => ids[id].attrs.placeholder ?? null;
  const opened = { model: ids["try-model"].value, fields: ids["try-fields"].attrs["data-model"],
    tryPlaceholder: placeholder("try-params"), jobsPlaceholder: placeholder("jobs-params"),
    hash: location_.hash, state: ids["try-state"].textContent };
  const links = [];
  const walk = (n) => { if (n.tagName === "a" && n.attrs["data-try"]) links.push({ id: n.attrs["data-try"], href: n.attrs.href, text: n.textContent }); n.children.forEach(walk); };
  walk(ids.servers);
  const follow = async (hash) => {
    location_.hash = hash;
    for (const fn of windowListeners.hashchange || []) fn({ type: "hashchange" });
    await settle();
    const hints = [];
    const findHints = (n) => { if ((n.attrs.class || "").includes("field-hint")) hints.push(n.textContent); n.children.forEach(findHints); };
    findHints(ids["try-fields"]);
    return { model: ids["try-model"].value, fields: ids["try-fields"].attrs["data-model"],
      tryPlaceholder: placeholder("try-params"), hash: location_.hash, state: ids["try-state"].textContent, hints };
  };
  const followed = await follow(scripted.follow);
  const unknown = await follow(scripted.unknown);
  const { paramsExample, formSpec, plural } = sandbox.mortredUi;
  process.stdout.write(JSON.stringify({ opened, links, followed, unknown, addresses,
    examples: (scripted.example_docs || []).map((d) => paramsExample(formSpec(d))),
    noDoc: paramsExample(null), plurals: [plural(1, "item"), plural(2, "item"), plural(1, "character"), plural(0, "file")] }));
}

(async () => {
  if (process.argv[4] === "link") return linkMode();
  if (process.argv[4] === "form") return formMode();
  if (process.argv[4] === "sse") return sseMode();
  if (process.argv[4] === "jobs") return jobsMode();
  await settle();
  const rows = [];
  const walk = (n) => { if (n.tagName === "tr" && n.attrs["data-server"]) rows.push({ id: n.attrs["data-server"], text: n.children.map((c) => c.textContent) }); n.children.forEach(walk); };
  walk(ids.servers);
  const headings = ids.servers.children.filter((c) => c.tagName === "h3").map((c) => c.textContent);
  // Click "restart" on the first server row.
  let restart = null;
  const findBtn = (n) => { if (n.tagName === "button" && n.attrs["data-action"] === "restart" && !restart) restart = n; n.children.forEach(findBtn); };
  findBtn(ids.servers);
  restart.dispatchEvent({ type: "click" });
  await settle();
  // Try-it: sync first when the scenario asks for it (detections / masks on the input).
  if (process.argv[4] === "sync") {
    ids["try-model"].value = "FAKE_ASYNC";
    ids["try-mode"].value = "sync";
    ids["try-image"].files = [{ name: "x.png" }];
    ids["try-form"].dispatchEvent({ type: "submit", preventDefault() {} });
    await settle();
    await new Promise((r) => setTimeout(r, 20));
    process.stdout.write(JSON.stringify({
      outputs: ids["try-output"].children.map((c) => c.tagName + ":" + (c.attrs.class || "")),
      calls, state: ids["try-state"].textContent }));
    return;
  }
  // Try-it, async.
  ids["try-model"].value = "FAKE_ASYNC";
  ids["try-mode"].value = "async";
  ids["try-params"].value = '{"delay_ms": 10}';
  ids["try-form"].dispatchEvent({ type: "submit", preventDefault() {} });
  await settle();
  process.stdout.write(JSON.stringify({
    rows, headings, logs: ids.logs.textContent, state: ids["try-state"].textContent,
    json: ids["try-json"].textContent, outputs: ids["try-output"].children.map((c) => c.tagName),
    calls, token: store["mortred.token"],
    modelOptions: ids["try-model"].options.map((o) => o.value),
  }));
})().catch((e) => { console.error(e); process.exit(1); });
