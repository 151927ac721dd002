
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("attnlab-data").textContent);
  const N = data.tokens.length, P = data.prompt_length, G = N - P;
  const L = data.layers.length, H = data.heads;
  const bytes = Uint8Array.from(atob(data.weights), (c) => c.charCodeAt(0));
  const weights = new Uint16Array(bytes.buffer);   // [G][L][H][N], value = w * 65535
  const state = { step: 0, layer: L - 1, head: "mean" };

  function row(step, layer, head) {
    const out = new Float32Array(N);
    const heads = head === "mean" ? [...Array(H).keys()] : [head];
    for (const h of heads) {
      const base = ((step * L + layer) * H + h) * N;
      for (let s = 0; s < N; s++) out[s] += weights[base + s] / 65535 / heads.length;
    }
    return out;
  }
  function shade(value, vmax) {
    const alpha = vmax > 0 ? Math.min(1, value / vmax) : 0;
    return "rgba(33,102,172," + alpha.toFixed(3) + ")";
  }
  function visible(token) {  // whitespace tokens shown as marks where a token stands alone
    return token.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5").replace(/ /g, "\u00b7");
  }
  function button(text, onClick) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = text;
    b.addEventListener("click", onClick);
    return b;
  }

  const slider = document.getElementById("step");
  slider.max = String(G - 1);
  slider.addEventListener("input", () => select(Number(slider.value), state.layer, state.head));
  document.getElementById("previous").addEventListener("click", () => select(Math.max(0, state.step - 1), state.layer, state.head));
  document.getElementById("next").addEventListener("click", () => select(Math.min(G - 1, state.step + 1), state.layer, state.head));
  const layerBox = document.getElementById("layer-buttons");
  data.layers.forEach((name, i) => {
    const b = button(String(i + 1), () => select(state.step, i, state.head));
    b.dataset.layer = String(i);
    layerBox.appendChild(b);
  });
  const headBox = document.getElementById("head-buttons");
  const mean = button("mean", () => select(state.step, state.layer, "mean"));
  mean.dataset.head = "mean";
  headBox.appendChild(mean);
  for (let h = 0; h < H; h++) {
    const b = button(String(h + 1), () => select(state.step, state.layer, h));
    b.dataset.head = String(h);
    headBox.appendChild(b);
  }

  const text = document.getElementById("text");
  const spans = data.tokens.map((token, i) => {
    const span = document.createElement("span");
    span.className = "token" + (i >= P ? " generated" : "");
    span.textContent = token;
    span.dataset.position = String(i);
    text.appendChild(span);
    return span;
  });

  const grid = document.getElementById("layers-heads");
  const header = grid.createTHead().insertRow();
  header.appendChild(document.createElement("th"));
  for (let h = 0; h < H; h++) {
    const th = document.createElement("th");
    th.textContent = "head " + (h + 1);
    header.appendChild(th);
  }
  const body = grid.createTBody();
  const cells = [];
  for (let l = 0; l < L; l++) {
    const tr = body.insertRow();
    const th = document.createElement("th");
    th.textContent = "layer " + (l + 1);
    tr.appendChild(th);
    cells.push([]);
    for (let h = 0; h < H; h++) {
      const td = tr.insertCell();
      td.dataset.layer = String(l);
      td.dataset.head = String(h);
      td.addEventListener("click", () => select(state.step, l, h));
      cells[l].push(td);
    }
  }

  function select(step, layer, head) {
    state.step = step; state.layer = layer; state.head = head;
    slider.value = String(step);
    const position = P + step;
    document.getElementById("step-label").textContent =
      "generated token " + (step + 1) + " of " + G + ": " + visible(data.tokens[position]);
    const weightsNow = row(step, layer, head);
    let vmax = 0;
    for (let s = 0; s <= position; s++) vmax = Math.max(vmax, weightsNow[s]);
    spans.forEach((span, s) => {
      span.hidden = s > position;
      span.style.background = s <= position ? shade(weightsNow[s], vmax) : "";
      span.title = s <= position ? (weightsNow[s] * 100).toFixed(1) + "%" : "";
      span.classList.toggle("current", s === position);
    });
    for (let l = 0; l < L; l++) {
      for (let h = 0; h < H; h++) {
        const cellRow = row(step, l, h);
        let best = position >= 1 ? 1 : 0;  // the first token, often a sink, is left out
        for (let s = best + 1; s <= position; s++) if (cellRow[s] > cellRow[best]) best = s;
        const td = cells[l][h];
        td.textContent = visible(data.tokens[best]) + " " + (cellRow[best] * 100).toFixed(0) + "%";
        td.style.background = shade(cellRow[best], 1);
        td.classList.toggle("selected", l === layer && h === head);
      }
    }
    document.querySelectorAll("#layer-buttons button").forEach((b) =>
      b.classList.toggle("selected", Number(b.dataset.layer) === layer));
    document.querySelectorAll("#head-buttons button").forEach((b) =>
      b.classList.toggle("selected", b.dataset.head === String(head)));
    document.getElementById("view-title").textContent =
      "Layer " + (layer + 1) + ", " + (head === "mean" ? "mean of heads" : "head " + (head + 1));
  }
  select(0, state.layer, state.head);
  document.body.dataset.ready = "true";
})();
