"""The readability checks can fail: each one flags a hand-made page built to break it, and none
flags a clean page that holds the same content done right (plus look-alikes that are fine:
a dollar amount, a table rule and TeX inside code)."""

import base64
import struct
import zlib

import pytest

from tests.book import readability

pytestmark = pytest.mark.book


def png(width: int, height: int, dpi: float | None = 100) -> str:
    """A blank grey PNG as a data: URL, with a pHYs chunk for ``dpi`` and matplotlib's Software tag."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    parts = [chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))]
    if dpi is not None:
        ppm = round(dpi / 0.0254)
        parts.append(chunk(b"pHYs", struct.pack(">IIB", ppm, ppm, 1)))
    parts += [chunk(b"tEXt", b"Software\x00Matplotlib version3.11.2, https://matplotlib.org/"),
              chunk(b"IDAT", zlib.compress(rows)), chunk(b"IEND", b"")]
    return "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"".join(parts)).decode()


WIDE_ROW = "<tr>" + "".join(f"<td style='white-space:nowrap'>column number {i} of many</td>" for i in range(12)) + "</tr>"
WIDE_MATH = "<div class='math'><span style='display:inline-block;width:1500px'>x_1 + … + x_n</span></div>"

BROKEN = f"""<main><article class="bd-article" style="width:600px">
<p>| quantity | value |
|---|---|
| p(cat) | 0.66 |</p>
<p>| τ | entropy | |—|—| | 1 | 1.28 |</p>
<p>The softmax is $p_i = e^{{z_i}} / \\sum_j e^{{z_j}}$ for every $i$.</p>
<table><tbody>{WIDE_ROW}</tbody></table>
<div style="overflow:hidden">{WIDE_MATH}</div>
<div class="cell_output"><img src="{png(1200, 300, dpi=100)}" style="width:300px"></div>
</article></main>"""

CLEAN = f"""<main><article class="bd-article" style="width:600px">
<table><thead><tr><th>quantity</th><th>value</th></tr></thead><tbody><tr><td>p(cat)</td><td>0.66</td></tr></tbody></table>
<p>A GPU hour costs $2 to $3; <code>$x^2$</code> is written in TeX.</p>
<pre>| a | b |
|---|---|
$\\alpha$</pre>
<div style="overflow-x:auto"><table><tbody>{WIDE_ROW}</tbody></table></div>
<div style="overflow-x:auto">{WIDE_MATH}</div>
<div class="cell_output"><img src="{png(600, 300, dpi=100)}" style="width:600px"></div>
<div class="cell_output"><img src="{png(400, 200, dpi=None)}"></div>
</article></main>"""


@pytest.fixture(scope="module")
def hand_made(browser):
    context = browser.new_context()
    pages = {}
    for name, html in (("broken", BROKEN), ("clean", CLEAN)):
        pages[name] = context.new_page()
        pages[name].set_content(html, wait_until="load")
    yield pages
    context.close()


def test_raw_markdown_table_is_flagged(hand_made):
    offences = readability.check_markdown_tables(hand_made["broken"])
    # as typed, and as Sphinx's smart quotes leave it (--- becomes an em dash)
    assert len(offences) == 2 and "| quantity | value |" in offences[0] and "|—|—|" in offences[1]
    assert readability.check_markdown_tables(hand_made["clean"]) == []


def test_raw_dollar_math_is_flagged_but_not_money_or_code(hand_made):
    offences = readability.check_untypeset_math(hand_made["broken"])
    assert len(offences) == 1 and "$p_i = e^{z_i}" in offences[0]
    assert readability.check_untypeset_math(hand_made["clean"]) == []


def test_overflowing_table_and_equation_are_flagged_unless_they_scroll(hand_made):
    offences = readability.check_wide_blocks(hand_made["broken"])
    assert len(offences) == 2, offences
    assert offences[0].startswith("table") and "column number 0" in offences[0]
    assert offences[1].startswith("div.math") and "x_1 + … + x_n" in offences[1]
    assert readability.check_wide_blocks(hand_made["clean"]) == []


def test_figure_shown_too_small_to_read_is_flagged(hand_made):
    offences = readability.check_figure_text(hand_made["broken"])
    # 1200 px at 100 dpi shown 300 px wide: 10 pt = 13.9 image px, shown at 3.5 px.
    assert len(offences) == 1 and "1200×300 px at 100 dpi" in offences[0] and "3.5 px" in offences[0]
    assert readability.check_figure_text(hand_made["clean"]) == []


def test_png_without_phys_is_read_at_72_dpi(hand_made):
    no_phys = [f for f in readability.figures(hand_made["clean"]) if f.natural == (400, 200)]
    assert len(no_phys) == 1 and no_phys[0].dpi == 72 and no_phys[0].text_px == pytest.approx(10)


# --- The checks of a phone's page, of markup left as text, interactive figures, alt text, captions
# --- and the console: each one flags a hand-made page built to break it, and passes its clean twin.

EXPLORER = ("<div class='hl-explorer' style='max-width:{max}'><div class='hl-title'>sampler</div>"
            "<div class='hl-figure'>"
            "<svg width='640' height='300' viewBox='0 0 640 300' style='{svg}'>"
            "<rect width='640' height='300'/></svg></div></div>")
LONG_NAME = "halluc_lab.stages.rlvr_rounds.CapturedUpdate.from_padded_rows_of_every_rank"
FIGURE = "<div class='cell_output'><figure><img src='{src}' alt='{alt}'>{caption}</figure></div>"
IMAGE = "<div class='cell_output'><img src='{src}'{alt}></div>"
WIDE_CELL = "<td style='white-space:nowrap'>" + "a wide cell " * 20 + "</td>"

PHONE_BROKEN = f"""<main><article class="bd-article">
<p>A long name: <code style="white-space:nowrap">{LONG_NAME}</code></p>
<p>Taken back: burig ~~gus_of~~ ⌫ dis_of, and the answer after `:` is read.</p>
{EXPLORER.format(max='680px', svg='')}
{IMAGE.format(src=png(200, 100), alt=" alt='../_build/jupyter_execute/3f2a.png'")}
{IMAGE.format(src=png(200, 100), alt="")}
{FIGURE.format(src=png(200, 100), alt="a curve", caption="<figcaption>a curve</figcaption>")}
</article></main>
<script>console.error("Got invalid theme mode: . Resetting to auto.")</script>"""

PHONE_CLEAN = f"""<main><article class="bd-article">
<p>A long name: <code style="overflow-wrap:anywhere">{LONG_NAME}</code></p>
<p>Taken back: burig <s>gus_of</s> ⌫ dis_of, and the answer after <code>:</code> is read;
<code>~~x~~</code> is how Markdown strikes it through.</p>
<div style="overflow-x:auto"><table><tr>{WIDE_CELL}</tr></table></div>
{EXPLORER.format(max='min(680px,100%)', svg='max-width:100%;height:auto')}
{FIGURE.format(src=png(200, 100), alt="Temperature against probability: cat falls to one third.",
               caption="<figcaption><span class='caption-number'>Fig. 3 </span>"
                       "Temperature reshapes a distribution.</figcaption>")}
