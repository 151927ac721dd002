// The explanation fragment (explanation.py): builds each method's highlighted tokens from its
// JSON block into its root element; the two ids below are placeholders that explanation.py
// replaces with the fragment's own (random, so several fragments can share one notebook).
// Token text goes through textContent only.
(function () {
  var block = document.getElementById(ATTNLAB_DATA_ID);
  var data = JSON.parse(block.textContent);
  var root = document.getElementById(ATTNLAB_ROOT_ID);
  data.methods.forEach(function (method) {
    var box = attnlabMethodBox(method);  // method_box.js
    data.tokens.forEach(function (token, i) {
      var span = document.createElement("span");
      var value = method.normalized[i];
      span.className = "tok";
      span.textContent = token;
      span.title = method.name + ": " + method.scores[i];
      var colour = value >= 0 ? "33,102,172" : "214,96,77";
      span.style.background = "rgba(" + colour + "," + Math.min(1, Math.abs(value)).toFixed(3) + ")";
      if (Math.abs(value) > 0.6) { span.style.color = "#fff"; }
      box.appendChild(span);
    });
    root.appendChild(box);
  });
})();
