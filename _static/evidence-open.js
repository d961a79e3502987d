// A link into a collapsed dropdown (the Evidence section of a chapter, a proof, a long listing) opens it: when the
// address's #target lies inside hidden dropdowns, each is opened (outermost first) and the target scrolled to.
(function () {
  "use strict";
  function openTo(hash) {
    if (!hash || hash.length < 2) return;
    var target = document.getElementById(decodeURIComponent(hash.slice(1)));
    if (!target) return;
    var hidden = [];
    for (var node = target.parentElement; node; node = node.parentElement) {
      if (node.classList && node.classList.contains("toggle-hidden")) hidden.unshift(node);
    }
    hidden.forEach(function (box) {
      var button = box.querySelector(":scope > .admonition-title .toggle-button");
      if (button && typeof toggleHidden === "function") toggleHidden(button);  // sphinx-togglebutton's own
    });
    if (hidden.length) target.scrollIntoView();
  }
  window.addEventListener("load", function () { openTo(window.location.hash); });
  window.addEventListener("hashchange", function () { openTo(window.location.hash); });
})();
