"""Take the README's picture of a rendered chapter (needs `make book` first, and Debian's chromium).

    python scripts/screenshot.py            # writes book/images/screenshot.png

It opens the built chapter 3 in headless Chromium, scrolls to the interactive sampler, moves its
temperature slider, and photographs the window.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "_build" / "html" / "notebooks" / "03_sampling.html"
OUT = ROOT / "book" / "images" / "screenshot.png"


def main() -> None:
    if not PAGE.exists():
        raise SystemExit(f"{PAGE} is missing: run `make book` first")
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("Debian's chromium is not installed: run `make browser`")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 860}, device_scale_factor=1)
        page.goto(PAGE.as_uri(), wait_until="load")
        sampler = page.locator(".hl-explorer").last
        sampler.scroll_into_view_if_needed()
        slider = sampler.locator("input.hl-slider").first
        slider.fill(str(int(slider.get_attribute("max")) * 2 // 3))
        box = sampler.bounding_box()
        page.evaluate(f"window.scrollBy(0, {box['y'] - 120})")
        page.evaluate("document.activeElement.blur()")
        page.wait_for_timeout(500)
        page.screenshot(path=str(OUT))
        browser.close()
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
