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
    for (const s of servers) {
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
    for (const s of doc.servers) sel.append(el("option", { value: s.id }, s.id));
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
  while (!["done", "failed", "timeout"].includes(job.state)) {
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

// -- wiring ------------------------------------------------------------------------------------
// A link like http://host:8787/#token=... (as printed at start-up) signs in and is
// then removed from the address bar.
const hashToken = new URLSearchParams(location.hash.slice(1)).get("token");
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
refreshServers(); loadCatalog();
setInterval(refreshServers, 2000);
setInterval(pollLogs, 1000);
