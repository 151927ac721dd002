// generation_explanation.html: choose a generated token, see each method's scores over the
// tokens before it, and the logit lens at the position that predicted it. Token text is
// written with textContent only; the data come as JSON in #attnlab-data.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("attnlab-data").textContent);
  const P = data.prompt_length, G = data.tokens.length - P;
  const state = { step: 0 };
  const slider = document.getElementById("step");
  slider.max = String(G - 1);

  function visible(token) {
    return token.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5").replace(/ /g, "\u00b7");
  }
  function normalized(values) {
    let low = Infinity, high = -Infinity, largest = 0;
    for (const v of values) { low = Math.min(low, v); high = Math.max(high, v); largest = Math.max(largest, Math.abs(v)); }
    if (low >= 0) { return values.map((v) => (high > low ? (v - low) / (high - low) : 0)); }
    return values.map((v) => (largest > 0 ? v / largest : 0));
  }
  function showMethods(step) {
    const root = document.getElementById("methods");
    root.replaceChildren();
    const seen = P + step;  // positions 0 .. P + step - 1 predict token P + step
    data.methods.forEach((method) => {
      const box = attnlabMethodBox(method);  // method_box.js
      const values = method.scores[step].slice(0, seen);
      const shades = normalized(values);
      for (let i = 0; i < seen; i++) {
        const span = document.createElement("span");
        span.className = "tok" + (i >= P ? " generated" : "");
        span.textContent = visible(data.tokens[i]);
        span.title = method.name + ": " + values[i];
        const colour = shades[i] >= 0 ? "33,102,172" : "214,96,77";
        span.style.background = "rgba(" + colour + "," + Math.min(1, Math.abs(shades[i])).toFixed(3) + ")";
        if (Math.abs(shades[i]) > 0.6) { span.style.color = "#fff"; }
        box.appendChild(span);
      }
      const target = document.createElement("span");
      target.className = "tok target";
      target.textContent = visible(data.tokens[seen]);
      target.title = "the explained token";
      box.appendChild(target);
      root.appendChild(box);
    });
  }
  function showLens(step) {
    const table = document.getElementById("lens");
    table.replaceChildren();
    if (!data.lens) { return; }
    const head = document.createElement("tr");
    ["after", "top tokens (probability)", "explained token: rank, probability"].forEach((text) => {
      const th = document.createElement("th");
      th.textContent = text;
      head.appendChild(th);
    });
    table.appendChild(head);
    data.lens.layers.forEach((layer, l) => {
      const tr = document.createElement("tr");
      const cells = [layer,
        data.lens.top[l][step].map((t) => visible(t.token) + " (" + t.probability.toFixed(3) + ")").join("  "),
        data.lens.rank[l][step] + ", " + data.lens.probability[l][step].toFixed(4)];
      cells.forEach((text) => {
        const td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
  }
  function select(step) {
    state.step = step;
    slider.value = String(step);
    const label = document.getElementById("step-label");
    const objective = data.objective[step];
    label.textContent = "token " + (step + 1) + " of " + G + ": " + JSON.stringify(data.tokens[P + step]) +
      " (" + data.objective_name + " = " + objective.toFixed(4) + ")";
    showMethods(step);
    showLens(step);
  }
  slider.addEventListener("input", () => select(Number(slider.value)));
  document.getElementById("previous").addEventListener("click", () => select(Math.max(0, state.step - 1)));
  document.getElementById("next").addEventListener("click", () => select(Math.min(G - 1, state.step + 1)));
  select(0);
  document.body.dataset.ready = "true";
})();
