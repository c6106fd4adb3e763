"""The explorer notebook (notebooks/explore.py) in JupyterLab, in a real browser: Run All, then the model, layer and
condition widgets.

Starts ``jupyter lab`` (no browser, a token, a free loopback port) on a temporary copy of the notebook whose
parameters point at three tiny checkpoints (one without a controller) and temporary ``out`` / ``audits`` / ``cache`` folders (nothing is
written into the repository), opens it in Debian's Chromium (``/usr/bin/chromium``, headless) through
Playwright and saves screenshots to ``artifacts/screenshots/``. Without Chromium or Playwright the test fails
under CI and is skipped elsewhere.
"""

import json
import os
import re
import secrets
import shutil
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, free_port, require_browser, serving
from test_dashboard import ROOT, SCREENSHOTS

from fca_workbench.notebooks.notebook_execution import read_notebook
from fca_workbench.notebooks.reproduce import KERNEL_NAME, ensure_kernel

NOTEBOOK = ROOT / "notebooks" / "explore.py"
# server extensions the notebook does not use (Panel's takes ~9 s to import on the loaded reference machine)
UNUSED_SERVER_EXTENSIONS = ("panel.io.jupyter_server_extension", "jupyter_lsp", "jupyter_server_terminals")
STDERR = '.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]'
# A dropdown's chosen label, its spaces as typed (ipywidgets shows them as no-break spaces)
SELECTED_LABEL = "s => s.options[s.selectedIndex].text.replace(/\\u00a0/g, ' ')"
# Every plotly figure on the page: its title and each trace's values (heatmap z, line y).
FIGURES = """() => [...document.querySelectorAll('.js-plotly-plot')].map(el => ({
    title: el.layout.title.text, data: JSON.stringify(el.data.map(d => d.z || d.y))}))"""


def working_copy(folder: Path, checkpoints: dict) -> Path:
    """explore.py as a notebook with its parameters overridden as papermill injects them: tiny models, temporary
    outputs."""
    from papermill.parameterize import parameterize_notebook

    source = read_notebook(NOTEBOOK)
    source.metadata["papermill"] = {}  # what papermill's own reader adds, and parameterize_notebook fills
    for cell in source.cells:
        cell.metadata.setdefault("tags", [])  # as papermill's reader gives every cell, and parameterize_notebook reads
    nb = parameterize_notebook(
        source,
        {
            "checkpoints": [str(c) for c in checkpoints.values()],
            "max_windows": 4,
            "batch_size": 4,
            "out": str(folder / "out"),
            "audits": str(folder / "audits"),
            "cache": str(folder / "cache"),
        },
    )
    nb.metadata.pop("jupytext", None)  # an .ipynb of its own, not one paired with a percent-format source
    path = folder / "notebooks" / "explore.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    return path


@contextmanager
def jupyter_lab(folder: Path, root_dir: Path):
    """``jupyter lab`` on a free loopback port with a token, its state kept in ``folder``; yields (URL, token) once
    the server answers."""
    port, token = free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "JUPYTER_RUNTIME_DIR": str(folder / "runtime"),
        "OMP_NUM_THREADS": "1",
    }
    settings = folder / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')  # no news toast, no fetch
    command = [
        str(Path(sys.executable).parent / "jupyter"),
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root_dir}",
        "--allow-root",
        f"--LabApp.user_settings_dir={folder / 'settings'}",
        f"--LabApp.workspaces_dir={folder / 'workspaces'}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
        *(f"--ServerApp.jpserver_extensions={name}=False" for name in UNUSED_SERVER_EXTENSIONS),
    ]
    base = f"http://127.0.0.1:{port}"
    with serving(command, f"{base}/api/status?token={token}", folder / "lab.log", "jupyter lab", cwd=root_dir, env=env):
        yield base, token


@pytest.fixture
def lab(tiny_checkpoints, tmp_path):
    require_browser()
    ensure_kernel()  # the explorer notebook names the kernel fca-workbench
    models = {
        "featuregate-tiny": tiny_checkpoints["featuregate"],
        "dense-tiny": tiny_checkpoints["dense"],
        "muddpythia-tiny": tiny_checkpoints["muddpythia"],
    }
    checkpoints = {name: shutil.copytree(folder, tmp_path / "checkpoints" / name) for name, folder in models.items()}
    path = working_copy(tmp_path, checkpoints)
    with jupyter_lab(tmp_path, path.parent) as (base, token):
        start_kernel(base, token, path.name)
        yield f"{base}/lab/tree/{path.name}?token={token}", tmp_path


