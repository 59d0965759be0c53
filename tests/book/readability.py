"""What a reader of a rendered page must not meet, as checks on a Playwright page.

Each ``check_*`` function inspects the page it is given (the built book, or a hand-made
page in the tests of these checks) and returns a list of offences, one line each naming
the offending element; an empty list means the page passes. They look only inside the
article (``article.bd-article``, else ``main``, else the body) and skip text in
``pre``/``code``/``script``/``style`` and in MathJax's output.

- :func:`check_markdown_tables`: a Markdown table rule (``|---|``, ``| --- |``, ``|:--``)
  left as text: a table printed by notebook code that was not parsed as Markdown;
- :func:`check_untypeset_math`: ``$…$``, ``$$…$$`` or a TeX command (``\\alpha``) left as text;
- :func:`check_wide_blocks`: a table or display equation wider than the content column
  that no box between it and the article scrolls sideways;
- :func:`check_figure_text`: a matplotlib figure shown so small that its tick labels
  fall under :data:`MIN_TEXT_PX`;
- :func:`check_page_scroll`: the page itself scrolls sideways (measured at :data:`PHONE`);
- :func:`check_raw_markup`: ``~~`` or a backtick left as text (strikethrough, inline code);
- :func:`check_explorers_fit`: an interactive figure wider than its column, or drawn wider
  than its own box;
- :func:`check_image_alt`: an image without alt text, or with a file path for it;
- :func:`check_figure_captions`: a figure in a cell output without a numbered caption;
- :func:`check_console`: errors and warnings the page logged (:func:`watch_console` records them).

Call :func:`wait_for_math` first: before MathJax has run, every formula is raw TeX.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_TEXT_PX = 9.0  # smallest tick-label height, in CSS pixels, that a reader can still read
TICK_LABEL_PT = 10.0  # matplotlib's default tick-label size (rcParams font.size); no chapter changes it
DEFAULT_DPI = 72.0  # assumed for a PNG without a pHYs chunk (the old matplotlib-inline default)

_ARTICLE = "(document.querySelector('article.bd-article') || document.querySelector('main') || document.body)"

# The text nodes a reader sees as prose: outside code, scripts and MathJax's own output.
_TEXT_NODES = """
(() => {
  const root = %s;
  const skip = 'pre, code, kbd, samp, script, style, textarea, mjx-container, mjx-assistive-mml';
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const found = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement && !n.parentElement.closest(skip) && n.nodeValue.trim()) found.push(n.nodeValue);
  }
  return found;
})()
""" % _ARTICLE

# A Markdown table's delimiter row, also after Sphinx's smart quotes turned --- into — and -- into –.
_TABLE_RULE = r"/\|\s*:?\s*(?:-{3,}|[—–][-—–]*)\s*:?\s*\||\|\s*:[-—–]/"
# $…$ as dollarmath reads it: no space just inside either dollar, no digit just after the closing
# one (so "$5 or $6" is money, not math); $$…$$; or a TeX command such as \alpha or \frac.
_RAW_TEX = r"/\$\$[^$]+\$\$|\$(?![\s$])[^$\n]*[^\s$\\]\$(?!\d)|\\(?:[a-zA-Z]{2,}|[()\[\]{}])/"


def _snippet(text: str) -> str:
    return " ".join(text.split())[:80]


def wait_for_math(page, timeout_ms: int = 30_000) -> None:
    """Wait until MathJax has replaced every ``.math`` element's TeX with its rendering."""
    if page.locator(".math").count():
        page.wait_for_function(
            "() => [...document.querySelectorAll('.math')].every(e => e.querySelector('mjx-container'))",
            timeout=timeout_ms)


def _matching_text(page, regex: str) -> list[str]:
    texts = page.evaluate(f"(() => {{ const re = {regex}; return {_TEXT_NODES.strip()}.filter(t => re.test(t)); }})()")
    return [_snippet(t) for t in texts]


def check_markdown_tables(page) -> list[str]:
    """Text that shows a Markdown table's rule row: the table was printed, not rendered."""
    return [f"raw Markdown table in text: {t!r}" for t in _matching_text(page, _TABLE_RULE)]


def check_untypeset_math(page) -> list[str]:
    """Text with ``$…$``, ``$$…$$`` or a TeX command in it: math that was never typeset."""
    return [f"untypeset math in text: {t!r}" for t in _matching_text(page, _RAW_TEX)]


_WIDE_BLOCKS = """
(() => {
  const article = %s;
  const cs = getComputedStyle(article);
  const column = article.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
  const found = [];
  for (const el of article.querySelectorAll('table, div.math, mjx-container[display="true"]')) {
    const width = Math.max(el.scrollWidth, el.getBoundingClientRect().width);
    if (width <= column + 1) continue;
    let scrolls = false;
    for (let box = el; box && box !== article; box = box.parentElement) {
      const ox = getComputedStyle(box).overflowX;
      if ((ox === 'auto' || ox === 'scroll') && box.getBoundingClientRect().width <= column + 1) {
        scrolls = true;
        break;
      }
    }
    if (!scrolls) found.push({tag: el.tagName.toLowerCase(), cls: el.className.toString(),
                              width: Math.round(width), column: Math.round(column),
                              text: el.textContent});
  }
  return found;
})()
""" % _ARTICLE


