"""Build the book once, serve it on localhost, and open its pages in headless Chromium.

Fixtures:

- ``book``: the build (its HTML folder and the Sphinx log), made fresh in a temporary folder;
- ``open_page(path)``: a Playwright page on ``path`` (e.g. ``"notebooks/03_sampling.html"``)
  loaded from a local server with every request that would leave the machine blocked and
  recorded in ``offsite_requests``;
- ``offsite_requests``: the URLs of those blocked requests, for the whole session.

Chromium is Debian's (``make browser`` installs it); Playwright only drives it.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@dataclass
class Book:
    """A fresh build of the book."""

    html: Path  # the HTML folder
    log: str  # everything the build printed


@pytest.fixture(scope="session")
def book(tmp_path_factory) -> Book:
    out = tmp_path_factory.mktemp("book")
    exe = Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run([str(exe), "build", str(ROOT), "--path-output", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"jupyter-book build failed:\n{log[-4000:]}")
    return Book(html=out / "_build" / "html", log=log)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def server(book):
    handler = functools.partial(_QuietHandler, directory=str(book.html))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("Debian's chromium is not installed: run `make browser` (apt-get install chromium)")
    with sync_playwright() as pw:
        instance = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        yield instance
        instance.close()


@pytest.fixture(scope="session")
def offsite_requests() -> list[str]:
    return []


@pytest.fixture
def open_page(browser, server, offsite_requests):
    contexts = []

    def block_offsite(route):
        url = route.request.url
        if url.startswith((server, "data:", "blob:", "about:")):
            route.continue_()
        else:
            offsite_requests.append(url)
            route.abort()

    def open_(path: str):
        context = browser.new_context()
        context.route("**/*", block_offsite)
        contexts.append(context)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.js_errors = errors
        response = page.goto(f"{server}/{path}", wait_until="load")
        assert response is not None and response.ok, f"{path}: HTTP {response and response.status}"
        return page

    yield open_
    for context in contexts:
        context.close()
