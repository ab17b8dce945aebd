// mortred supervisor web UI: plain JavaScript, no build step.
// Talks to /api/v1/* with the bearer token kept in localStorage.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { token: localStorage.getItem("mortred.token") || "", catalog: [], logOffset: null, logServer: null };

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  if (body !== undefined) headers["Content-Type"] = "application/json; charset=utf-8";
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await resp.text();
  let doc;
  try { doc = JSON.parse(text); } catch (e) { doc = text; }
  if (resp.status === 401) { $("conn").textContent = "token required"; }
  return { status: resp.status, doc };
}

// A multipart/form-data POST (the browser writes the Content-Type and its boundary).
async function apiForm(path, form) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  const resp = await fetch(path, { method: "POST", headers, body: form });
  const text = await resp.text();
  let doc;
  try { doc = JSON.parse(text); } catch (e) { doc = text; }
  if (resp.status === 401) { $("conn").textContent = "token required"; }
  return { status: resp.status, doc };
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v); else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}

// -- servers ------------------------------------------------------------------------------
async function refreshServers() {
  const { status, doc } = await api("GET", "/api/v1/status");
  if (status !== 200) return;
  $("conn").textContent = "connected";
  const groups = {};
  for (const s of doc.servers) (groups[s.category || s.kind] ||= []).push(s);
  const root = $("servers");
  root.replaceChildren();
  for (const [category, servers] of Object.entries(groups)) {
    root.append(el("h3", {}, category));
    const table = el("table", {},
      el("tr", {}, ...["id", "state", "ready", "pid", "restarts", "last exit / error", ""].map((h) => el("th", {}, h))));
    // A model with replicas is one row for the id, then one row per replica (id@n).
    for (const s of servers.flatMap((g) => [g, ...(g.replicas || [])])) {
      const actions = el("td", {}, ...["start", "stop", "restart"].map((a) =>
        el("button", { "data-action": a, "data-id": s.id, onclick: () => act(s.id, a) }, a)));
      // A model (not a replica's row): a link that opens Try-it on it (#try=<id>).
      if (s.kind === "model" && servers.includes(s)) {
        actions.append(" ", el("a", { href: "#try=" + encodeURIComponent(s.id), class: "try-link", "data-try": s.id }, "try it"));
      }
      const last = s.error || (s.last_exit && s.last_exit.text) || "";
      table.append(el("tr", { "data-server": s.id },
        el("td", {}, s.id), el("td", { class: "state-" + s.state }, s.state),
        el("td", { class: "ready" }, s.ready ? "yes" : "no"), el("td", {}, s.pid || "-"),
        el("td", {}, s.restart_count), el("td", {}, last), actions));
    }
    root.append(table);
  }
  // The try-it form of a model that was not ready when it was picked, once it is.
  for (const s of doc.servers) tryForm.ready.set(s.id, !!s.ready);
  const stale = tryForm.model && (!tryForm.spec || tryForm.provisional) && !tryForm.loading;
  if (stale && tryForm.ready.get(tryForm.model)) loadTryForm(tryForm.model);
  const sel = $("log-server");
  if (!sel.options.length) {
    for (const s of doc.servers.flatMap((g) => [g, ...(g.replicas || [])])) {
      sel.append(el("option", { value: s.id }, s.id));
    }
    sel.dispatchEvent(new Event("change"));
  }
}

async function act(id, action) {
  await api("POST", `/api/v1/servers/${encodeURIComponent(id)}/${action}`);
  refreshServers();
}

// -- logs -----------------------------------------------------------------------------------
async function pollLogs() {
  const id = state.logServer;
  if (!id || !$("log-follow").checked) return;
  const q = state.logOffset === null ? "limit=200" : `offset=${state.logOffset}&limit=500`;
  const { status, doc } = await api("GET", `/api/v1/servers/${encodeURIComponent(id)}/logs?${q}`);
  if (status !== 200 || id !== state.logServer) return;
  const pre = $("logs");
  const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  if (doc.lines.length) pre.append(doc.lines.join("\n") + "\n");
  state.logOffset = doc.next_offset;
  if (atBottom) pre.scrollTop = pre.scrollHeight;
}

// -- try it ----------------------------------------------------------------------------------
async function loadCatalog() {
  const { status, doc } = await api("GET", "/api/v1/catalog");
  if (status !== 200) return;
  state.catalog = doc.servers.filter((e) => e.enabled !== false);
  const sel = $("try-model");
  sel.replaceChildren(...state.catalog.map((e) => el("option", { value: e.id }, `${e.id} (${e.category}${e.async_enabled ? ", async" : ""})`)));
  const wantedTry = state.tryWanted;
  state.tryWanted = null;
  if (wantedTry && state.catalog.some((e) => e.id === wantedTry)) sel.value = wantedTry;
  else if (wantedTry) $("try-state").textContent = `no model ${wantedTry} in the catalog`;
  sel.dispatchEvent(new Event("change"));
  const jsel = $("jobs-model");
  const wanted = jobs.server || state.jobsServer;
  jsel.replaceChildren(...state.catalog.filter((e) => e.async_enabled).map((e) => el("option", { value: e.id }, `${e.id} (${e.category})`)));
  if (wanted && state.catalog.some((e) => e.id === wanted && e.async_enabled)) jsel.value = wanted;
  if (jsel.value !== jobs.server) selectJobsServer(jsel.value);
}

// The address bar says what is open: #try=<id>&jobs=<id> (a link to reopen or share;
// never the token, which is removed once read).
function writeHash() {
  const params = new URLSearchParams();
  if (tryForm.model) params.set("try", tryForm.model);
  if (jobs.server) params.set("jobs", jobs.server);
  const hash = params.toString();
  history.replaceState(null, "", location.pathname + location.search + (hash ? "#" + hash : ""));
}

// Try-it on model `id` (a #try=<id> link followed): picked and scrolled to; an id not
// in the catalog is said so (as text), nothing else changes.
function openTry(id) {
  if (!state.catalog.length) { state.tryWanted = id; return; }  // loadCatalog picks it
  if (!state.catalog.some((e) => e.id === id)) {
    $("try-state").textContent = `no model ${id} in the catalog`;
    writeHash();
    return;
  }
  const sel = $("try-model");
  if (sel.value !== id) { sel.value = id; sel.dispatchEvent(new Event("change")); } else writeHash();
  const panel = $("try-panel");
  if (panel && panel.scrollIntoView) panel.scrollIntoView();
}