def check_wide_blocks(page) -> list[str]:
    """Tables and display equations wider than the column, not inside a sideways-scrolling box.

    The column is the article's content width at the page's viewport; a box counts if its
    ``overflow-x`` is ``auto`` or ``scroll`` and it fits the column (the element itself may be it).
    """
    return [f"{b['tag']}.{b['cls'].replace(' ', '.')} is {b['width']} px wide in a {b['column']} px column "
            f"and does not scroll: {_snippet(b['text'])!r}" for b in page.evaluate(_WIDE_BLOCKS)]


_FIGURES = """
(async () => {
  const article = %s;
  // Reads the PNG's pHYs (pixels per metre) and whether matplotlib wrote it (tEXt "Software").
  function pngInfo(buf) {
    const b = new Uint8Array(buf), v = new DataView(buf);
    const sig = [137, 80, 78, 71, 13, 10, 26, 10];
    if (b.length < 8 || sig.some((x, i) => b[i] !== x)) return null;
    const info = {dpi: null, software: ''};
    for (let i = 8; i + 8 <= b.length;) {
      const n = v.getUint32(i), type = String.fromCharCode(...b.slice(i + 4, i + 8));
      if (type === 'pHYs' && b[i + 16] === 1) info.dpi = v.getUint32(i + 8) * 0.0254;
      if (type === 'tEXt') {
        const text = String.fromCharCode(...b.slice(i + 8, i + 8 + n));
        if (text.startsWith('Software\\0')) info.software = text.slice(9);
      }
      if (type === 'IEND') break;
      i += 12 + n;
    }
    return info;
  }
  const found = [];
  for (const img of article.querySelectorAll('.cell_output img')) {
    if (!img.complete || !img.naturalWidth || !img.width) continue;  // not shown: nothing to read
    const src = img.currentSrc || img.src;
    let info = null;
    try { info = pngInfo(await (await fetch(src)).arrayBuffer()); } catch (e) { info = null; }
    if (!info) continue;  // not a PNG
    found.push({src, width: img.width, natural: [img.naturalWidth, img.naturalHeight],
                dpi: info.dpi, software: info.software});
  }
  return found;
})()
""" % _ARTICLE


@dataclass(frozen=True)
class Figure:
    """A PNG figure as shown on the page."""

    src: str  # the image's address (a data: URL shortened)
    natural: tuple[int, int]  # its size in image pixels
    width: float  # its rendered width in CSS pixels
    dpi: float  # from its pHYs chunk, or DEFAULT_DPI when it has none
    software: str  # what wrote it (tEXt "Software"), "" if unknown

    @property
    def text_px(self) -> float:
        """The height of a 10 pt tick label as rendered: 10·dpi/72 image pixels, scaled to the width shown."""
        return TICK_LABEL_PT * self.dpi / 72.0 * self.width / self.natural[0]


def figures(page) -> list[Figure]:
    """Every PNG shown in a notebook cell's output on the page."""
    out = []
    for f in page.evaluate(_FIGURES):
        src = f["src"] if not f["src"].startswith("data:") else f["src"][:40] + "…"
        out.append(Figure(src=src, natural=tuple(f["natural"]), width=f["width"],
                          dpi=f["dpi"] or DEFAULT_DPI, software=f["software"]))
    return out


def check_figure_text(page) -> list[str]:
    """Figures in cell outputs whose tick labels render under MIN_TEXT_PX CSS pixels.

    Assumes matplotlib's default tick-label size, 10 pt (no chapter sets rcParams): at the
    figure's own size a label is 10·dpi/72 image pixels tall (dpi from the PNG's pHYs chunk,
    72 if it has none), and the page scales it by rendered width / natural width. Measured at
    the viewport the page was opened with (Playwright's default, 1280 × 720, device scale 1).
    """
    return [f"figure {f.src} ({f.natural[0]}×{f.natural[1]} px at {f.dpi:.0f} dpi) is shown "
            f"{f.width:.0f} px wide: 10 pt text renders {f.text_px:.1f} px < {MIN_TEXT_PX:g} px"
            for f in figures(page) if f.text_px < MIN_TEXT_PX]


# --- What a phone's reader meets, and what every reader meets (at 390 px and at 1280 px) ---

PHONE = {"width": 390, "height": 844}  # CSS pixels: a current phone held upright


