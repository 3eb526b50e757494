"""A real JupyterLab on localhost and a real headless Chromium, for the widget tests.

The browser is Debian's `chromium` (or $LABKIT_CHROMIUM), driven by Playwright with
`executable_path`: nothing is downloaded. Where no browser is installed the tests are
skipped, unless LABKIT_REQUIRE_BROWSER=1 (as .ci/run sets), where they fail instead.
Screenshots go to artifacts/browser/.
"""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def _chromium() -> str | None:
    candidates = [os.environ.get("LABKIT_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"]
    for name in filter(None, candidates):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="session")
def chromium_path():
    path = _chromium()
    if path is None:
        message = "no Chromium here: apt-get install chromium (or set LABKIT_CHROMIUM)"
        if os.environ.get("LABKIT_REQUIRE_BROWSER") == "1":
            pytest.fail(f"LABKIT_REQUIRE_BROWSER=1 but {message}")
        pytest.skip(message)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def lab(tmp_path_factory, chromium_path):
    """JupyterLab serving a copy of notebooks/ on 127.0.0.1 with a fresh token."""
    root = tmp_path_factory.mktemp("lab")
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    news = root / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false", "checkForUpdates": false}')  # no "news?" pop-up over the page
    tracker = root / "settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text('{"windowingMode": "none"}')  # every cell in the DOM, not only the visible ones
    token = secrets.token_hex(16)
    port = _free_port()
    env = dict(os.environ,
               JUPYTERLAB_SETTINGS_DIR=str(root / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(root / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(root / "runtime"),
               MPLBACKEND="module://matplotlib_inline.backend_inline")
    log = (root / "lab.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root / 'notebooks'}", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        + (["--ServerApp.allow_root=True"] if os.geteuid() == 0 else []),
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"JupyterLab did not start; its log:\n{(root / 'lab.log').read_text()[-3000:]}")
        time.sleep(0.5)
    yield {"base": base, "token": token, "root": root / "notebooks"}
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="session")
def browser(chromium_path):
    from playwright.sync_api import expect, sync_playwright

    # expect(...) retries until its condition holds: as long as a page action may take.
    expect.set_options(timeout=60_000)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def open_notebook(lab, browser):
    """open_notebook("02_underflow_overflow.ipynb") -> a page with every cell run."""
    pages = []

    def _open(name: str, timeout_s: float = 240):
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        pages.append(page)
        page.set_default_timeout(60_000)
        # A workspace of its own, reset: JupyterLab would otherwise reopen the previous
        # test's notebook beside this one, and "Run All" would go to whichever is in front.
        workspace = f"t{len(pages)}-{secrets.token_hex(4)}"
        page.goto(f"{lab['base']}/lab/workspaces/{workspace}/tree/{name}?reset&token={lab['token']}")
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", state="attached")
        page.wait_for_selector("#jp-main-statusbar >> text=Idle", timeout=120_000)
        run_all_cells(page, timeout_s)
        return page

    yield _open
    for page in pages:
        page.close()


def _menu(page, menu: str, item: str) -> None:
    page.click(f".lm-MenuBar-itemLabel:text-is('{menu}')")
    page.click(f".lm-Menu-itemLabel:text-is('{item}')")


def run_all_cells(page, timeout_s: float) -> None:
    """Clear the stored outputs, Run All Cells, and wait until every code cell has run.

    The stored outputs are cleared first so that the prompts ("[3]:") seen afterwards can
    only come from this run.
    """
    _menu(page, "Edit", "Clear Outputs of All Cells")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]"
        ".every(e => !/\\d/.test(e.textContent))"
    )
    _menu(page, "Run", "Run All Cells")
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')];
            return prompts.length > 0 && prompts.every(e => /\\[\\d+\\]/.test(e.textContent));
        }""",
        timeout=timeout_s * 1000,
    )


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path


def drag(page, handle, dx: float) -> None:
    """Drag a slider's `handle` (a locator) `dx` pixels to the right, as a mouse would."""
    box = handle.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] / 2, y)
    page.mouse.down()
    page.mouse.move(box["x"] + dx, y, steps=8)
    page.mouse.up()
