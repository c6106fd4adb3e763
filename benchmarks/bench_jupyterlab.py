"""Time to the explorer's first figure in a real JupyterLab, as a user meets it: ``notebooks/explore.py`` opened
in Chromium with *Open With → Jupytext Notebook*, its kernel started cold, *Run → Run All Cells*.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_jupyterlab.py [--repeats 1]

Each repeat starts ``jupyter lab`` (``--allow-root`` when run as root, a fresh token, 127.0.0.1 only, a free port)
on a temporary folder holding a copy of ``explore.py`` (the user's folder: its default ``out`` and ``cache`` are
``results/`` there, so the cache is cold and nothing is written into the checkout), opens it in Debian's
Chromium (``/usr/bin/chromium``, headless, through Playwright; never a downloaded browser), runs all cells on the
notebook's default settings and times, from the click that opens the notebook (its kernel starts then):
the kernel idle, the first plotly figure drawn in the page, every cell done, and one widget moved (layer 1) to
its redrawn figures. Goal (issue 48): first figure under 30 s on the 2-core reference machine. Writes
``benchmarks/results/bench_jupyterlab.json`` and ``.md``, with the load average at the start and end of each repeat.
"""

import argparse
import contextlib
import datetime
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from playwright.sync_api import Page, sync_playwright
from results_file import write_results

from fca_workbench.notebooks.reproduce import NOTEBOOK_DIR, ensure_kernel

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
# server extensions the notebook does not use (Panel's takes seconds to import on a loaded machine)
UNUSED_SERVER_EXTENSIONS = ("panel.io.jupyter_server_extension", "jupyter_lsp", "jupyter_server_terminals")
PLOTS = "document.querySelectorAll('.js-plotly-plot').length"
ALL_CELLS_RAN = """() => { const p = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
                           return p.length > 0 && p.every(x => /\\[\\d+\\]/.test(x.textContent)); }"""
TITLES = "() => [...document.querySelectorAll('.js-plotly-plot')].map(el => el.layout.title.text).join('|')"
TIMEOUT_MS = 300_000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def jupyter_lab(folder: Path) -> Iterator[str]:
    """``jupyter lab`` serving ``folder`` on 127.0.0.1 with a fresh token; yields its base URL with the token once
    it answers, and stops it afterwards."""
    port, token = free_port(), secrets.token_hex(16)
    state = folder.parent / "lab-state"
    settings = state / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')  # no news toast, no fetch
    command = [
        str(Path(sys.executable).parent / "jupyter"),
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={folder}",
        *(["--allow-root"] if os.geteuid() == 0 else []),  # a lab container's root: refused without it
        f"--LabApp.user_settings_dir={state / 'settings'}",
        f"--LabApp.workspaces_dir={state / 'workspaces'}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        *(f"--ServerApp.jpserver_extensions={name}=False" for name in UNUSED_SERVER_EXTENSIONS),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "JUPYTER_RUNTIME_DIR": str(state / "runtime"),
    }
    with open(state / "lab.log", "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=folder, env=env)
        try:
            deadline = time.monotonic() + 180
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=5):
                        break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"jupyter lab did not start:\n{(state / 'lab.log').read_text()}") from None
                    time.sleep(0.5)
            yield f"http://127.0.0.1:{port}/lab?token={token}"
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def open_as_notebook(page: Page, name: str) -> None:
    """What the guide tells a user: right-click the file, Open With → Jupytext Notebook."""
    page.locator(".jp-DirListing-item", has_text=name).first.click(button="right")
    page.locator(".lm-Menu-itemLabel", has_text="Open With").first.hover()
    page.locator(".lm-Menu-itemLabel", has_text="Jupytext Notebook").first.click()


def time_once(folder: Path) -> dict:
    """One cold run: lab started, notebook opened, Run All, first figure, all cells, a widget moved."""
    shutil.copy(NOTEBOOK_DIR / "explore.py", folder / "explore.py")
    load_start = os.getloadavg()
    started = time.perf_counter()
    with jupyter_lab(folder) as url, sync_playwright() as p:
        lab_up = time.perf_counter() - started
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.goto(url, timeout=TIMEOUT_MS)
            page.locator(".jp-DirListing-item", has_text="explore.py").first.wait_for(timeout=TIMEOUT_MS)
            opened = time.perf_counter()
            open_as_notebook(page, "explore.py")
            page.get_by_text("Python (fca-workbench) | Idle").wait_for(timeout=TIMEOUT_MS)
            idle = time.perf_counter() - opened
            page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
            page.locator("li[data-command='runmenu:run-all']").click()
            page.wait_for_function(f"{PLOTS} >= 1", timeout=TIMEOUT_MS, polling=100)
            first_figure = time.perf_counter() - opened
            page.wait_for_function(ALL_CELLS_RAN, timeout=TIMEOUT_MS, polling=100)
            all_cells = time.perf_counter() - opened
            before = page.evaluate(TITLES)
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")
            if errors.count() or "featuregate-s0, all layers" not in before:
                raise RuntimeError(f"the notebook did not draw the explorer: {before!r}; {errors.all_inner_texts()}")
            moved = time.perf_counter()
            layer = page.locator(".widget-dropdown").filter(has=page.locator("label", has_text="layer"))
            layer.locator("select").select_option(label="layer 1")
            page.wait_for_function(
                f"() => {{ const t = ({TITLES})(); return t !== {before!r} && t.includes('layer 1'); }}",
                timeout=TIMEOUT_MS,
                polling=100,
            )
            widget = time.perf_counter() - moved
        finally:
            browser.close()
    return {
        "lab_started_s": round(lab_up, 1),
        "kernel_idle_s": round(idle, 1),
        "first_figure_s": round(first_figure, 1),
        "all_cells_s": round(all_cells, 1),
        "layer_widget_redraw_s": round(widget, 2),
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
    }


def markdown(runs: list[dict], when: str) -> str:
    rows = "\n".join(
        f"| {i} | {r['first_figure_s']} | {r['kernel_idle_s']} | {r['all_cells_s']} | {r['layer_widget_redraw_s']} "
        f"| {r['lab_started_s']} | {r['load_average_start'][0]} → {r['load_average_end'][0]} |"
        for i, r in enumerate(runs, start=1)
    )
    return (
        "# bench_jupyterlab: explore.py in JupyterLab in Chromium, cold kernel to first figure\n\n"
        "    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_jupyterlab.py\n\n"
        f"{when}, {os.cpu_count()} cores. Seconds from the click that opens `explore.py` as a notebook (Open With →"
        " Jupytext Notebook; its kernel starts cold then; Run All once it is idle), on the notebook's default settings"
        " with a cold coefficient cache; the widget column is selecting layer 1 until both figures are redrawn. Goal:"
        " first figure under 30 s. The load average says how shared the machine was: above the core count, other jobs"
        " were running.\n\n"
        "| run | first figure (s) | kernel idle (s) | all cells (s) | layer widget redraw (s) | lab started (s) "
        "| load average (1 min) start → end |\n|---|---|---|---|---|---|---|\n"
        f"{rows}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    ensure_kernel()  # the notebook names the kernel fca-workbench
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    runs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="bench-jupyterlab-") as tmp:
            user = Path(tmp) / "my-folder"
            user.mkdir()
            runs.append(time_once(user))
    write_results("bench_jupyterlab", {"measured": when, "cores": os.cpu_count(), "runs": runs}, markdown(runs, when))


if __name__ == "__main__":
    main()
