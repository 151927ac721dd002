
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("attnlab-data").textContent);
  // queries are data.tokens (T); keys are data.key_tokens (S) when they are another sequence
  const square = !data.key_tokens;
  const keyTokens = square ? data.tokens : data.key_tokens;
  const T = data.tokens.length;
  const S = keyTokens.length;
  const sides = data.sides || ["queries", "keys"];
  const L = data.layers.length;

  function decode(b64) {
    if (!b64) return null;
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    return new Uint16Array(bytes.buffer);
  }
  const weights = decode(data.weights);        // [L][Hmax][T][S], value = w * 65535
  const rollout = decode(data.rollout);        // [L][T][T] or null
  const Hmax = data.max_heads;
  const state = { layer: 0, head: 0, token: null, key: null };

  function matrix(layer, head) {
    const out = new Float32Array(T * S);
    if (head === "rollout") {
      const base = layer * T * S;
      for (let i = 0; i < T * S; i++) out[i] = rollout[base + i] / 65535;
    } else if (head === "mean") {
      const H = data.heads[layer];
      for (let h = 0; h < H; h++) {
        const base = (layer * Hmax + h) * T * S;
        for (let i = 0; i < T * S; i++) out[i] += weights[base + i] / 65535 / H;
      }
    } else {
      const base = (layer * Hmax + head) * T * S;
      for (let i = 0; i < T * S; i++) out[i] = weights[base + i] / 65535;
    }
    return out;
  }

  function colour(value, vmax, rgb) {
    const alpha = vmax > 0 ? Math.min(1, value / vmax) : 0;
    return "rgba(" + rgb + "," + alpha.toFixed(3) + ")";
  }
  const ACCENT = "33,102,172", BACK = "214,96,77";

  function button(text, onClick) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = text;
    b.addEventListener("click", onClick);
    return b;
  }

  // --- controls ---------------------------------------------------------------
  const layerBox = document.getElementById("layer-buttons");
  const headBox = document.getElementById("head-buttons");
  data.layers.forEach((name, i) => {
    const b = button(String(i + 1), () => select(i, state.head));
    b.dataset.layer = String(i);
    b.title = name;
    layerBox.appendChild(b);
  });
  function buildHeadButtons() {
    headBox.textContent = "";
    for (let h = 0; h < data.heads[state.layer]; h++) {
      const b = button(String(h + 1), () => select(state.layer, h));
      b.dataset.head = String(h);
      headBox.appendChild(b);
    }
    const mean = button("mean", () => select(state.layer, "mean"));
    mean.dataset.head = "mean";
    headBox.appendChild(mean);
    if (rollout) {
      const r = button("rollout", () => select(state.layer, "rollout"));
      r.dataset.head = "rollout";
      r.title = "attention rollout up to this layer (Abnar & Zuidema, 2020)";
      headBox.appendChild(r);
    }
  }

  // --- token strips -----------------------------------------------------------
  function strip(id, texts, onHover) {
    const box = document.getElementById(id);
    const spans = texts.map((text, i) => {
      const s = document.createElement("span");
      s.className = "token";
      s.textContent = text;
      s.dataset.index = String(i);
      if (onHover) {
        s.addEventListener("mouseenter", () => onHover(i));
      }
      box.appendChild(s);
      return s;
    });
    return spans;
  }
  const mainTokens = strip("tokens", data.tokens, (i) => focusToken(i));
  const toTokens = strip("attends-to", keyTokens, null);
  // self-attention: the same tokens, shaded by what attends to the hovered one;
  // two sequences: the key tokens, each hoverable, shading the queries that attend to it
  const byTokens = square ? strip("attended-by", data.tokens, null)
    : strip("attended-by", keyTokens, (j) => focusKey(j));

  // --- heatmap ----------------------------------------------------------------
  const heat = document.getElementById("heatmap");
  const headRow = document.createElement("tr");
  const corner = document.createElement("th");
  corner.textContent = square ? "" : sides[0] + " \\ " + sides[1];
  corner.className = "corner";
  headRow.appendChild(corner);
  const colHeads = keyTokens.map((text, j) => {
    const th = document.createElement("th");
    th.textContent = text;
    th.dataset.col = String(j);
    headRow.appendChild(th);
    return th;
  });
  const thead = document.createElement("thead");
  thead.appendChild(headRow);
  heat.appendChild(thead);
  const tbody = document.createElement("tbody");
  const rows = [], cells = [];
  data.tokens.forEach((text, i) => {
    const tr = document.createElement("tr");
    tr.dataset.row = String(i);
    const th = document.createElement("th");
    th.textContent = text;
    th.addEventListener("mouseenter", () => focusToken(i));
    tr.appendChild(th);
    const rowCells = [];
    for (let j = 0; j < S; j++) {
      const td = document.createElement("td");
      td.dataset.col = String(j);
      td.addEventListener("mouseenter", () => focusToken(i, j));
      tr.appendChild(td);
      rowCells.push(td);
    }
    tbody.appendChild(tr);
    rows.push(tr);
    cells.push(rowCells);
  });
  heat.appendChild(tbody);

  let current = null, currentMax = 0;
  function drawHeatmap() {
    current = matrix(state.layer, state.head);
    currentMax = 0;
    for (let i = 0; i < current.length; i++) currentMax = Math.max(currentMax, current[i]);
    for (let i = 0; i < T; i++) {
      for (let j = 0; j < S; j++) {
        const value = current[i * S + j];
        const td = cells[i][j];
        td.style.background = colour(value, currentMax, ACCENT);
        td.title = data.tokens[i] + " \u2192 " + keyTokens[j] + ": " + value.toFixed(3);
      }
    }
    heat.dataset.layer = String(state.layer);
    heat.dataset.head = String(state.head);
    heat.dataset.max = currentMax.toFixed(4);
    const headName = state.head === "mean" ? "mean of heads"
      : state.head === "rollout" ? "rollout" : "head " + (state.head + 1);
    document.getElementById("view-title").textContent =
      data.layers[state.layer] + ", " + headName + " (colour scale 0 \u2013 " + currentMax.toFixed(3) + ")";
  }

  function focusToken(i, j) {
    state.token = i;
    rows.forEach((tr, r) => tr.classList.toggle("highlight", r === i));
    state.key = null;
    colHeads.forEach((th, c) => th.classList.toggle("col-highlight", c === (j === undefined ? i : j)));
    mainTokens.forEach((s, k) => s.classList.toggle("current", k === i));
    if (!square) mainTokens.forEach((s) => { s.style.background = ""; });
    let maxTo = 0, maxBy = 0;
    for (let k = 0; k < S; k++) maxTo = Math.max(maxTo, current[i * S + k]);
    if (square) for (let k = 0; k < T; k++) maxBy = Math.max(maxBy, current[k * T + i]);
    toTokens.forEach((s, k) => {
      const v = current[i * S + k];
      s.style.background = colour(v, maxTo, ACCENT);
      s.dataset.weight = v.toFixed(4);
    });
    if (square) byTokens.forEach((s, k) => {
      const v = current[k * T + i];
      s.style.background = colour(v, maxBy, BACK);
      s.dataset.weight = v.toFixed(4);
    });
    heat.dataset.row = String(i);
    const info = document.getElementById("hover-info");
    info.textContent = "";
    const top = (values) => values.map((v, k) => [v, k]).sort((a, b) => b[0] - a[0]).slice(0, 5);
    const to = top(Array.from({ length: S }, (_, k) => current[i * S + k]));
    const who = document.createElement("div");
    who.className = "who";
    who.textContent = (square ? "" : sides[0] + " ") + "[" + i + "] " + data.tokens[i];
    info.appendChild(who);
    info.appendChild(infoLine("attends to:", to, keyTokens));
    if (square) {
      const by = top(Array.from({ length: T }, (_, k) => current[k * T + i]));
      info.appendChild(infoLine("attended by:", by, data.tokens));
    }
  }

  function infoLine(label, pairs, texts) {
    const p = document.createElement("div");
    p.appendChild(document.createTextNode(label));
    pairs.forEach(([v, k], n) => {
      const w = document.createElement("span");
      w.className = "who";
      w.textContent = (n ? ", " : " ") + texts[k] + " " + v.toFixed(2);
      p.appendChild(w);
    });
    return p;
  }

  // two sequences: a key token hovered shades the query tokens by how much each attends to it
  function focusKey(j) {
    state.key = j;
    state.token = null;
    rows.forEach((tr) => tr.classList.remove("highlight"));
    colHeads.forEach((th, c) => th.classList.toggle("col-highlight", c === j));
    byTokens.forEach((s, k) => s.classList.toggle("current", k === j));
    mainTokens.forEach((s) => s.classList.remove("current"));
    toTokens.forEach((s) => { s.style.background = ""; });
    let maxBy = 0;
    for (let k = 0; k < T; k++) maxBy = Math.max(maxBy, current[k * S + j]);
    mainTokens.forEach((s, k) => {
      const v = current[k * S + j];
      s.style.background = colour(v, maxBy, BACK);
      s.dataset.weight = v.toFixed(4);
    });
    heat.dataset.column = String(j);
    const info = document.getElementById("hover-info");
    info.textContent = "";
    const who = document.createElement("div");
    who.className = "who";
    who.textContent = sides[1] + " [" + j + "] " + keyTokens[j];
    info.appendChild(who);
    const top = Array.from({ length: T }, (_, k) => [current[k * S + j], k]).sort((a, b) => b[0] - a[0]).slice(0, 5);
    info.appendChild(infoLine("attended by:", top, data.tokens));
  }

  // --- model grid -------------------------------------------------------------
  const grid = document.getElementById("grid");
  const thumbs = [];
  grid.style.gridTemplateColumns = "70px repeat(" + Hmax + ", 60px)";
  grid.appendChild(document.createElement("div"));
  for (let h = 0; h < Hmax; h++) {
    const d = document.createElement("div");
    d.className = "axis";
    d.textContent = "head " + (h + 1);
    grid.appendChild(d);
  }
  data.layers.forEach((name, l) => {
    const label = document.createElement("div");
    label.className = "axis";
    label.textContent = name;
    grid.appendChild(label);
    const row = [];
    for (let h = 0; h < Hmax; h++) {
      if (h >= data.heads[l]) { grid.appendChild(document.createElement("div")); row.push(null); continue; }
      const c = document.createElement("canvas");
      c.width = S; c.height = T;
      c.dataset.layer = String(l);
      c.dataset.head = String(h);
      c.title = name + ", head " + (h + 1);
      const m = matrix(l, h);
      let mx = 0;
      for (let i = 0; i < m.length; i++) mx = Math.max(mx, m[i]);
      const ctx = c.getContext("2d");
      const img = ctx.createImageData(S, T);
      for (let i = 0; i < T * S; i++) {
        const a = mx > 0 ? m[i] / mx : 0;
        img.data[4 * i] = Math.round(255 - a * (255 - 33));
        img.data[4 * i + 1] = Math.round(255 - a * (255 - 102));
        img.data[4 * i + 2] = Math.round(255 - a * (255 - 172));
        img.data[4 * i + 3] = 255;
      }
      ctx.putImageData(img, 0, 0);
      c.addEventListener("click", () => select(l, h));
      grid.appendChild(c);
      row.push(c);
    }
    thumbs.push(row);
  });

  function select(layer, head) {
    const layerChanged = layer !== state.layer;
    state.layer = layer;
    if (typeof head === "number" && head >= data.heads[layer]) head = 0;
    state.head = head;
    if (layerChanged || !headBox.children.length) buildHeadButtons();
    layerBox.querySelectorAll("button").forEach(
      (b) => b.classList.toggle("selected", b.dataset.layer === String(layer)));
    headBox.querySelectorAll("button").forEach(
      (b) => b.classList.toggle("selected", b.dataset.head === String(head)));
    thumbs.forEach((row, l) => row.forEach(
      (c, h) => c && c.classList.toggle("selected", l === layer && h === head)));
    drawHeatmap();
    if (state.token !== null) focusToken(state.token);
    else if (state.key !== null && state.key !== undefined) focusKey(state.key);
  }

  buildHeadButtons();
  select(0, 0);
  document.body.dataset.ready = "true";
})();