function fileToBase64(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).split(",")[1]);
    reader.onerror = reject;
    reader.readAsDataURL(file);
  });
}

// -- try it: a form from the model's OpenAPI document ---------------------------------------
// GET /api/v1/models/<id>/openapi.json is the model's own document: the `params` schema
// of its Request gives one control per input (text, number with bounds, select,
// checkbox, comma-separated lists, file pickers for an SDK model's Image/File inputs),
// defaults filled in, required inputs marked. A model declared with the SDK
// (info["x-mortred-model"]) is submitted as multipart/form-data (one part per file, the
// other inputs as text fields, "More params" as the `params` part); a built-in keeps
// the JSON envelope, its image picker filling `images`. Without a document (a model
// not ready yet) the panel is the plain one: an image and free params JSON.
// ready: the servers' readiness from the last status; a document fetched while its model
// was not ready (a model still loading describes no inputs) is used but not kept.
const tryForm = { docs: new Map(), model: null, spec: null, inputs: new Map(), run: null, turn: 0, blobs: [], loading: false, ready: new Map(), provisional: false };
const SCALARS = ["string", "integer", "number", "boolean"];
const isBlob = (v) => typeof Blob !== "undefined" && v instanceof Blob;
// "1 item", "3 items": counts in messages agree with their noun.
const plural = (n, one, many = one + "s") => `${n} ${Number(n) === 1 ? one : many}`;

// The control one input schema gets.
function controlOf(prop) {
  const items = prop.type === "array" ? (prop.items && typeof prop.items === "object" ? prop.items : {}) : null;
  const kind = (items || prop)["x-mortred-kind"];
  if (kind === "image" || kind === "file") return { type: "file", accept: kind === "image" ? "image/*" : "", multiple: !!items };
  if (items) return SCALARS.includes(items.type) ? { type: "list", item: items.type } : { type: "json" };
  if (Array.isArray(prop.enum) && prop.enum.length) return { type: "select" };
  if (prop.type === "boolean") return { type: "checkbox" };
  if (prop.type === "integer" || prop.type === "number") return { type: "number" };
  if (prop.type === "string") return { type: "text" };
  return { type: "json" };
}

// {sdk, title, description, fields: [{name, prop, required, control}]} of a document.
function formSpec(doc) {
  const schemas = (doc && doc.components && doc.components.schemas) || {};
  const request = schemas.Request && typeof schemas.Request === "object" ? schemas.Request : {};
  const params = (request.properties && request.properties.params) || {};
  const props = params.properties && typeof params.properties === "object" ? params.properties : {};
  const required = new Set(Array.isArray(params.required) ? params.required : []);
  const model = doc && doc.info && doc.info["x-mortred-model"];
  const sdk = !!model && typeof model === "object";
  // The declaration's order (the document's keys may be sorted), then any others.
  const declared = sdk && Array.isArray(model.inputs) ? model.inputs.map((i) => i && i.name) : [];
  const rank = (name) => { const at = declared.indexOf(name); return at < 0 ? declared.length : at; };
  const names = Object.keys(props).filter((n) => props[n] && typeof props[n] === "object");
  names.sort((a, b) => rank(a) - rank(b));
  return {
    sdk,
    title: sdk && typeof model.name === "string" ? model.name : "",
    description: sdk && typeof model.description === "string" ? model.description : String((doc && doc.info && doc.info.description) || ""),
    fields: names.map((name) => ({ name, prop: props[name], required: required.has(name), control: controlOf(props[name]) })),
  };
}

// What a field's hint says: its description, bounds, list size and default.
function fieldHint(f) {
  const p = f.prop, bits = [];
  if (typeof p.description === "string" && p.description) bits.push(p.description);
  const lo = p.minimum ?? (p.items && p.items.minimum), hi = p.maximum ?? (p.items && p.items.maximum);
  if (lo !== undefined || hi !== undefined) bits.push(`${lo ?? ""}…${hi ?? ""}`);
  if (f.control.type === "list") bits.push("comma-separated" + (p.maxItems ? `, at most ${p.maxItems}` : ""));
  if (f.control.type === "file" && f.control.multiple && p.maxItems) bits.push(`at most ${plural(p.maxItems, "file")}`);
  if (f.control.type === "text" && typeof p.minLength === "number" && p.minLength > 0) bits.push(`at least ${plural(p.minLength, "character")}`);
  if (p.default !== undefined && f.control.type !== "checkbox") bits.push(`default ${JSON.stringify(p.default)}`);
  return bits.join("; ");
}

function fieldControl(f) {
  const { prop, control } = f;
  const def = prop.default;
  const attrs = { name: f.name, "data-input": f.name, "data-control": control.type, class: "try-input" };
  if (f.required && control.type !== "checkbox") attrs.required = "";
  let input;
  if (control.type === "file") {
    input = el("input", { ...attrs, type: "file", ...(control.accept ? { accept: control.accept } : {}), ...(control.multiple ? { multiple: "" } : {}) });
  } else if (control.type === "select") {
    const blank = def === undefined ? [el("option", { value: "" }, "")] : [];
    input = el("select", attrs, ...blank, ...prop.enum.map((v, i) => el("option", { value: String(i) }, String(v))));
    const at = prop.enum.findIndex((v) => v === def);
    input.value = at >= 0 ? String(at) : "";
  } else if (control.type === "checkbox") {
    input = el("input", { ...attrs, type: "checkbox" });
    input.checked = def === true;
  } else if (control.type === "number") {
    const bounds = {};
    if (typeof prop.minimum === "number") bounds.min = String(prop.minimum);
    if (typeof prop.maximum === "number") bounds.max = String(prop.maximum);
    input = el("input", { ...attrs, ...bounds, type: "number", step: prop.type === "integer" ? "1" : "any" });
    input.value = typeof def === "number" ? String(def) : "";
  } else {
    const extra = {};
    if (control.type === "text" && typeof prop.minLength === "number") extra.minlength = String(prop.minLength);
    if (control.type === "text" && typeof prop.maxLength === "number") extra.maxlength = String(prop.maxLength);
    if (control.type === "list") extra.placeholder = "a, b, c";
    if (control.type === "json") extra.placeholder = "JSON";
    input = el("input", { ...attrs, ...extra, type: "text" });
    input.value = def === undefined || def === null ? ""
      : control.type === "text" ? String(def)
      : control.type === "list" && Array.isArray(def) ? def.join(", ") : JSON.stringify(def);
  }
  return input;
}

