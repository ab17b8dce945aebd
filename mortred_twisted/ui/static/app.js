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
      const last = s.error || (s.last_exit && s.last_exit.text) || "";
      table.append(el("tr", { "data-server": s.id },
        el("td", {}, s.id), el("td", { class: "state-" + s.state }, s.state),
        el("td", { class: "ready" }, s.ready ? "yes" : "no"), el("td", {}, s.pid || "-"),
        el("td", {}, s.restart_count), el("td", {}, last), actions));
    }
    root.append(table);
  }
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
  sel.dispatchEvent(new Event("change"));
  const jsel = $("jobs-model");
  const wanted = jobs.server || state.jobsServer;
  jsel.replaceChildren(...state.catalog.filter((e) => e.async_enabled).map((e) => el("option", { value: e.id }, `${e.id} (${e.category})`)));
  if (wanted && state.catalog.some((e) => e.id === wanted && e.async_enabled)) jsel.value = wanted;
  if (jsel.value !== jobs.server) selectJobsServer(jsel.value);
}

function fileToBase64(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).split(",")[1]);
    reader.onerror = reject;
    reader.readAsDataURL(file);
  });
}

async function runTry(event) {
  event.preventDefault();
  const id = $("try-model").value;
  const mode = $("try-mode").value;
  const file = $("try-image").files[0];
  const body = { server_id: id, images: [file ? await fileToBase64(file) : btoa("mortred-ui")] };
  const params = $("try-params").value.trim();
  if (params) {
    try { body.params = JSON.parse(params); } catch (e) { $("try-state").textContent = "params: " + e.message; return; }
  }
  $("try-output").replaceChildren();
  $("try-json").textContent = "";
  const inputUrl = file ? URL.createObjectURL(file) : null;
  if (mode === "sync") {
    $("try-state").textContent = "running…";
    const started = performance.now();
    const { status, doc } = await api("POST", "/api/v1/infer", body);
    $("try-state").textContent = `HTTP ${status} in ${Math.round(performance.now() - started)} ms`;
    return show(doc, inputUrl);
  }
  body.async = true;
  const { status, doc } = await api("POST", "/api/v1/infer", body);
  if (status !== 202) { $("try-state").textContent = `submit: HTTP ${status}`; return show(doc, null); }
  $("try-state").textContent = `${doc.job_id}: ${doc.state}`;
  let job = doc;
  while (!TERMINAL.includes(job.state)) {
    const r = await api("GET", `${doc.poll_url}/wait?timeout=500`);
    if (r.status !== 200) { $("try-state").textContent = `poll: HTTP ${r.status}`; return show(r.doc, null); }
    job = r.doc;
    const p = job.progress ? ` step ${job.progress.step}/${job.progress.total}` : "";
    $("try-state").textContent = `${job.job_id}: ${job.state} ${job.elapsed_ms ?? 0} ms${p}`;
  }
  if (job.state !== "done") return show(job, null);
  const result = await api("GET", doc.result_url);
  show(result.doc, inputUrl);
}

function show(doc, inputUrl) {
  $("try-json").textContent = JSON.stringify(doc, (k, v) => (typeof v === "string" && v.length > 200 ? v.slice(0, 60) + "…" : v), 2);
  const data = doc && doc.data;
  if (!data) return;
  const out = $("try-output");
  const items = Array.isArray(data.results) ? data.results : [data];
  for (const item of items) {
    if (item && Array.isArray(item.images)) {
      for (const b64 of item.images) out.append(el("img", { src: "data:image/png;base64," + b64, class: "result-image" }));
    }
    if (item && item.overlay) out.append(el("img", { src: "data:image/png;base64," + item.overlay, class: "result-overlay" }));
    else if (item && Array.isArray(item.masks) && inputUrl) drawMasks(out, inputUrl, item);
    if (Array.isArray(item) && inputUrl) drawBoxes(out, inputUrl, item);
    if (item && item.category !== undefined) out.append(el("p", { class: "result-class" }, `class: ${item.category} (${item.class_id})`));
  }
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
const jobs = { server: null, rows: new Map(), streams: new Map(), tried: new Map(), inputs: new Map(), watch: new Set() };

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
  const data = doc && doc.data;
  if (status !== 200 || !data) return;
  for (const b64 of resultImages(data)) out.append(el("img", { src: "data:image/png;base64," + b64, class: "result-image", alt: "result" }));
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
  if (jobs.server) history.replaceState(null, "", `${location.pathname}#jobs=${encodeURIComponent(jobs.server)}`);
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

window.mortredUi = { SseParser, resultImages, renderJob, jobs };

// -- wiring ------------------------------------------------------------------------------------
// A link like http://host:8787/#token=... (as printed at start-up) signs in and is
// then removed from the address bar.
// A link like #jobs=DDPM opens that model's jobs.
const hashParams = new URLSearchParams(location.hash.slice(1));
state.jobsServer = hashParams.get("jobs");
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
});
$("try-form").addEventListener("submit", runTry);
$("jobs-model").addEventListener("change", () => selectJobsServer($("jobs-model").value));
$("jobs-filter").addEventListener("change", refreshJobs);
$("jobs-form").addEventListener("submit", submitJob);
refreshServers(); loadCatalog();
setInterval(refreshServers, 2000);
setInterval(pollLogs, 1000);
setInterval(refreshJobs, 3000);
setInterval(tickJobs, 500);
