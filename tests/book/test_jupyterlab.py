"""Chapter 3 live in JupyterLab: the live sampler's widgets answer a reader who moves a slider.

A JupyterLab server starts headless on a copy of the chapter (so nothing it saves can touch the committed
notebook), Chromium opens the notebook, runs every cell, moves the temperature slider and presses the sample
button; the next-token distribution must change and a continuation must appear. The kernel runs as a reader's
does, outside the batch mode the other tests set (in which chapters show no widgets).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.book
ROOT = Path(__file__).resolve().parents[2]
STEM = "03_sampling"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """(base URL, token) of a JupyterLab server whose root holds a copy of the chapter."""
    root, state = tmp_path_factory.mktemp("lab-root"), tmp_path_factory.mktemp("lab-state")
    shutil.copy(ROOT / "notebooks" / f"{STEM}.ipynb", root / f"{STEM}.ipynb")
    port, token = _free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k != "HALLUC_BATCH"}  # a reader's kernel: widgets on
    env |= {"JUPYTER_CONFIG_DIR": str(state / "config"), "JUPYTER_RUNTIME_DIR": str(state / "runtime")}
    log = open(state / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
         f"--LabApp.workspaces_dir={state / 'workspaces'}", f"--LabApp.user_settings_dir={state / 'settings'}",
         "--ServerApp.allow_root=True", "--LabApp.extension_manager=readonly"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    json.load(r)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start:\n{(state / 'server.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_chapter_3s_live_sampler_answers_the_temperature_slider_and_samples(browser, lab):
    base, token = lab
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith((base, "data:", "blob:"))
                  else route.abort())  # nothing leaves the machine
    page = context.new_page()
    try:
        page.goto(f"{base}/lab/tree/{STEM}.ipynb?token={token}", wait_until="load")
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget "
                               "&& window.jupyterapp.shell.currentWidget.sessionContext "
                               "&& window.jupyterapp.shell.currentWidget.sessionContext.session "
                               "&& window.jupyterapp.shell.currentWidget.sessionContext.session.kernel",
                               timeout=120_000)
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        shown = page.locator(".halluc-live-distribution")
        shown.wait_for(state="visible", timeout=300_000)  # the whole chapter runs first, at the reader's scale
        before = shown.inner_text()

        slider = page.locator(".widget-hslider", has_text="temperature")
        handle = slider.locator(".noUi-handle")
        handle.focus()
        for _ in range(10):  # 1.0 -> 2.0 in steps of 0.1
            handle.press("ArrowRight")
        # the widget replaces its table on every redraw: query it afresh each time
        page.wait_for_function("old => document.querySelector('.halluc-live-distribution').innerText !== old",
                               arg=before, timeout=30_000)
        assert slider.locator(".widget-readout").inner_text().strip() == "2.00"
        after = shown.inner_text()
        assert after != before, "moving the temperature did not change the distribution"

        page.get_by_role("button", name="sample a continuation").click()
        sample = page.locator(".halluc-live-sample")
        sample.wait_for(state="visible", timeout=60_000)
        assert "→" in sample.inner_text() and len(sample.inner_text().split("→")[1].split()) >= 1
    finally:
        context.close()
