// Marks each sideways-scrolling box in the article (a wide table, a long display equation) that
// has more content to its right with the class hl-more-right; halluc_book.css fades its right
// edge, a cue along the box's whole height (its scrollbar may be a screen further down).
(() => {
  const BOXES = ".bd-article .pst-scrollable-table-container, .bd-article table, " +
                ".bd-article mjx-container[display='true']";

  function mark(box) {
    const overflow = getComputedStyle(box).overflowX;
    const scrolls = overflow === "auto" || overflow === "scroll";
    box.classList.toggle("hl-more-right",
                         scrolls && box.scrollLeft + box.clientWidth < box.scrollWidth - 1);
  }

  function markAll() {
    document.querySelectorAll(BOXES).forEach(mark);
  }

  document.addEventListener("scroll", (event) => {
    if (event.target instanceof Element && event.target.matches(BOXES)) mark(event.target);
  }, true);
  window.addEventListener("resize", markAll);
  window.addEventListener("load", () => {
    markAll();
    // Equations get their width only once MathJax has typeset them.
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) MathJax.startup.promise.then(markAll);
  });
})();

// A figure shown narrower than its own size (a 10-inch figure in a phone's column) is marked
// hl-zoomable; a tap, a click, Enter or Space opens it at its own size in a full-screen box that
// scrolls both ways; a tap, Escape or the close button shuts it.
(() => {
  const FIGURES = ".bd-article .cell_output img, .bd-article figure img";
  let opener = null;

  function close(box) {
    box.remove();
    document.body.style.overflow = "";
    if (opener) opener.focus();
  }

  function open(img) {
    opener = img;
    const box = document.createElement("div");
    box.className = "hl-lightbox";
    box.setAttribute("role", "dialog");
    box.setAttribute("aria-modal", "true");
    box.setAttribute("aria-label", img.alt || "figure");
    const button = document.createElement("button");
    button.className = "hl-lightbox-close";
    button.type = "button";
    button.textContent = "×";
    button.setAttribute("aria-label", "close");
    const full = document.createElement("img");
    full.src = img.currentSrc || img.src;
    full.alt = img.alt;
    full.style.width = img.naturalWidth + "px";
    box.append(button, full);
    box.addEventListener("click", () => close(box));
    box.addEventListener("keydown", (event) => { if (event.key === "Escape") close(box); });
    document.body.append(box);
    document.body.style.overflow = "hidden";
    button.focus();
  }

  function mark(img) {
    const shown = img.clientWidth;
    const zoomable = img.complete && shown > 0 && img.naturalWidth > 1.15 * shown;
    img.classList.toggle("hl-zoomable", zoomable);
    if (zoomable) {
      img.tabIndex = 0;
      img.setAttribute("role", "button");
      img.title = "open full size";
    } else if (img.getAttribute("role") === "button") {
      img.removeAttribute("tabindex");
      img.removeAttribute("role");
      img.removeAttribute("title");
    }
  }

  function markAll() {
    document.querySelectorAll(FIGURES).forEach(mark);
  }

  document.addEventListener("click", (event) => {
    const img = event.target instanceof Element && event.target.closest("img.hl-zoomable");
    if (img) { event.preventDefault(); open(img); }
  });
  document.addEventListener("keydown", (event) => {
    const img = event.target instanceof Element && event.target.closest("img.hl-zoomable");
    if (img && (event.key === "Enter" || event.key === " ")) { event.preventDefault(); open(img); }
  });
  window.addEventListener("resize", markAll);
  window.addEventListener("load", markAll);
})();

// Interactive figures are recorded in the notebooks with the drawing code of the day they ran. The
// book draws them again with the library's current code (halluc_lab/book/interactive.js, served as
// _static/hl_interactive.js by offline_book.py): drawn for the column's width, captions with code.
// Each explorer is replaced by a copy of itself (a copy has none of the old code's listeners).
(() => {
  function redraw() {
    if (typeof window.hlDrawExplorer !== "function") return;
    document.querySelectorAll(".hl-explorer[data-ready]").forEach((old) => {
      const fresh = old.cloneNode(true);
      fresh.removeAttribute("data-ready");
      fresh.querySelector(".hl-figure").replaceChildren();
      old.replaceWith(fresh);
      window.hlDrawExplorer(fresh.id);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", redraw);
  else redraw();
})();