function fieldLabel(f, input) {
  const hint = fieldHint(f);
  return el("label", { class: "try-field" + (f.required ? " required" : ""), "data-field": f.name },
    el("span", { class: "field-name" }, f.name), ...(f.required ? [el("span", { class: "req", title: "required" }, "*")] : []),
    " ", input, ...(hint ? [" ", el("span", { class: "muted field-hint" }, hint)] : []));
}

// One field's value: {value} (absent when left empty), or {error}.
function readField(f, node) {
  const c = f.control, p = f.prop;
  if (c.type === "file") { const files = [...(node.files || [])]; return files.length ? { value: files } : {}; }
  if (c.type === "checkbox") return node.checked || p.default !== undefined || f.required ? { value: !!node.checked } : {};
  if (c.type === "select") return node.value === "" ? {} : { value: p.enum[Number(node.value)] };
  const text = String(node.value ?? "");
  if (c.type === "text") return text === "" ? {} : { value: text };
  if (!text.trim()) return {};
  const scalar = (t, type, where) => {
    if (type === "string") return { value: t };
    if (type === "boolean") return /^(true|false)$/i.test(t) ? { value: t.toLowerCase() === "true" } : { error: `${where}: true or false` };
    const n = Number(t);
    if (!Number.isFinite(n) || (type === "integer" && !Number.isInteger(n))) return { error: `${where}: must be ${type === "integer" ? "an integer" : "a number"}` };
    return { value: n };
  };
  if (c.type === "number") return scalar(text.trim(), p.type, f.name);
  if (c.type === "list") {
    const items = text.split(",").map((s) => s.trim()).filter((s) => s !== "");
    if (p.maxItems && items.length > p.maxItems) return { error: `${f.name}: at most ${plural(p.maxItems, "item")}` };
    const out = [];
    for (const [i, t] of items.entries()) {
      const r = scalar(t, c.item, `${f.name}[${i}]`);
      if (r.error) return r;
      out.push(r.value);
    }
    return out.length ? { value: out } : {};
  }
  try { return { value: JSON.parse(text) }; } catch (e) { return { error: `${f.name}: ${e.message}` }; }
}

// An example for a params JSON box, from the model's declared inputs (never a fixed
// guess such as {"timesteps": 10}, which most models refuse): up to two inputs that are
// no files, each with its default or a value of its type; "{}" for a model that
// declares none; a plain hint without a document.
const NO_EXAMPLE = "a JSON object";
function exampleValue(p) {
  if (p.default !== undefined && p.default !== null) return p.default;
  if (Array.isArray(p.enum) && p.enum.length) return p.enum[0];
  if (p.type === "integer" || p.type === "number") return typeof p.minimum === "number" ? p.minimum : 1;
  if (p.type === "boolean") return true;
  if (p.type === "array") return [];
  if (p.type === "string") return "text";
  return null;
}
function paramsExample(spec) {
  if (!spec) return NO_EXAMPLE;
  const example = {};
  for (const f of spec.fields) {
    if (f.control.type === "file") continue;
    example[f.name] = exampleValue(f.prop);
    if (Object.keys(example).length === 2) break;
  }
  return JSON.stringify(example);
}

// The model's OpenAPI document (kept once its model is ready), or null.
async function modelDoc(id) {
  const kept = tryForm.docs.get(id);
  if (kept) return kept;
  const r = await api("GET", `/api/v1/models/${encodeURIComponent(id)}/openapi.json`);
  if (r.status !== 200 || !r.doc || typeof r.doc !== "object") return null;
  if (tryForm.ready.get(id)) tryForm.docs.set(id, r.doc);
  return r.doc;
}

async function loadTryForm(id) {
  tryForm.model = id || null; tryForm.spec = null; tryForm.inputs = new Map(); tryForm.provisional = false;
  const fields = $("try-fields");
  fields.replaceChildren(); fields.setAttribute("data-model", id || ""); fields.setAttribute("data-kind", "");
  $("try-about").textContent = "";
  $("try-image-label").hidden = false;
  $("try-params").setAttribute("placeholder", NO_EXAMPLE);
  writeHash();
  if (!id) return;
  let doc = tryForm.docs.get(id);
  if (!doc) {
    tryForm.loading = true;
    let r;
    try { r = await api("GET", `/api/v1/models/${encodeURIComponent(id)}/openapi.json`); } finally { tryForm.loading = false; }
    if (tryForm.model !== id) return;
    if (r.status !== 200 || !r.doc || typeof r.doc !== "object") {
      $("try-about").textContent = `no form yet (the model's OpenAPI document: HTTP ${r.status})`;
      return;
    }
    doc = r.doc;
    if (tryForm.ready.get(id)) tryForm.docs.set(id, doc); else tryForm.provisional = true;
  }
  const spec = formSpec(doc);
  tryForm.spec = spec;
  $("try-params").setAttribute("placeholder", paramsExample(spec));
  for (const f of spec.fields) {
    const input = fieldControl(f);
    tryForm.inputs.set(f.name, input);
    fields.append(fieldLabel(f, input));
  }
  $("try-about").textContent = spec.sdk ? `${spec.title}: ${spec.description}` : spec.description;
  $("try-image-label").hidden = spec.sdk;  // an SDK model's files are fields of their own
  fields.setAttribute("data-kind", spec.sdk ? "sdk" : "builtin");
}

function resetTryOutput() {
  for (const url of tryForm.blobs.splice(0)) URL.revokeObjectURL(url);
  $("try-output").replaceChildren(); $("try-preview").replaceChildren();
  $("try-json").textContent = "";
  const bar = $("try-progress");
  bar.hidden = true; bar.setAttribute("max", "1"); bar.setAttribute("value", "0");
}

