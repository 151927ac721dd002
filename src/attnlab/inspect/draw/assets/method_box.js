// One method's box on the explanation pages (explanation.js, generation_explanation.js):
// its name and, where measured, its faithfulness, marked where at or below random.
function attnlabMethodBox(method) {
  var box = document.createElement("div");
  box.className = "method";
  box.setAttribute("data-method", method.name);
  var heading = document.createElement("h3");
  heading.textContent = method.name;
  box.appendChild(heading);
  if (method.faithfulness) {
    var measured = document.createElement("p");
    measured.className = "faithfulness" + (method.below_random ? " below-random" : "");
    measured.textContent = (method.below_random ? "\u26a0 measured at or below random: " : "measured: ") +
      method.faithfulness;
    box.appendChild(measured);
  }
  return box;
}
