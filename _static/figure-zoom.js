// Click to enlarge: a click (or Enter) on a figure of the text opens its image over the page, as large as
// the window allows; a click on the enlarged image shows it at full resolution (scroll to pan); a click
// outside it, Escape or the close button returns to the text. Figures are 200-dpi PNGs shown at their
// drawn size in the column, so the enlarged view is sharp.
(function () {
  "use strict";
  var SELECTOR = "figure img, .cell_output img, div.figure img";

  function close(overlay, opener) {
    overlay.remove();
    document.body.classList.remove("rlbook-zoom-open");
    document.removeEventListener("keydown", overlay.rlbookOnKey);
    if (opener) opener.focus();
  }

  function open(img, opener) {
    var overlay = document.createElement("div");
    overlay.className = "rlbook-zoom-overlay";
    overlay.setAttribute("role", "dialog");
    overlay.setAttribute("aria-modal", "true");
    overlay.setAttribute("aria-label", "Enlarged figure");
    var big = document.createElement("img");
    big.src = img.currentSrc || img.src;
    big.alt = img.alt || "";
    var button = document.createElement("button");
    button.className = "rlbook-zoom-close";
    button.type = "button";
    button.setAttribute("aria-label", "Close");
    button.textContent = "\u00d7";
    overlay.appendChild(big);
    overlay.appendChild(button);
    big.addEventListener("click", function (event) {
      event.stopPropagation();  // first click: full resolution; second: back to fit-to-window
      overlay.classList.toggle("rlbook-zoom-full");
      big.style.cursor = overlay.classList.contains("rlbook-zoom-full") ? "zoom-out" : "zoom-in";
    });
    big.style.cursor = "zoom-in";
    overlay.addEventListener("click", function () { close(overlay, opener); });
    overlay.rlbookOnKey = function (event) {
      if (event.key === "Escape") close(overlay, opener);
    };
    document.addEventListener("keydown", overlay.rlbookOnKey);
    document.body.appendChild(overlay);
    document.body.classList.add("rlbook-zoom-open");
    button.focus();
  }

  function setUp() {
    var article = document.querySelector("article") || document.body;
    article.querySelectorAll(SELECTOR).forEach(function (img) {
      var link = img.closest("a");
      img.classList.add("rlbook-zoomable");
      img.setAttribute("title", "Click to enlarge");
      if (link) {
        // Sphinx links a sized figure to its PNG ("image-reference"); open it over the page instead of
        // leaving the page (a modified click, e.g. Ctrl-click for a new tab, still follows the link).
        // Any other link keeps its own behaviour.
        if (!link.classList.contains("image-reference")) return;
        link.addEventListener("click", function (event) {
          if (event.ctrlKey || event.metaKey || event.shiftKey || event.altKey || event.button !== 0) return;
          event.preventDefault();
          open(img, link);
        });
        return;
      }
      img.setAttribute("tabindex", "0");
      img.setAttribute("role", "button");
      img.addEventListener("click", function () { open(img, img); });
      img.addEventListener("keydown", function (event) {
        if (event.key === "Enter" || event.key === " ") {
          event.preventDefault();
          open(img, img);
        }
      });
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setUp);
  else setUp();
})();