async function runTry(event) {
  event.preventDefault();
  // The latest submit owns the panel (even one refused in the page): an earlier one
  // whose answer comes back later (it was still in flight) must not take it back.
  const turn = ++tryForm.turn;
  const id = $("try-model").value;
  const mode = $("try-mode").value;
  const spec = tryForm.model === id ? tryForm.spec : null;
  const say = (text) => { $("try-state").textContent = text; };
  let params = {};
  const extra = $("try-params").value.trim();
  if (extra) {
    try { params = JSON.parse(extra); } catch (e) { return say("params: " + e.message); }
    if (!params || typeof params !== "object" || Array.isArray(params)) return say("params: expected a JSON object");
  }
  const values = {}, errors = [];
  for (const f of spec ? spec.fields : []) {
    if (f.name in params) continue;  // "More params" wins over the field
    const r = readField(f, tryForm.inputs.get(f.name));
    if (r.error) errors.push(r.error); else if (r.value !== undefined) values[f.name] = r.value;
  }
  if (errors.length) return say(errors.join("; "));
  resetTryOutput();
  const file = $("try-image").files[0];
  const sdk = !!(spec && spec.sdk);
  let submit;
  if (sdk) {
    const form = new FormData();
    for (const [name, v] of Object.entries(values)) {
      if (Array.isArray(v)) for (const item of v) isBlob(item) ? form.append(name, item, item.name || name) : form.append(name, String(item));
      else form.append(name, String(v));
    }
    if (Object.keys(params).length) form.append("params", JSON.stringify(params));
    const query = `?server_id=${encodeURIComponent(id)}` + (mode === "async" ? "&async=1" : "");
    submit = () => apiForm("/api/v1/infer" + query, form);
  } else {
    const body = { server_id: id, images: [file ? await fileToBase64(file) : btoa("mortred-ui")] };
    const merged = { ...values, ...params };
    if (extra || Object.keys(merged).length) body.params = merged;
    if (mode === "async") body.async = true;
    submit = () => api("POST", "/api/v1/infer", body);
  }
  const inputUrl = file && !sdk ? URL.createObjectURL(file) : null;
  if (inputUrl) tryForm.blobs.push(inputUrl);
  // later: loads of files a running job's events named (409 until it is done)
  const ctx = { server: id, blobs: tryForm.blobs, later: [] };
  tryForm.run = null;
  if (mode === "sync") {
    say("running…");
    const started = performance.now();
    const { status, doc } = await submit();
    if (tryForm.turn !== turn) return;
    say(`HTTP ${status} in ${Math.round(performance.now() - started)} ms`);
    return show(doc, inputUrl, ctx);
  }
  const { status, doc } = await submit();
  if (tryForm.turn !== turn) return;
  if (status !== 202 || !doc || typeof doc.job_id !== "string") { say(`submit: HTTP ${status}`); return show(doc, null, ctx); }
  $("try-form").setAttribute("data-last-job", doc.job_id);
  showTryStatus(doc);
  const job = await followTry(id, doc, ctx);
  if (!job || tryForm.run !== doc.job_id) return;
  if (job.state !== "done") return show(job, null, ctx);
  for (const load of ctx.later.splice(0)) load();
  const result = await api("GET", doc.result_url || jobsPath(id, doc.job_id, "/result"));
  if (tryForm.run !== doc.job_id) return;
  show(result.doc, inputUrl, ctx);
}

function showTryStatus(s) {
  const p = s.progress;
  const steps = p ? ` step ${p.step}/${p.total}` : "";
  $("try-state").textContent = `${s.job_id}: ${s.state} ${s.elapsed_ms ?? 0} ms${steps}` + (s.error ? ` ${s.error}` : "");
  const bar = $("try-progress");
  bar.hidden = false;
  if (p && Number(p.total) > 0) {
    bar.setAttribute("max", String(p.total));
    bar.setAttribute("value", String(s.state === "done" ? p.total : p.step));
  } else if (s.state === "done") bar.setAttribute("value", bar.getAttribute("max") || "1");
}

// The job's event stream (status events, the model's `preview`s and streamed
// `output`s) until its terminal event; polling /wait when there is no stream. The
// job's last status, or null after an error (shown).
async function followTry(server, submitted, ctx) {
  const jobId = submitted.job_id;
  tryForm.run = jobId;
  let last = submitted, ended = false;
  const ctrl = new AbortController();
  try {
    const headers = { Accept: "text/event-stream" };
    if (state.token) headers.Authorization = "Bearer " + state.token;
    const resp = await fetch(jobsPath(server, jobId, "/events"), { headers, signal: ctrl.signal, cache: "no-store" });
    if (resp.status === 200 && resp.body) {
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let outputs = 0;
      const parser = new SseParser((ev) => {
        if (tryForm.run !== jobId || ended) return;
        let data;
        try { data = JSON.parse(ev.data); } catch (e) { return; }
        if (ev.event === "output") {
          $("try-output").append(renderValue(data, ctx, `output ${outputs++}`));
        } else if (data && data.job_id === jobId && typeof data.state === "string") {
          last = data; showTryStatus(data);
          if (TERMINAL.includes(data.state)) ended = true;
        } else {  // a model event: `preview` (or any name the model emits); the latest shows
          $("try-preview").replaceChildren(renderValue(data, ctx, ev.event));
          $("try-preview").setAttribute("data-events", String(Number($("try-preview").getAttribute("data-events") || 0) + 1));
        }
      });
      while (!ended) {
        const { value, done } = await reader.read();
        if (done) break;
        parser.push(decoder.decode(value, { stream: true }));
      }
    }
  } catch (e) {
    // no stream (or it broke off): polling follows
  } finally {
    ctrl.abort();
  }
  if (tryForm.run !== jobId) return null;
  let job = last;
  while (!TERMINAL.includes(job.state)) {
    const r = await api("GET", `${submitted.poll_url || jobsPath(server, jobId)}/wait?timeout=500`);
    if (tryForm.run !== jobId) return null;
    if (r.status !== 200) { $("try-state").textContent = `poll: HTTP ${r.status}`; show(r.doc, null, ctx); return null; }
    job = r.doc;
    showTryStatus(job);
  }
  return job;
}

// -- outputs as they are ------------------------------------------------------------------
// A result file's description (sdk/outputs.py): {"name", "content_type", "size",
// "sha256"} and "url" (a stored file, fetched with the token) or "base64" (inline).
const isFileRef = (v) => !!v && typeof v === "object" && !Array.isArray(v) && typeof v.name === "string" &&
  typeof v.content_type === "string" && (typeof v.url === "string" || typeof v.base64 === "string");