def start_kernel(base: str, token: str, notebook: str) -> None:
    """The notebook's session with the fca-workbench kernel, started through the REST API, so the page finds it
    (else JupyterLab may ask which kernel to start while its list of kernels still loads)."""

    def call(path, data=None):
        request = urllib.request.Request(
            f"{base}{path}",
            data=json.dumps(data).encode() if data else None,
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    call("/api/sessions", {"path": notebook, "name": notebook, "type": "notebook", "kernel": {"name": KERNEL_NAME}})


@pytest.mark.timeout(600)  # a hang fails here instead of eating CI's time; the test takes ~1 min
def test_explore_notebook_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    url, folder = lab
    committed = NOTEBOOK.read_bytes()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def figures(page) -> dict:
        return {f["title"]: f["data"] for f in page.evaluate(FIGURES)}

    def changed(page, before: dict, title: str) -> dict:
        """Wait until both figures were redrawn, one of them with ``title`` in its title: on the state, for as long
        as a loaded machine needs (a new model is loaded and captured first); the bound only turns a hang into a
        message before the test's own timeout."""
        deadline = time.monotonic() + 400
        while True:
            now = figures(page)
            if len(now) == 2 and any(title in t for t in now) and not set(now.items()) & set(before.items()):
                return now
            assert time.monotonic() < deadline, (
                f"the figures did not change to {title!r}: {list(now)}; the outputs say {outputs(page)}; "
                f"the kernel: {kernel_status(page)}; the browser's console: {console[-5:]}"
            )
            page.wait_for_timeout(200)

    def dropdown(page, label: str):
        return page.locator(".widget-dropdown").filter(has=page.locator("label", has_text=re.compile(f"^{label}$")))

    def kernel_status(page) -> str:
        status = page.locator(".jp-StatusBar-TextItem", has_text="Python (fca-workbench)")
        return " ".join(status.all_inner_texts())

    def outputs(page) -> list[str]:
        return [t.strip()[:300] for t in page.locator(".jp-OutputArea-output").all_inner_texts() if t.strip()]

    def errors(page) -> list[str]:
        texts = page.locator(f"{STDERR}, .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")
        return [t for t in texts.all_inner_texts() if "Traceback" in t or "Error" in t]

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        console: list[str] = []
        page.on("console", lambda message: console.append(f"{message.type}: {message.text[:300]}"))
        try:
            page.goto(url, timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            page.get_by_text("Python (fca-workbench) | Idle").wait_for(timeout=120_000)
            page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
            page.locator("li[data-command='runmenu:run-all']").click()

            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length == 2", timeout=180_000)
            page.wait_for_function(  # every code cell ran (Run All queues them; [*] while waiting or running)
                """() => { const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
                           return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent)); }""",
                timeout=120_000,
            )
            dropdown(page, "model").scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / "jupyterlab-01-run-all.png"))
            assert errors(page) == []
            first = figures(page)
            assert any(t.startswith("featuregate-tiny, all layers") for t in first), list(first)
            selected = {
                w: dropdown(page, w).locator("select").evaluate(SELECTED_LABEL) for w in ("model", "layer", "condition")
            }
            assert selected == {"model": "featuregate-tiny", "layer": "all layers", "condition": "cross_input"}

            dropdown(page, "layer").locator("select").select_option(label="layer 1")
            by_layer = changed(page, first, "featuregate-tiny, layer 1")
            dropdown(page, "condition").locator("select").select_option(label="token_shuffle")
            by_condition = changed(page, by_layer, "ΔNLL of token_shuffle (layer 1)")
            dropdown(page, "model").locator("select").select_option(label="dense-tiny")  # no controller: a message
            page.get_by_text("dense-tiny has no controller (dense): no coefficients to explore").wait_for(
                timeout=60_000
            )
            assert page.evaluate(FIGURES) == [] and dropdown(page, "layer").locator("select").is_disabled()
            dropdown(page, "model").locator("select").select_option(label="muddpythia-tiny")
            by_model = changed(page, by_condition, "muddpythia-tiny, layer 1")  # the layer and condition are kept
            assert any("ΔNLL of token_shuffle" in t for t in by_model)
            page.screenshot(path=str(SCREENSHOTS / "jupyterlab-02-muddpythia-layer-1.png"))
            assert errors(page) == []
        except Exception:
            page.screenshot(path=str(SCREENSHOTS / "jupyterlab-failed.png"), full_page=True)
            raise
        finally:
            browser.close()
    written = {p.name for p in (folder / "out").rglob("*") if p.is_file()}
    assert {"explore_coefficients.html", "explore_delta_nll.html", "explore_window.csv"} <= written
    assert NOTEBOOK.read_bytes() == committed  # the lab worked on its copy
