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