function fileRefs(value, out = [], depth = 0) {
  if (depth > 8 || out.length >= 64) return out;
  if (isFileRef(value)) out.push(value);
  else if (Array.isArray(value)) for (const v of value) fileRefs(v, out, depth + 1);
  else if (value && typeof value === "object") for (const v of Object.values(value)) fileRefs(v, out, depth + 1);
  return out;
}

// Where a stored file is read: this origin's /api/v1/jobs/<id>/<job>/files/<name> only
// (the token goes with the request), from the URL a result or an event carries.
function fileUrl(ref, server) {
  const url = ref.url;
  if (typeof url !== "string") return null;
  if (/^\/api\/v1\/jobs\/[^/]+\/[A-Za-z0-9_-]+\/files\/[^/?#]+$/.test(url)) return url;
  const m = url.match(/^\/jobs\/([A-Za-z0-9_-]+)\/files\/([^/?#]+)$/);
  return m && server ? jobsPath(server, m[1], "/files/" + m[2]) : null;
}

const mediaType = (t) => (/^[a-z0-9.+-]+\/[a-z0-9.+-]+$/i.test(t) ? t : "application/octet-stream");

function fmtBytes(n) {
  if (typeof n !== "number" || !isFinite(n)) return "";
  return n < 1024 ? `${n} B` : n < 1 << 20 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / (1 << 20)).toFixed(1)} MiB`;
}

// GET a file with the token: {status, url} (a blob: URL, remembered in `blobs` to be
// revoked with the next run's output) or {status} when it is not there (404: gone
// with its job, or not stored).
async function fetchBlob(url, blobs) {
  const headers = {};
  if (state.token) headers.Authorization = "Bearer " + state.token;
  try {
    const resp = await fetch(url, { headers, cache: "no-store" });
    if (resp.status !== 200) return { status: resp.status };
    const blobUrl = URL.createObjectURL(await resp.blob());
    if (blobs) blobs.push(blobUrl);
    return { status: 200, url: blobUrl };
  } catch (e) {
    return { status: 0 };
  }
}

// One result file: an image in the grid, or a download link.
function renderFile(ref, ctx) {
  const type = mediaType(ref.content_type);
  const image = type.startsWith("image/");
  const size = fmtBytes(ref.size);
  const label = `${ref.name} (${type}${size ? ", " + size : ""})`;
  if (typeof ref.base64 === "string") {
    const src = `data:${type};base64,${ref.base64}`;
    if (image) return el("figure", { class: "result-file", "data-file": ref.name, "data-state": "loaded" },
      el("img", { src, alt: ref.name, class: "result-image" }), el("figcaption", {}, ref.name));
    return el("a", { href: src, download: ref.name, class: "result-download", "data-file": ref.name }, "download " + label);
  }
  const url = fileUrl(ref, ctx.server);
  if (!url) return el("span", { class: "file-missing", "data-file": ref.name }, `${ref.name}: not on this server`);
  if (image) {
    const caption = el("figcaption", {}, ref.name);
    const note = el("span", { class: "muted" });
    const fig = el("figure", { class: "result-file", "data-file": ref.name, "data-state": "loading" }, caption, note);
    const load = () => fetchBlob(url, ctx.blobs).then((r) => {
      if (r.url) {
        fig.prepend(el("img", { src: r.url, alt: ref.name, class: "result-image" }));
        note.textContent = ""; fig.setAttribute("data-state", "loaded");
      } else if (r.status === 409 && ctx.later) {  // a preview of a running job: served once it is done
        note.textContent = " (shown when the job is done)"; fig.setAttribute("data-state", "waiting");
        ctx.later.push(load);
      } else {
        note.replaceChildren(el("span", { class: "file-missing" }, ` (not available: HTTP ${r.status})`));
        fig.setAttribute("data-state", "missing");
      }
    });
    load();
    return fig;
  }
  const link = el("a", { href: "#", class: "result-download", "data-file": ref.name }, "download " + label);
  link.addEventListener("click", async (e) => {
    if (link.getAttribute("data-state") === "loaded") return;  // the blob: URL downloads itself
    e.preventDefault();
    const r = await fetchBlob(url, ctx.blobs);
    if (!r.url) { link.replaceChildren(`${label}: not available (HTTP ${r.status})`); link.setAttribute("data-state", "missing"); return; }
    link.setAttribute("href", r.url); link.setAttribute("download", ref.name); link.setAttribute("data-state", "loaded");
    link.click();
  });
  return link;
}

// A model event's or a streamed output's value: its files, else its JSON as text.
function renderValue(value, ctx, title) {
  const refs = fileRefs(value);
  const box = el("div", { class: "result-value" }, el("span", { class: "muted" }, title));
  if (refs.length) for (const ref of refs) box.append(renderFile(ref, ctx));
  else box.append(el("code", {}, JSON.stringify(value)));
  return box;
}

function show(doc, inputUrl, ctx = {}) {
  $("try-json").textContent = JSON.stringify(doc, (k, v) => (typeof v === "string" && v.length > 200 ? v.slice(0, 60) + "…" : v), 2);
  const out = $("try-output");
  out.replaceChildren();
  const data = doc && doc.data;
  if (data === undefined || data === null) return;
  const items = Array.isArray(data.results) ? data.results : [data];
  for (const item of items) {
    if (!item || typeof item !== "object") continue;
    if (Array.isArray(item.images)) {
      for (const b64 of item.images.filter(isBase64)) out.append(el("img", { src: "data:image/png;base64," + b64, class: "result-image" }));
    }
    if (isBase64(item.overlay)) out.append(el("img", { src: "data:image/png;base64," + item.overlay, class: "result-overlay" }));
    else if (Array.isArray(item.masks) && inputUrl) drawMasks(out, inputUrl, item);
    if (Array.isArray(item) && inputUrl && item.length && item.every((d) => d && Array.isArray(d.bbox))) drawBoxes(out, inputUrl, item);
    if (item.category !== undefined) out.append(el("p", { class: "result-class" }, `class: ${item.category} (${item.class_id})`));
  }
  for (const ref of fileRefs(data)) out.append(renderFile(ref, ctx));
}

function withImage(out, url, draw) {
  const img = new Image();
  img.onload = () => {
    const canvas = el("canvas", { class: "result-canvas" });
    canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
    const ctx = canvas.getContext("2d");
    ctx.drawImage(img, 0, 0);
    draw(ctx, canvas);
    out.append(canvas);
  };
  img.src = url;
}

function drawBoxes(out, url, detections) {
  withImage(out, url, (ctx) => {
    ctx.lineWidth = 2; ctx.font = "12px sans-serif";
    for (const d of detections) {
      const [x1, y1, x2, y2] = d.bbox;
      ctx.strokeStyle = "#ef4444"; ctx.strokeRect(x1, y1, x2 - x1, y2 - y1);
      ctx.fillStyle = "#ef4444"; ctx.fillText(`${d.category ?? d.class_id} ${(d.score ?? 0).toFixed(2)}`, x1 + 2, y1 + 12);
    }
  });
}

function drawMasks(out, url, item) {
  withImage(out, url, (ctx, canvas) => {
    const overlay = ctx.getImageData(0, 0, canvas.width, canvas.height);
    item.masks.forEach((m, i) => {
      const color = [(i * 97) % 256, (i * 57 + 80) % 256, (i * 151 + 40) % 256];
      const seg = m.segmentation;
      if (!seg || !Array.isArray(seg.counts)) return;
      const [h, w] = seg.size;
      let pos = 0, on = false;
      for (const run of seg.counts) {  // column-major uncompressed RLE
        if (on) for (let k = pos; k < pos + run; k++) {
          const x = Math.floor(k / h), y = k % h;
          if (x >= canvas.width || y >= canvas.height) continue;
          const o = (y * canvas.width + x) * 4;
          for (let c = 0; c < 3; c++) overlay.data[o + c] = (overlay.data[o + c] + color[c]) >> 1;
        }
        pos += run; on = !on;
      }
    });
    ctx.putImageData(overlay, 0, 0);
  });
}

// -- jobs page -----------------------------------------------------------------------------
// One model's jobs: a list (newest first), live progress from each active job's event
// stream, cancel, submit, and the result (images of generative/segmentation models).
// The stream is read with fetch() and a ReadableStream reader so that the token goes
// in the Authorization header (EventSource cannot send one; a token in the URL would
// end up in logs and history). Everything from the server reaches the page as text
// nodes or attributes, never as HTML.
const TERMINAL = ["done", "failed", "timeout", "cancelled"];
const MAX_STREAMS = 3;  // HTTP/1.1 allows ~6 connections per host: keep some for the API
const RECONNECT_MS = 2000;
const jobs = { server: null, rows: new Map(), streams: new Map(), tried: new Map(), inputs: new Map(), watch: new Set(), blobs: [] };

// Server-sent events parser (WHATWG HTML § 9.2.6): push() text as it arrives (any
// split), onEvent({event, data, id}) is called per dispatched record.
class SseParser {
  constructor(onEvent) {
    this.onEvent = onEvent; this.buffer = ""; this.data = []; this.event = ""; this.lastId = "";
    this.retry = null; this.sawCR = false; this.started = false;
  }
  push(text) {
    if (!this.started && text.length) { this.started = true; if (text.charCodeAt(0) === 0xfeff) text = text.slice(1); }
    if (this.sawCR && text.startsWith("\n")) text = text.slice(1);  // CRLF split across chunks
    this.sawCR = false;
    this.buffer += text;
    const lines = this.buffer.split(/\r\n|\r|\n/);
    this.buffer = lines.pop();
    if (this.buffer === "" && text.endsWith("\r")) this.sawCR = true;
    for (const line of lines) this.line(line);
  }
  line(line) {
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return;  // comment (heartbeat)
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    else if (field === "id" && !value.includes("\0")) this.lastId = value;
    else if (field === "retry" && /^\d+$/.test(value)) this.retry = Number(value);
  }
  dispatch() {
    const ev = { event: this.event || "message", data: this.data.join("\n"), id: this.lastId };
    const had = this.data.length > 0;
    this.data = []; this.event = "";
    if (had) this.onEvent(ev);
  }
}

const jobsPath = (server, jobId, part = "") =>
  `/api/v1/jobs/${encodeURIComponent(server)}` + (jobId ? `/${encodeURIComponent(jobId)}${part}` : "");

function fmtMs(ms) {
  if (typeof ms !== "number" || !isFinite(ms)) return "";
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`;
}

function jobRow(server, jobId) {
  const cells = {
    id: el("td", { class: "job-id" }, jobId),
    state: el("td", { class: "job-state" }),
    bar: el("progress", { class: "job-progress", max: "1", value: "0" }),
    steps: el("span", { class: "job-steps" }),
    queue: el("td", { class: "job-queue" }),
    elapsed: el("td", { class: "job-elapsed" }),
    cancel: el("button", { "data-cancel": jobId, onclick: () => cancelJob(server, jobId) }, "cancel"),
    result: el("button", { "data-result": jobId, onclick: () => showJobResult(server, jobId) }, "result"),
  };
  const row = el("tr", { "data-job": jobId, "data-events": "0" },
    cells.id, cells.state, el("td", { class: "job-bar" }, cells.bar, cells.steps), cells.queue,
    cells.elapsed, el("td", {}, cells.cancel, cells.result));
  row.cells_ = cells;
  row.status_ = null;
  return row;
}

// Shows one status in its row (creating the row at the top when new).
function renderJob(server, status) {
  if (!status || typeof status.job_id !== "string" || typeof status.state !== "string") return null;
  let row = jobs.rows.get(status.job_id);
  if (!row) {
    row = jobRow(server, status.job_id);
    jobs.rows.set(status.job_id, row);
    $("jobs-list").prepend(row);
  }
  const old = row.status_;
  if (old && TERMINAL.includes(old.state) && !TERMINAL.includes(status.state)) return row;  // stale
  row.status_ = status;
  row.receivedAt_ = Date.now();
  const c = row.cells_;
  const label = status.cancel_requested && !TERMINAL.includes(status.state) ? `${status.state} (cancelling)` : status.state;
  c.state.setAttribute("class", "job-state state-" + status.state.replace(/[^a-z]/g, ""));
  c.state.replaceChildren(label);
  if (status.error) c.state.append(el("span", { class: "job-error" }, String(status.error)));
  const p = status.progress;
  if (p && Number(p.total) > 0) {
    c.bar.setAttribute("max", String(p.total));
    c.bar.setAttribute("value", String(status.state === "done" ? p.total : p.step));
    c.steps.textContent = `${p.step}/${p.total}`;
  } else if (status.state === "done") {
    c.bar.setAttribute("max", "1"); c.bar.setAttribute("value", "1"); c.steps.textContent = "";
  } else if (status.state === "running") {
    c.bar.removeAttribute("value"); c.steps.textContent = "";  // running, no steps reported yet
  } else if (status.state === "pending") {
    c.bar.setAttribute("max", "1"); c.bar.setAttribute("value", "0"); c.steps.textContent = "queued";
  }
  c.queue.textContent = status.queue_position != null ? String(status.queue_position) : "";
  c.elapsed.textContent = fmtMs(status.elapsed_ms);
  c.cancel.disabled = TERMINAL.includes(status.state) || !!status.cancel_requested;
  c.result.disabled = status.state !== "done";
  if (status.state === "done" && (!old || old.state !== "done") && jobs.watch.has(status.job_id)) {
    jobs.watch.delete(status.job_id);
    showJobResult(server, status.job_id);
  }
  return row;
}

async function refreshJobs() {
  const server = jobs.server;
  if (!server) return;
  const filter = $("jobs-filter").value;
  const q = "limit=20" + (filter ? "&state=" + encodeURIComponent(filter) : "");
  const { status, doc } = await api("GET", `${jobsPath(server)}?${q}`);
  if (server !== jobs.server) return;
  if (status !== 200 || !doc || !Array.isArray(doc.jobs)) {
    $("jobs-state").textContent = `list: HTTP ${status}` + (doc && doc.error ? ` ${doc.error}` : "");
    return;
  }
  const keep = new Set();
  const ordered = [];
  for (const s of doc.jobs) {
    if (!s || typeof s.job_id !== "string") continue;
    keep.add(s.job_id);
    // A live stream is newer than a listing fetched meanwhile: let it update its row.
    const row = jobs.streams.has(s.job_id) ? jobs.rows.get(s.job_id) : renderJob(server, s);
    if (row) ordered.push(row);
  }
  for (const [id, row] of jobs.rows) {
    if (!keep.has(id) && !jobs.watch.has(id)) { jobs.rows.delete(id); stopStream(id); }
    else if (!keep.has(id)) ordered.unshift(row);
  }
  $("jobs-list").replaceChildren(...ordered);
  for (const s of doc.jobs) if (s && !TERMINAL.includes(s.state)) followJob(server, s.job_id);
  refreshQueue(server);
}

// The model's queue (GET /api/v1/queue/<id>): totals, then who holds it, as text.
async function refreshQueue(server) {
  const { status, doc } = await api("GET", `/api/v1/queue/${encodeURIComponent(server)}`);
  if (server !== jobs.server) return;
  if (status !== 200 || !doc || typeof doc.depth !== "number") {
    $("jobs-queue").textContent = status === 404 ? "" : `queue: HTTP ${status}`;
    return;
  }
  const callers = Array.isArray(doc.callers) ? doc.callers : [];
  const who = callers.slice(0, 8).map((c) =>
    `${c.caller || "(port)"} ${c.pending} waiting + ${c.running} running` +
    (c.max_pending ? ` (max ${c.max_pending})` : "")).join("; ");
  $("jobs-queue").textContent =
    `queue ${doc.depth}/${doc.max_queue}: ${doc.pending} waiting, ${doc.running} running, ` +
    `oldest wait ${fmtMs(doc.oldest_wait_ms)}` + (who ? ` | ${who}` : "") +
    (callers.length > 8 ? ` | +${callers.length - 8} more` : "");
}

function stopStream(jobId) {
  const ctrl = jobs.streams.get(jobId);
  if (ctrl) { ctrl.abort(); jobs.streams.delete(jobId); }
}

// Follows one job's event stream until it ends; the list refresh reopens a stream that
// ended while the job was still active (at most every RECONNECT_MS).
async function followJob(server, jobId) {
  if (jobs.streams.has(jobId) || jobs.streams.size >= MAX_STREAMS) return;
  const now = Date.now();
  if (now - (jobs.tried.get(jobId) || 0) < RECONNECT_MS) return;
  jobs.tried.set(jobId, now);
  const ctrl = new AbortController();
  jobs.streams.set(jobId, ctrl);
  const row = jobs.rows.get(jobId);
  if (row) row.setAttribute("data-live", "1");
  try {
    const headers = { Accept: "text/event-stream" };
    if (state.token) headers.Authorization = "Bearer " + state.token;
    const resp = await fetch(jobsPath(server, jobId, "/events"), { headers, signal: ctrl.signal, cache: "no-store" });
    if (resp.status !== 200 || !resp.body) {
      if (resp.status === 401) $("conn").textContent = "token required";
      return;
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    const parser = new SseParser((ev) => onJobEvent(server, jobId, ev));
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      parser.push(decoder.decode(value, { stream: true }));
    }
  } catch (e) {
    // aborted (model switched, row gone) or the connection dropped: nothing to show
  } finally {
    if (jobs.streams.get(jobId) === ctrl) jobs.streams.delete(jobId);
    const r = jobs.rows.get(jobId);
    if (r) r.setAttribute("data-live", "0");
  }
}

function onJobEvent(server, jobId, ev) {
  if (server !== jobs.server) return;
  let status;
  try { status = JSON.parse(ev.data); } catch (e) { return; }
  if (!status || status.job_id !== jobId) return;
  const row = renderJob(server, status);
  if (row) row.setAttribute("data-events", String(Number(row.getAttribute("data-events") || 0) + 1));
}

async function cancelJob(server, jobId) {
  const { status, doc } = await api("DELETE", jobsPath(server, jobId));
  if (status === 200 || status === 202) renderJob(server, doc);
  else $("jobs-state").textContent = `cancel ${jobId}: HTTP ${status}` + (doc && doc.error ? ` ${doc.error}` : "");
}

async function submitJob(event) {
  event.preventDefault();
  const server = jobs.server;
  if (!server) return;
  const file = $("jobs-image").files[0];
  const body = { server_id: server, async: true, images: [file ? await fileToBase64(file) : btoa("mortred-ui")] };
  const params = $("jobs-params").value.trim();
  if (params) {
    try { body.params = JSON.parse(params); } catch (e) { $("jobs-state").textContent = "params: " + e.message; return; }
  }
  const { status, doc } = await api("POST", "/api/v1/infer", body);
  if (status !== 202 || !doc || typeof doc.job_id !== "string") {
    $("jobs-state").textContent = `submit: HTTP ${status}` + (doc && doc.error ? ` ${doc.error}` : "");
    return;
  }
  $("jobs-state").textContent = `submitted ${doc.job_id}`;
  $("jobs-form").setAttribute("data-last-job", doc.job_id);
  jobs.watch.add(doc.job_id);
  if (file) jobs.inputs.set(doc.job_id, URL.createObjectURL(file));
  renderJob(server, doc);
  followJob(server, doc.job_id);
}

const isBase64 = (v) => typeof v === "string" && v.length > 0 && /^[A-Za-z0-9+/]+={0,2}$/.test(v);

// The base64 PNGs of a result's data (docs/models: diffusion `images` and
// `predicted_x0[].images`, SAM's `overlay` and PNG `segmentation`s), at most 16.
function resultImages(data) {
  const out = [];
  const items = data && Array.isArray(data.results) ? data.results : [data];
  for (const item of items) {
    if (!item || typeof item !== "object" || Array.isArray(item)) continue;
    if (Array.isArray(item.images)) out.push(...item.images.filter(isBase64));
    if (isBase64(item.overlay)) out.push(item.overlay);
    if (Array.isArray(item.masks)) for (const m of item.masks) if (m && isBase64(m.segmentation)) out.push(m.segmentation);
    if (Array.isArray(item.predicted_x0)) for (const s of item.predicted_x0) if (s && Array.isArray(s.images)) out.push(...s.images.filter(isBase64));
  }
  return out.slice(0, 16);
}

async function showJobResult(server, jobId) {
  const { status, doc } = await api("GET", jobsPath(server, jobId, "/result"));
  if (server !== jobs.server) return;
  $("jobs-result-title").textContent = `${jobId}: HTTP ${status}`;
  $("jobs-json").textContent = JSON.stringify(doc, (k, v) => (typeof v === "string" && v.length > 200 ? v.slice(0, 60) + "…" : v), 2);
  const out = $("jobs-output");
  out.replaceChildren();
  for (const url of jobs.blobs.splice(0)) URL.revokeObjectURL(url);
  const data = doc && doc.data;
  if (status !== 200 || !data) return;
  for (const b64 of resultImages(data)) out.append(el("img", { src: "data:image/png;base64," + b64, class: "result-image", alt: "result" }));
  for (const ref of fileRefs(data)) out.append(renderFile(ref, { server, blobs: jobs.blobs }));
  const input = jobs.inputs.get(jobId);
  const items = Array.isArray(data.results) ? data.results : [data];
  if (input) for (const item of items) if (item && Array.isArray(item.masks) && !item.overlay) drawMasks(out, input, item);
}

function selectJobsServer(server) {
  for (const id of [...jobs.streams.keys()]) stopStream(id);
  jobs.server = server || null;
  for (const url of jobs.inputs.values()) URL.revokeObjectURL(url);
  jobs.rows.clear(); jobs.tried.clear(); jobs.watch.clear(); jobs.inputs.clear();
  $("jobs-list").replaceChildren();
  $("jobs-output").replaceChildren(); $("jobs-json").textContent = ""; $("jobs-result-title").textContent = "";
  writeHash();
  $("jobs-params").setAttribute("placeholder", NO_EXAMPLE);
  if (jobs.server) {
    const chosen = jobs.server;
    modelDoc(chosen).then((doc) => {
      if (doc && jobs.server === chosen) $("jobs-params").setAttribute("placeholder", paramsExample(formSpec(doc)));
    });
  }
  refreshJobs();
}

// Elapsed time of active rows keeps counting between events.
function tickJobs() {
  const now = Date.now();
  for (const row of jobs.rows.values()) {
    const s = row.status_;
    if (s && !TERMINAL.includes(s.state) && typeof s.elapsed_ms === "number") {
      row.cells_.elapsed.textContent = fmtMs(s.elapsed_ms + (now - row.receivedAt_));
    }
  }
}

window.mortredUi = { SseParser, resultImages, renderJob, jobs, formSpec, readField, fileRefs, fileUrl, tryForm, paramsExample, plural };

// -- wiring ------------------------------------------------------------------------------------
// A link like http://host:8787/#token=... (as printed at start-up) signs in and is
// then removed from the address bar.
// A link like #jobs=DDPM opens that model's jobs, #try=SHARPEN Try-it on that model
// (the servers table links each model so); the address then follows both choices.
const hashParams = new URLSearchParams(location.hash.slice(1));
state.jobsServer = hashParams.get("jobs");
state.tryWanted = hashParams.get("try");
const hashToken = hashParams.get("token");
if (hashToken) {
  state.token = hashToken;
  localStorage.setItem("mortred.token", hashToken);
  history.replaceState(null, "", location.pathname);
}
$("token").value = state.token;
$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  state.token = $("token").value.trim();
  localStorage.setItem("mortred.token", state.token);
  refreshServers(); loadCatalog();
});
$("log-server").addEventListener("change", () => {
  state.logServer = $("log-server").value; state.logOffset = null; $("logs").textContent = "";
  pollLogs();
});
$("try-model").addEventListener("change", () => {
  const entry = state.catalog.find((e) => e.id === $("try-model").value);
  $("try-mode").querySelector('option[value="async"]').disabled = !(entry && entry.async_enabled);
  if (entry && !entry.async_enabled) $("try-mode").value = "sync";
  if ($("try-model").value !== tryForm.model) loadTryForm($("try-model").value);
});
$("try-form").addEventListener("submit", runTry);
window.addEventListener("hashchange", () => {
  const wanted = new URLSearchParams(location.hash.slice(1)).get("try");
  if (wanted) openTry(wanted);
});
$("jobs-model").addEventListener("change", () => selectJobsServer($("jobs-model").value));
$("jobs-filter").addEventListener("change", refreshJobs);
$("jobs-form").addEventListener("submit", submitJob);
refreshServers(); loadCatalog();
setInterval(refreshServers, 2000);
setInterval(pollLogs, 1000);
setInterval(refreshJobs, 3000);
setInterval(tickJobs, 500);
