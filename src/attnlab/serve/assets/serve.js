// The explorer's page: asks the JSON API (app.py) and draws what it answers. Token text is
// written through textContent only, never as HTML; maps are drawn on canvases, so a long
// text's map costs one image, not a table of T x S cells.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const ACCENT = [33, 102, 172], BACK = [214, 96, 77];
  const state = {
    info: null, text: null, tokens: [], ids: [], statistics: {}, off: new Set(),
    selected: null, baseline: null, prediction: null, map: null, generated: [], step: null, image: null,
    imageBytes: null,
  };

  // --- helpers ----------------------------------------------------------------
  function decode(b64) {  // base64 little-endian uint16 -> [0, 1] floats
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const words = new Uint16Array(bytes.buffer);
    const out = new Float32Array(words.length);
    for (let i = 0; i < words.length; i++) out[i] = words[i] / 65535;
    return out;
  }
  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = !message;
  }
  async function call(path, body, raw) {
    const options = { method: body === undefined ? "GET" : "POST", headers: {} };
    if (body !== undefined) {
      options.body = raw ? body : JSON.stringify(body);
      options.headers["Content-Type"] = raw ? "application/octet-stream" : "application/json";
    }
    const response = await fetch(path, options);
    let answer;
    try { answer = await response.json(); } catch (e) { answer = { error: "the server answered " + response.status }; }
    if (!response.ok) { showError(answer.error || ("error " + response.status)); throw new Error(answer.error); }
    showError("");
    return answer;
  }
  function offList() { return Array.from(state.off); }
  function span(text, className) {
    const s = document.createElement("span");
    if (className) s.className = className;
    s.textContent = text;
    return s;
  }
  function heat(value, rgb) {
    const a = Math.max(0, Math.min(1, value));
    return "rgba(" + rgb.join(",") + "," + a.toFixed(3) + ")";
  }
  function format(value) { return value === null || value === undefined ? "n/a" : Number(value).toFixed(3); }

  // --- start --------------------------------------------------------------------
  async function start() {
    const info = await call("api/info");
    state.info = info;
    const heads = Math.max.apply(null, info.heads);
    $("model-line").textContent = info.model + ": " + info.kind + ", " + info.layers + " layers x " + heads + " heads";
    if (info.kind === "image") {
      $("text-input").hidden = true;
      $("image-input").hidden = false;
      $("image-note").textContent = "PNG or JPEG, at most " + Math.round(info.max_image_bytes / 1048576) + " MB";
      $("image").addEventListener("change", uploadImage);
    } else {
      $("limits-note").textContent = "at most " + info.max_tokens + " tokens";
      $("run").addEventListener("click", () => show());
      info.methods.forEach((m) => { const o = document.createElement("option"); o.value = m; o.textContent = m; $("method").appendChild(o); });
      $("method").addEventListener("change", describeFaithfulness);
      $("explain").addEventListener("click", explain);
      $("patch").addEventListener("click", patch);
      $("next-token").addEventListener("click", nextToken);
      $("reset-generation").addEventListener("click", () => { state.generated = []; state.step = null; drawGeneration(); });
      describeFaithfulness();
    }
    $("statistic").addEventListener("change", drawGrid);
    $("all-on").addEventListener("click", () => { state.off.clear(); refresh(); });
    $("show-rows").addEventListener("click", () => loadMap(Number($("row-start").value)));
    $("show-pooled").addEventListener("click", () => loadMap(null));
    $("map").addEventListener("mousemove", hoverMap);
    if (info.kind !== "image") show();
  }

  // --- a text's view ----------------------------------------------------------------
  async function show() {
    const text = $("text").value;
    if (text !== state.text) {  // a new text: its prediction with every head on is the baseline
      const base = await call("api/view", { text: text, off: [] });
      state.text = text;
      state.baseline = base;
      state.generated = [];
      state.step = null;
      if (!state.selected) state.selected = { layer: state.info.layers, head: 1 };
    }
    await refresh();
  }

  async function refresh() {
    if (state.info.kind === "image") { if (state.imageBytes) await viewImage(); return; }
    let view = state.baseline;
    if (state.off.size) {
      const track = state.baseline.prediction ? state.baseline.prediction.top.map((t) => t.id) : [];
      view = await call("api/view", { text: state.text, off: offList(), track: track });
    }
    state.tokens = view.tokens;
    state.ids = view.ids;
    state.statistics = view.statistics;
    state.prediction = view.prediction;
    drawTokens();
    fillStatistics();
    drawGrid();
    drawPrediction();
    ["tokens-section", "grid-section", "map-section", "explain-section"].forEach((id) => { $(id).hidden = false; });
    $("prediction-section").hidden = !view.prediction;
    $("patch-section").hidden = !state.info.can_patch;
    $("generate-section").hidden = state.info.kind !== "decoder";
    drawGeneration();
    await loadMap(state.map && state.map.kind === "rows" ? state.map.row_edges[0] : null);
  }

  function drawTokens() {
    const strip = $("tokens");
    strip.textContent = "";
    state.tokens.forEach((token, i) => {
      const s = span(token, "token");
      s.title = "position " + i;
      strip.appendChild(s);
    });
  }

  function fillStatistics() {
    const select = $("statistic");
    const names = Object.keys(state.statistics);
    const current = select.value;
    if (select.options.length !== names.length) {
      select.textContent = "";
      names.forEach((n) => { const o = document.createElement("option"); o.value = n; o.textContent = n; select.appendChild(o); });
      const preferred = ["induction", "normalized_entropy", names[0]].find((n) => names.includes(n));
      select.value = names.includes(current) ? current : preferred;
    }
  }

  function drawGrid() {
    const grid = $("head-grid");
    const name = $("statistic").value;
    const table = state.statistics[name] || [];
    const heads = Math.max.apply(null, state.info.heads);
    let lo = Infinity, hi = -Infinity;
    table.forEach((row) => row.forEach((v) => { if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); } }));
    grid.textContent = "";
    grid.style.gridTemplateColumns = "34px repeat(" + heads + ", 28px)";
    grid.appendChild(span("", "axis"));
    for (let h = 1; h <= heads; h++) grid.appendChild(span("H" + h, "axis"));
    state.info.heads.forEach((count, l) => {
      grid.appendChild(span("L" + (l + 1), "axis"));
      for (let h = 1; h <= heads; h++) {
        const cell = document.createElement("div");
        if (h > count) { grid.appendChild(cell); continue; }
        const key = (l + 1) + ":" + h;
        const value = table[l] ? table[l][h - 1] : null;
        cell.className = "cell" + (state.off.has(key) ? " off" : "") +
          (state.selected && state.selected.layer === l + 1 && state.selected.head === h ? " selected" : "");
        cell.dataset.head = key;
        cell.style.background = value === null ? "#f3f4f6" : heat(hi > lo ? (value - lo) / (hi - lo) : 0.5, ACCENT);
        cell.title = "layer " + (l + 1) + ", head " + h + ": " + name + " = " + format(value);
        cell.addEventListener("mouseenter", () => { $("grid-hover").textContent = cell.title; });
        cell.addEventListener("click", (event) => clickHead(l + 1, h, event.shiftKey || $("switch-mode").checked));
        grid.appendChild(cell);
      }
    });
    $("off-list").textContent = state.off.size ? "Off: " + offList().join(", ") : "";
  }

  async function clickHead(layer, head, toggle) {
    if (toggle) {
      const key = layer + ":" + head;
      if (state.off.has(key)) state.off.delete(key); else state.off.add(key);
      await refresh();
    } else {
      state.selected = { layer: layer, head: head };
      drawGrid();
      if (state.info.kind === "image") drawImage(); else { await loadMap(null); drawAttended(); }
    }
  }

  // --- prediction -----------------------------------------------------------------------
  function drawPrediction() {
    const table = $("prediction");
    table.textContent = "";
    const now = state.prediction;
    if (!now) return;
    const base = state.baseline && state.baseline.prediction;
    $("prediction-title").textContent = now.kind === "next token" ? "Next token" : "Labels";
    const head = document.createElement("tr");
    const columns = ["", now.kind === "next token" ? "token" : "label", "p", ""];
    if (state.off.size && base) columns.push("all heads on", "change");
    columns.forEach((c) => { const th = document.createElement("th"); th.textContent = c; head.appendChild(th); });
    table.appendChild(head);
    const rows = state.off.size && base ? base.top : now.top;  // the same tokens before and after
    const current = {};
    now.top.forEach((t) => { current[t.id] = t.probability; });
    rows.forEach((t, i) => {
      const p = t.id in current ? current[t.id] : (now.tracked || {})[String(t.id)];
      const tr = document.createElement("tr");
      tr.dataset.id = String(t.id);
      const cells = [String(i + 1), JSON.stringify(t.token), format(p)];
      cells.forEach((c) => { const td = document.createElement("td"); td.textContent = c; tr.appendChild(td); });
      const bar = document.createElement("td");
      bar.className = "bar";
      const fill = document.createElement("span");
      fill.style.width = Math.round(140 * (p || 0)) + "px";
      bar.appendChild(fill);
      tr.appendChild(bar);
      if (state.off.size && base) {
        const before = document.createElement("td");
        before.textContent = format(t.probability);
        const change = document.createElement("td");
        const delta = (p || 0) - t.probability;
        change.textContent = (delta >= 0 ? "+" : "") + delta.toFixed(3);
        change.className = delta >= 0 ? "up" : "down";
        tr.append(before, change);
      }
      table.appendChild(tr);
    });
    const topNow = now.top.reduce((a, b) => (b.probability > a.probability ? b : a));
    $("prediction-note").textContent = state.off.size
      ? "with " + state.off.size + " head(s) off the top " + (now.kind === "next token" ? "token" : "label") + " is " +
        JSON.stringify(topNow.token) + " (p = " + format(topNow.probability) + ")"
      : "every head on";
  }

  // --- one head's map ---------------------------------------------------------------------
  async function loadMap(rowStart) {
    if (!state.selected || state.info.kind === "image") return;
    const body = { text: state.text, off: offList(), layer: state.selected.layer, head: state.selected.head };
    const T = state.tokens.length;
    if (rowStart !== null && rowStart !== undefined && T > state.info.map_cells) {
      const start = Math.max(0, Math.min(rowStart, T - 1));
      body.rows = [start, Math.min(T, start + state.info.map_cells)];
    }
    const map = await call("api/map", body);
    map.values = decode(map.weights);
    state.map = map;
    drawMap();
  }

  function drawMap() {
    const map = state.map;
    const [R, C] = map.shape;
    const scale = Math.max(1, Math.min(24, Math.floor(640 / Math.max(R, C))));
    const canvas = $("map");
    canvas.width = C * scale;
    canvas.height = R * scale;
    const context = canvas.getContext("2d");
    const image = context.createImageData(C, R);
    const top = map.max > 0 ? map.max : 1;
    for (let i = 0; i < R * C; i++) {
      const a = Math.min(1, map.values[i] / top);
      image.data[4 * i] = Math.round(255 + (ACCENT[0] - 255) * a);
      image.data[4 * i + 1] = Math.round(255 + (ACCENT[1] - 255) * a);
      image.data[4 * i + 2] = Math.round(255 + (ACCENT[2] - 255) * a);
      image.data[4 * i + 3] = 255;
    }
    const small = document.createElement("canvas");
    small.width = C;
    small.height = R;
    small.getContext("2d").putImageData(image, 0, 0);
    context.imageSmoothingEnabled = false;
    context.drawImage(small, 0, 0, C * scale, R * scale);
    const who = "layer " + map.layer + ", head " + map.head + (state.off.size ? " (" + state.off.size + " head(s) off)" : "");
    $("map-title").textContent = "Map: " + who;
    const [T, S] = map.length;
    $("map-info").textContent = map.kind === "full" ? T + " queries (rows) x " + S + " keys (columns), colour scaled to the largest weight " + format(map.max)
      : map.kind === "pooled" ? "a " + T + " x " + S + " map pooled into " + R + " x " + C + " blocks (mean of each block): pick rows for the exact weights"
      : "rows " + map.row_edges[0] + " to " + (map.row_edges[R] - 1) + " of " + T + ", every key";
    $("rows-controls").hidden = Math.max(T, S) <= state.info.map_cells;
  }

  function span_of(edges, i, tokens) {
    const a = edges[i], b = edges[i + 1] - 1;
    return a === b ? a + " " + JSON.stringify(tokens[a]) : "positions " + a + "-" + b;
  }

  function hoverMap(event) {
    const map = state.map;
    if (!map) return;
    const canvas = $("map");
    const rect = canvas.getBoundingClientRect();
    const [R, C] = map.shape;
    const c = Math.floor((event.clientX - rect.left) / rect.width * C);
    const r = Math.floor((event.clientY - rect.top) / rect.height * R);
    if (r < 0 || c < 0 || r >= R || c >= C) return;
    const rows = map.kind === "rows" ? map.row_edges.slice(0) : map.row_edges;
    $("map-hover").textContent = "query " + span_of(rows, r, map.tokens) + " -> key " + span_of(map.col_edges, c, map.tokens) +
      ": " + format(map.values[r * C + c]);
  }

  // --- explanation ---------------------------------------------------------------------------
  function describeFaithfulness() {
    const measured = state.info.faithfulness;
    const method = $("method").value;
    if (!measured) { $("faithfulness").textContent = "no faithfulness measured for this kind of model"; return; }
    const aopc = measured.aopc[method];
    if (aopc === undefined) { $("faithfulness").textContent = method + ": faithfulness not measured"; return; }
    const span = measured.interval[method], random = measured.random;
    const below = measured.at_or_below_random.indexOf(method) >= 0 ? ", not above random" : "";
    $("faithfulness").textContent = method + ": deletion AOPC " + aopc.toFixed(3) + " [" + span[0].toFixed(3) + ", " +
      span[1].toFixed(3) + "]" + below + " (random ranking " + (random === null ? "?" : random.toFixed(3)) +
      "; higher is more faithful; 95 % interval), measured on " + measured.measured_on + ", " + measured.quantity +
      (measured.same_family ? ", a model of this family" : ", a model of another family") + ", not on this model";
  }

  async function explain() {
    const answer = await call("api/explain", { text: state.text || $("text").value, method: $("method").value,
                                               off: offList() });
    $("explained").textContent = answer.method + ": " + answer.explained;
    const strip = $("explanation");
    strip.textContent = "";
    const top = Math.max.apply(null, answer.scores.map((v) => Math.abs(v))) || 1;
    answer.tokens.forEach((token, i) => {
      const v = answer.scores[i] / top;
      const s = span(token, "token scored");
      s.style.background = heat(Math.abs(v), v >= 0 ? ACCENT : BACK);
      if (Math.abs(v) > 0.6) s.style.color = "#fff";
      s.title = answer.method + ": " + answer.scores[i];
      strip.appendChild(s);
    });
  }

  // --- patching ----------------------------------------------------------------------------------
  async function patch() {
    const box = $("patch-result");
    if (!state.off.size) { box.textContent = "switch off the heads to patch first (shift-click them in the grid)"; return; }
    const r = await call("api/patch", { text: state.text, source: $("source").value, heads: offList() });
    box.textContent = "logit of " + JSON.stringify(r.label) + ": " + format(r.clean) + " in this text, " + format(r.source) +
      " in the second, " + format(r.patched) + " with heads " + r.heads.join(", ") + " patched" +
      (r.recovered === null ? "" : " (" + (100 * r.recovered).toFixed(1) + "% of the difference carried)");
  }

  // --- step-by-step generation --------------------------------------------------------------------
  async function nextToken() {
    const step = await call("api/step", { text: state.text, generated: state.generated, off: offList() });
    step.values = decode(step.attended);
    state.generated.push(step.id);
    state.step = step;
    drawGeneration();
  }

  function drawGeneration() {
    const box = $("generated");
    box.textContent = "";
    if (!state.step) { $("step-info").textContent = ""; $("attended").textContent = ""; return; }
    const words = state.step.tokens.slice(state.step.tokens.length - state.generated.length + 1);
    words.concat([state.step.token]).forEach((w, i, all) => box.appendChild(span(w, i === all.length - 1 ? "new" : "")));
    drawAttended();
  }

  function drawAttended() {
    const step = state.step;
    if (!step) return;
    const [L, H, S] = step.shape;
    const layer = state.selected ? state.selected.layer - 1 : L - 1;
    const head = state.selected ? state.selected.head - 1 : 0;
    const row = step.values.slice((layer * H + head) * S, (layer * H + head + 1) * S);
    const top = Math.max.apply(null, Array.from(row)) || 1;
    $("step-info").textContent = "next token " + JSON.stringify(step.token) + " (p = " + format(step.probability) + "); " +
      "what the last token, " + JSON.stringify(step.tokens[step.position]) + ", attended to when predicting it, in layer " +
      (layer + 1) + " head " + (head + 1) + " (click another head above)";
    const strip = $("attended");
    strip.textContent = "";
    step.tokens.forEach((token, i) => {
      const s = span(token, "token scored");
      s.style.background = heat(row[i] / top, ACCENT);
      if (row[i] / top > 0.6) s.style.color = "#fff";
      s.title = "weight " + row[i].toFixed(4);
      strip.appendChild(s);
    });
  }

  // --- image models ----------------------------------------------------------------------------------
  async function uploadImage() {
    const file = $("image").files[0];
    if (!file) return;
    state.imageBytes = await file.arrayBuffer();
    if (!state.selected) state.selected = { layer: state.info.layers, head: 1 };
    await viewImage();
  }

  async function viewImage() {
    const query = state.off.size ? "?off=" + encodeURIComponent(offList().join(",")) : "";
    const view = await call("api/image" + query, state.imageBytes, true);
    view.mapValues = decode(view.maps);
    view.rolloutValues = decode(view.rollout);
    const picture = new Image();
    picture.src = "data:image/png;base64," + view.image;
    await picture.decode();
    view.picture = picture;
    state.image = view;
    state.statistics = view.statistics;
    state.prediction = view.prediction;
    if (!state.baseline && !state.off.size) state.baseline = { prediction: view.prediction };
    fillStatistics();
    drawGrid();
    drawPrediction();
    $("grid-section").hidden = false;
    $("image-section").hidden = false;
    $("prediction-section").hidden = !view.prediction;
    drawImage();
  }

  function overlay(canvas, values, offset, grid, picture) {
    const context = canvas.getContext("2d");
    context.drawImage(picture, 0, 0, canvas.width, canvas.height);
    const [gh, gw] = grid;
    const w = canvas.width / gw, h = canvas.height / gh;
    for (let r = 0; r < gh; r++) {
      for (let c = 0; c < gw; c++) {
        context.fillStyle = heat(0.75 * values[offset + r * gw + c], BACK);
        context.fillRect(c * w, r * h, Math.ceil(w), Math.ceil(h));
      }
    }
  }

  function drawImage() {
    const view = state.image;
    if (!view) return;
    const [L, H, gh, gw] = view.shape;
    const layer = state.selected.layer - 1, head = state.selected.head - 1;
    overlay($("overlay"), view.mapValues, (layer * H + head) * gh * gw, view.grid, view.picture);
    overlay($("rollout"), view.rolloutValues, 0, view.grid, view.picture);
    $("overlay-caption").textContent = "layer " + (layer + 1) + ", head " + (head + 1) + ": class token -> patches (scaled to its largest weight)";
    $("image-info").textContent = gh + " x " + gw + " patches of " + view.patch_size + " px, " + view.prefix +
      " token(s) before them; rollout: " + view.rollout_settings + (state.off.size ? "; heads off: " + offList().join(", ") : "");
  }

  document.addEventListener("DOMContentLoaded", () => { start().catch((e) => showError(String(e.message || e))); });
})();
