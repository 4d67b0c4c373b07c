/* gpucheck report: filters, search and on-demand case lists. No network, no server. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("gc-data").textContent);
  var STATUS = { p: "passed", s: "skipped", f: "failed", e: "error", c: "crashed", h: "hung" };
  var keys = ["device", "kind", "severity", "status"];
  var controls = {};
  keys.forEach(function (k) { controls[k] = document.getElementById("f-" + k); });
  var search = document.getElementById("f-search");
  var count = document.getElementById("f-count");

  function tokens(value) { return value ? value.split(" ") : []; }

  function matches(el, query) {
    for (var i = 0; i < keys.length; i++) {
      var want = controls[keys[i]].value;
      if (!want) continue;
      var have = el.dataset[keys[i]];
      if (have === undefined) continue;
      if (tokens(have).indexOf(want) < 0) return false;
    }
    if (!query || !el.hasAttribute("data-search")) return true;
    return el.textContent.toLowerCase().indexOf(query) >= 0;
  }

  function apply() {
    var query = search.value.trim().toLowerCase();
    var active = query || keys.some(function (k) { return controls[k].value; });
    var shown = 0, total = 0;
    document.querySelectorAll("[data-filter]").forEach(function (el) {
      var ok = !active || matches(el, query);
      el.hidden = !ok;
      if (el.classList.contains("card")) { total++; if (ok) shown++; }
    });
    document.querySelectorAll("[data-group], [data-role]").forEach(function (g) {
      g.hidden = active && !g.querySelector(".card:not([hidden])");
    });
    count.textContent = active ? shown + " of " + total + " finding card(s) shown" : "";
  }

  function fillLazy(details) {
    var body = details.querySelector(".lazybody");
    if (body.dataset.done) return;
    var rows = data.cells[details.dataset.cell] || [];
    var device = data.device_of[details.dataset.cell] || "";
    var table = document.createElement("table");
    table.className = "grid cases";
    var head = table.insertRow();
    ["status", "case", "mode", "time", "peak", "reason"].forEach(function (h) {
      var th = document.createElement("th"); th.textContent = h; head.appendChild(th);
    });
    rows.forEach(function (r) {
      var tr = table.insertRow();
      var status = STATUS[r[2]] || r[2];
      tr.setAttribute("data-filter", "");
      tr.setAttribute("data-search", "");
      tr.dataset.kind = "";
      tr.dataset.status = status;
      tr.dataset.device = device;
      var badge = document.createElement("span");
      badge.className = "badge " + status; badge.textContent = status;
      tr.insertCell().appendChild(badge);
      tr.insertCell().textContent = data.names[r[0]];
      tr.insertCell().textContent = data.modes[r[1]];
      tr.insertCell().textContent = r[3].toFixed(3) + " s";
      tr.insertCell().textContent = r[4] == null ? "n/a" : (r[4] / 1048576).toFixed(1) + " MiB";
      var reason = tr.insertCell(); reason.className = "reason"; reason.textContent = r[5] || "";
    });
    body.appendChild(table);
    body.dataset.done = "1";
    apply();
  }

  function openTarget() {
    var id = decodeURIComponent(location.hash.slice(1));
    var el = id && document.getElementById(id);
    for (var p = el; p; p = p.parentElement) {
      if (p.tagName === "DETAILS") p.open = true;
      if (p.hidden) p.hidden = false;
    }
    if (el) el.scrollIntoView();
  }

  var timer = null;
  keys.forEach(function (k) { controls[k].addEventListener("change", apply); });
  search.addEventListener("input", function () {
    clearTimeout(timer); timer = setTimeout(apply, 150);
  });
  document.getElementById("f-reset").addEventListener("click", function () {
    keys.forEach(function (k) { controls[k].value = ""; });
    search.value = ""; apply();
  });
  document.querySelectorAll("details.lazy").forEach(function (d) {
    d.addEventListener("toggle", function () { if (d.open) fillLazy(d); });
  });
  window.addEventListener("hashchange", openTarget);
  if (location.hash) openTarget();
})();