</article></main>
<script>console.log("[PST]: Changed to auto mode using the light theme.")</script>"""


@pytest.fixture(scope="module")
def phone(browser):
    context = browser.new_context(viewport=readability.PHONE)
    pages = {}
    for name, html in (("broken", PHONE_BROKEN), ("clean", PHONE_CLEAN)):
        page = context.new_page()
        page.console_seen = readability.watch_console(page)
        page.set_content(html, wait_until="load")
        pages[name] = page
    yield pages
    context.close()


def test_page_wider_than_a_phone_is_flagged_unless_the_wide_part_scrolls_in_its_box(phone):
    offences = readability.check_page_scroll(phone["broken"])
    assert offences and offences[0].startswith("the page is") and "390 px viewport" in offences[0]
    assert any(o.startswith("code") and "CapturedUpdate" in o for o in offences[1:]), offences
    assert readability.check_page_scroll(phone["clean"]) == []


def test_struck_through_and_backticked_text_left_as_markup_is_flagged(phone):
    offences = readability.check_raw_markup(phone["broken"])
    assert len(offences) == 1 and "~~gus_of~~" in offences[0] and "`:`" in offences[0]
    assert readability.check_raw_markup(phone["clean"]) == []  # <s>, <code>, and ~~ inside code


def test_interactive_figure_of_fixed_width_is_flagged_on_a_phone(phone):
    offences = readability.check_explorers_fit(phone["broken"])
    assert offences and all("sampler" in o for o in offences), offences
    assert any("640 px wide" in o for o in offences)
    assert readability.check_explorers_fit(phone["clean"]) == []


def test_image_without_alt_text_or_with_a_path_for_it_is_flagged(phone):
    offences = readability.check_image_alt(phone["broken"])
    assert len(offences) == 2, offences
    assert "path for alt text" in offences[0] and "jupyter_execute" in offences[0]
    assert "no alt text" in offences[1]
    assert readability.check_image_alt(phone["clean"]) == []


def test_figure_without_a_numbered_caption_is_flagged(phone):
    offences = readability.check_figure_captions(phone["broken"])
    assert len(offences) == 3, offences
    kinds = [o.split(" has ")[1][:14] for o in offences]
    assert kinds == ["no caption", "no caption", "an unnumbered "]
    assert readability.check_figure_captions(phone["clean"]) == []


def test_errors_and_warnings_on_the_console_are_flagged_but_not_plain_logs(phone):
    offences = readability.check_console(phone["broken"].console_seen)
    assert offences == ["console.error: Got invalid theme mode: . Resetting to auto."]
    assert readability.check_console(phone["clean"].console_seen) == []