def check_page_scroll(page) -> list[str]:
    """The page itself scrolls sideways: something in it is wider than the viewport and no box of
    its own scrolls it. Names the widest elements that stick out past the right edge."""
    found = page.evaluate("""
(() => {
  const doc = document.scrollingElement || document.documentElement;
  const view = doc.clientWidth;
  if (doc.scrollWidth <= view + 1) return null;
  const out = [];
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.right <= view + 1 || r.width === 0) continue;
    let clipped = false;  // inside a box that scrolls or clips: the page does not grow
    for (let box = el.parentElement; box && box !== document.body; box = box.parentElement) {
      if (getComputedStyle(box).overflowX !== 'visible') { clipped = true; break; }
    }
    if (!clipped) out.push({tag: el.tagName.toLowerCase(), cls: el.className.toString(),
                            right: Math.round(r.right),
                            text: (el.textContent || '').slice(0, 120)});
  }
  return {width: doc.scrollWidth, view, out: out.slice(-5)};
})()""")
    if not found:
        return []
    return [f"the page is {found['width']} px wide in a {found['view']} px viewport"] + [
        f"{o['tag']}.{o['cls'].replace(' ', '.')} reaches {o['right']} px: {_snippet(o['text'])!r}"
        for o in found["out"]]


# Markdown a reader should never see as characters: ~~struck~~ and `code` left as text.
_RAW_MARKUP = r"/~~|`/"


def check_raw_markup(page) -> list[str]:
    """Text outside code with ``~~`` or a backtick: strikethrough or inline code never rendered."""
    return [f"raw Markdown markup in text: {t!r}" for t in _matching_text(page, _RAW_MARKUP)]


_EXPLORERS = """
(() => {
  const article = %s;
  const column = article.getBoundingClientRect();
  const found = [];
  article.querySelectorAll('.hl-explorer').forEach((ex, i) => {
    const box = ex.getBoundingClientRect();
    const title = (ex.querySelector('.hl-title') || ex).textContent.slice(0, 60);
    const name = `explorer ${i} (${title})`;
    if (box.right > column.right + 1)
      found.push(`${name} ends at ${Math.round(box.right)} px, ` +
                 `past the column's ${Math.round(column.right)} px`);
    ex.querySelectorAll('svg, img').forEach(fig => {
      const r = fig.getBoundingClientRect();
      if (r.right > box.right + 1 || r.left < box.left - 1)
        found.push(`${name}: its ${fig.tagName.toLowerCase()} is ${Math.round(r.width)} px ` +
                   `wide in a ${Math.round(box.width)} px explorer`);
    });
  });
  return found;
})()
""" % _ARTICLE


def check_explorers_fit(page) -> list[str]:
    """Interactive figures (``.hl-explorer``) that stick out of the column, or whose drawing
    sticks out of the explorer (cut off, or scrolled sideways)."""
    return page.evaluate(_EXPLORERS)


_IMAGES = """
(() => [...%s.querySelectorAll('img')].map(img => ({
  src: img.getAttribute('src') || '', alt: img.getAttribute('alt'),
  caption: (() => { const f = img.closest('figure'); const c = f && f.querySelector('figcaption');
                    return c ? c.textContent.trim() : null; })()})))()
""" % _ARTICLE
# An alt text that is a file name or path, not a description: no space; a slash or an image suffix.
_PATH_LIKE = r"^\S*(/|\.(png|jpe?g|gif|svg|webp)$)\S*$"


def _short(src: str) -> str:
    return src if not src.startswith("data:") else src[:30] + "…"


def check_image_alt(page) -> list[str]:
    """Images whose alt text is missing, empty, or a file path, not words saying what they show."""
    import re

    out = []
    for img in page.evaluate(_IMAGES):
        alt = (img["alt"] or "").strip()
        if not alt:
            out.append(f"image {_short(img['src'])} has no alt text")
        elif re.match(_PATH_LIKE, alt, re.IGNORECASE):
            out.append(f"image {_short(img['src'])} has a path for alt text: {alt[:80]!r}")
    return out


def check_figure_captions(page) -> list[str]:
    """Figures in cell outputs without a numbered caption ("Fig. N …" in a figcaption)."""
    import re

    out = []
    for img in page.evaluate(_IMAGES.replace("querySelectorAll('img')",
                                             "querySelectorAll('.cell_output img')")):
        if img["caption"] is None:
            out.append(f"figure {_short(img['src'])} has no caption")
        elif not re.match(r"^Fig(ure|\.)\s*\d+", img["caption"]):
            out.append(f"figure {_short(img['src'])} has an unnumbered caption: "
                       f"{img['caption'][:60]!r}")
    return out


def watch_console(page) -> list[str]:
    """Start recording what the page logs as an error or a warning, and its uncaught exceptions;
    returns the list that fills as the page runs (call before loading the page)."""
    seen: list[str] = []
    page.on("console", lambda msg: seen.append(f"console.{msg.type}: {msg.text}")
            if msg.type in ("error", "warning", "assert") else None)
    page.on("pageerror", lambda exc: seen.append(f"uncaught: {exc}"))
    return seen


def check_console(seen: list[str]) -> list[str]:
    """What :func:`watch_console` recorded: a clean console logs no error and no warning."""
    return list(seen)
