"""Dashboard speed and load, measured in one run on this machine (CPU).

    .venv/bin/python benchmarks/bench_dashboard.py [--checkpoints featuregate-s0 muddpythia-s0]
        [--repeats 30] [--sessions 10] [--duration 60] [--seeds 100000] [--analysed-seeds 300]
        [--memory-sessions 40] [--skip-latency] [--skip-load] [--skip-memory]

Writes benchmarks/results/bench_dashboard.json and .md (a section skipped keeps its last figures):

1. Update latency (in process, torch with 1 thread, one 256-token eval window): a single-layer intervention
   replayed through the view model's own prefix cache of the window (``DashboardSession``: from layer l on)
   against a full frozen forward of the same window and the values the view assigns, for every layer and the conditions cross_input, token_shuffle and layer_mean: p50 / p95 ms
   of each and their ratio; plus the whole server-side update (``DashboardSession.analyse``, result cache
   cleared each time). Goal: update p95 <= 300 ms.
2. Load on loopback: ``fca dashboard`` in a subprocess, then N concurrent browser-less sessions (Bokeh's
   websocket client, one thread each) changing widgets (layer, intervention, window, seed, checkpoint) for
   the given duration, each waiting for the app's "update #k" before its next change; a share of the actions
   are on the results view instead (switch to the "Finished audits" tab, pick another audit, wait until it is
   shown with its tables and per-layer heatmap; the server's ``--results`` folder holds two fresh audits of the
   first checkpoint, in ``fca audit``'s and ``fca reproduce``'s layouts, and a truncated audit.json). Errors (goal 0),
   p50 / p95 of the client-observed update latency, server RSS before (models loaded, no session open), at
   peak and after every session closed (goal: back within 10% of before). The loop is bounded in time and
   talks only to 127.0.0.1.
3. Memory a server left running accumulates (issue 16): in process, RSS after the cross_input derangements
   of 100k seeds (what stepping the Seed box asks for) and after whole cross_input updates over a few hundred
   seeds (prefix and result caches included); on loopback, server RSS with 40 sessions open, under the
   default ``--max-sessions`` and with no limit; in process, RSS of loaded checkpoints and after
   ``ModelPool`` unloads them as idle.
"""

import argparse
import asyncio
import functools
import html
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fca_workbench.viewmodel import (
    DEFAULT_MAX_SESSIONS,
    DashboardSession,
    ModelPool,
    Registry,
    SharedModel,
    release_memory,
    window_input,
)
from fca_workbench.viewmodel.live import engine_text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
UPDATE = re.compile(r"data-update=(?:&#x27;|')(\d+)(?:&#x27;|') data-state=(?:&#x27;|')(\w+)")
SERVER_MS = re.compile(r"update #\d+: (\d+) ms")  # the server's own time from widget change to rendered views


def percentiles(values) -> dict:
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return {"n": 0, "p50_ms": None, "p95_ms": None}
    return {
        "n": int(values.size),
        "p50_ms": float(np.percentile(values, 50)),
        "p95_ms": float(np.percentile(values, 95)),
    }


def timed_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


# ---------------------------------------------------------------------------------------------- latency


@torch.no_grad()
def latency(name: str, folder: Path, repeats: int, calibration_windows: int | None) -> dict:
    shared = SharedModel(folder, calibration_windows=calibration_windows)
    model = shared.model
    text = window_input(shared, 0)
    ids = text.ids
    result = {"checkpoint": name, "arch": shared.arch, "tokens": ids.shape[1], "layers": len(shared.slot_shapes)}
    for _ in range(3):  # warm-up
        model(ids)
    if not shared.has_coefficients:
        result["full_forward"] = percentiles([timed_ms(lambda: model(ids)) for _ in range(repeats)])
        result["note"] = "no controller: nothing to intervene on"
        return result
    result["static_profiles_first_use_s"] = timed_ms(shared.profiles) / 1000
    session = DashboardSession()
    prefix = session.replays.prefix(shared.session, engine_text(text))  # what every update of this window reuses
    conditions = ("cross_input", "token_shuffle", "layer_mean")
    donor = shared.donor_for(0, 0)
    intervened = {
        (c, l): session.condition_values(shared, text, c, 0, donor, l)
        for c in conditions
        for l in range(len(shared.slot_shapes))
    }
    full: list[float] = []
    cached: list[float] = []
    per_layer: dict[int, dict[str, list[float]]] = {
        l: {"full": [], "prefix": []} for l in range(len(shared.slot_shapes))
    }
    for repeat in range(repeats):
        for layer in range(len(shared.slot_shapes)):
            condition = conditions[(repeat + layer) % len(conditions)]
            values = intervened[(condition, layer)]
            if repeat == 0:  # exactness, once per layer
                assert torch.equal(prefix.logits(values, [layer]), model.replay_run(ids, values))
            t_full = timed_ms(functools.partial(model.replay_run, ids, values))
            t_prefix = timed_ms(functools.partial(prefix.logits, values, [layer]))
            full.append(t_full)
            cached.append(t_prefix)
            per_layer[layer]["full"].append(t_full)
            per_layer[layer]["prefix"].append(t_prefix)
    updates = []
    for repeat in range(repeats):
        layer = repeat % len(shared.slot_shapes)
        condition = conditions[repeat % len(conditions)]
        session.results.clear()  # recompute, as after a widget change
        updates.append(
            timed_ms(lambda c=condition, l=layer, r=repeat: session.analyse(name, shared, text, c, l, seed=r))
        )
    result.update(
        {
            "full_forward": percentiles(full),
            "prefix_single_layer": percentiles(cached),
            "ratio_p50_prefix_over_full": float(np.median(cached) / np.median(full)),
            "per_layer_ratio_p50": {
                str(l): float(np.median(v["prefix"]) / np.median(v["full"])) for l, v in per_layer.items()
            },
            "dashboard_update": percentiles(updates),
        }
    )
    return result


# ---------------------------------------------------------------------------------------------- load


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Client:
    """One browser-less session: Bokeh's websocket client, driving the app's widgets by their CSS classes.

    The client's event loop runs without a break in its own thread, reading whole messages (stopping it
    mid-read, as Bokeh's ``force_roundtrip`` or a timeout would, leaves a half-read multi-frame message and
    garbles the stream); widget changes are handed to that loop, and ``wait`` polls the app's status line.
    """

    def __init__(self, url: str, timeout: float = 120):
        self.closing = False
        self.error: Exception | None = None
        self.full = False  # got the "server is full" page instead of the app
        self.ready = threading.Event()
        self.update = 0
        self.server_ms: float | None = None
        self.thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self.thread.start()
        if not self.ready.wait(timeout) or self.error:
            raise RuntimeError(f"session did not start: {self.error!r}")
        if self.full:
            return
        ms, state = self.wait(timeout)  # the first update, after the document is ready
        if state is None:
            raise RuntimeError("session got no first update")

    def _run(self, url: str):
        import panel.models.plotly  # noqa: F401  (registers Panel's Bokeh models for the client)
        from bokeh.client import pull_session
        from bokeh.events import DocumentReady

        try:
            asyncio.set_event_loop(asyncio.new_event_loop())
            self.session = pull_session(url=url)
            self.widgets: dict[str, Any] = {}  # Bokeh models by CSS class
            self.connection = self.session._connection
            # what a browser sends once drawn: the server builds the app (or the "full" page) only then
            self.session.document.callbacks.send_event(DocumentReady())
        except Exception as exc:
            self.error = exc
            self.ready.set()
            return
        self.connection._loop.run_sync(self._pump)

    def _found(self) -> bool:
        """Whether the page (the app or the "server is full" page) has arrived; its widgets by CSS class."""
        self.widgets = {
            css: model
            for model in self.session.document.models
            for css in getattr(model, "css_classes", None) or []
            if css.startswith("fca-")
        }
        self.full = "fca-server-full" in self.widgets
        if not self.full and "fca-status" in self.widgets:
            self.status = self.widgets["fca-status"]
        return self.full or "fca-status" in self.widgets

    async def _pump(self):
        from bokeh.protocol.messages.patch_doc import patch_doc

        # Read whole messages one after another and apply the document patches. (The client's own loop,
        # ``_loop_until``, recurses once per message and overflows the stack after a few hundred.)
        while not self.closing:
            message = await self.connection._pop_message()
            if message is None:  # closed
                if not self.ready.is_set():
                    self.error = RuntimeError("the session closed before its page arrived")
                    self.ready.set()
                return
            if isinstance(message, patch_doc):
                self.session._handle_patch(message)
                if not self.ready.is_set() and self._found():
                    self.ready.set()

    def state(self):
        match = UPDATE.search(self.status.text or "")
        return (int(match.group(1)), match.group(2)) if match else (0, None)

    def wait(self, timeout: float) -> tuple[float, str | None]:
        """Wait for the app's next update; (ms, state), state None on timeout."""
        start = time.perf_counter()
        while time.perf_counter() - start < timeout:
            number, state = self.state()
            if number > self.update:
                self.update = number
                server = SERVER_MS.search(self.status.text or "")
                self.server_ms = float(server.group(1)) if server else None
                return (time.perf_counter() - start) * 1000, state
            time.sleep(0.01)
        return (time.perf_counter() - start) * 1000, None

    def set(self, widget: str, value, attribute: str = "value"):
        self.connection._loop.add_callback(setattr, self.widgets[widget], attribute, value)  # thread-safe hand-over

    def wait_for_audit(self, name: str, timeout: float) -> tuple[float, bool]:
        """Wait until the results view shows audit ``name``; (ms, shown)."""
        start = time.perf_counter()
        title = f"<h3 class='fca-results-title'>{html.escape(name)}</h3>"
        while time.perf_counter() - start < timeout:
            if title in html.unescape(self.widgets["fca-results-header"].text or ""):
                return (time.perf_counter() - start) * 1000, True
            time.sleep(0.01)
        return (time.perf_counter() - start) * 1000, False

    def close(self):
        self.closing = True
        self.connection._loop.add_callback(self.session.close)
        self.thread.join(timeout=10)


@contextmanager
def dashboard_server(names: list[str], registry: Registry, calibration_windows, *argv):
    """``fca dashboard`` serving ``names`` on a free loopback port; yields (process, url, log path)."""
    with tempfile.TemporaryDirectory() as tmp:
        registry_file = Path(tmp) / "registry.json"
        registry_file.write_text(json.dumps({n: str(registry.folder(n)) for n in names}))
        port = free_port()
        url = f"http://127.0.0.1:{port}/"
        log_path = Path(tmp) / "server.log"
        command = [
            sys.executable,
            "-m",
            "fca_workbench",
            "dashboard",
            "--port",
            str(port),
            "--registry",
            str(registry_file),
            *argv,
        ]
        if calibration_windows:
            command += ["--calibration-windows", str(calibration_windows)]
        with open(log_path, "w") as log:
            server = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:  # a static file: a page would open a session
                    with urllib.request.urlopen(url + "static/js/bokeh.min.js", timeout=5):
                        break
                except OSError as error:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("dashboard server did not start:\n" + log_path.read_text()) from error
                    time.sleep(0.5)
            yield server, url, log_path
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def results_folder(folder: Path, checkpoint: Path) -> Path:
    """A results folder for the results view: a small per-layer audit of ``checkpoint`` (``fca audit``'s
    layout), a copy in ``fca reproduce``'s layout and a truncated audit.json (listed with a message)."""
    from fca_workbench.audit.run import AuditSettings, run_audit

    first = folder / f"audit-{checkpoint.name}"
    run_audit(
        AuditSettings(checkpoint=str(checkpoint), max_windows=8, resamples=200, latency_repeats=2, per_layer=True),
        first,
    )
    shutil.copytree(first, folder / "run" / "audits" / checkpoint.name, ignore=shutil.ignore_patterns("cache"))
    text = (first / "audit.json").read_text()
    (folder / "truncated").mkdir()
    (folder / "truncated" / "audit.json").write_text(text[: len(text) // 2])
    return folder


def load_run(names: list[str], registry: Registry, sessions: int, duration: float, calibration_windows) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        results = results_folder(Path(tmp) / "results", registry.folder(names[0]))
        with dashboard_server(names, registry, calibration_windows, "--results", str(results)) as (
            server,
            url,
            log_path,
        ):
            return drive(server, url, names, sessions, duration, log_path)


def drive(server, url, names, sessions, duration, log_path) -> dict:
    # warm-up: one session loads every checkpoint and its static profiles, and draws every audit of the
    # results view once (what the process keeps for all sessions: models, profiles, rendered audit tables),
    # then leaves

    def warm_up():
        client = Client(url)
        for name in names:
            for widget, value in (
                ("fca-checkpoint", name),
                ("fca-condition", "layer_mean"),
                ("fca-condition", "cross_input"),
            ):
                if client.widgets[widget].value != value:  # setting the same value sends nothing
                    client.set(widget, value)
                    client.wait(300)
        client.set("fca-tabs", 1, "active")
        for audit, _ in client.widgets["fca-audit"].options:
            client.set("fca-audit", audit)
            client.wait_for_audit(audit, 120)
        client.close()

    single: list[float] = []
    single_server: list[float | None] = []

    def alone():  # one session on its own: the latency without queueing behind other sessions
        client = Client(url)
        layers = [value for value, _ in client.widgets["fca-layer"].options]
        for step in range(20):
            layer = layers[(step % (len(layers) - 1)) + 1] if step % 5 else layers[0]
            if client.widgets["fca-layer"].value == layer:
                continue
            client.set("fca-layer", layer)
            ms, state = client.wait(60)
            if state == "ok":
                single.append(ms)
                single_server.append(client.server_ms)
        client.close()

    for job in (warm_up, alone):
        thread = threading.Thread(target=job)
        thread.start()
        thread.join()
    time.sleep(15)  # unused sessions are reaped every 5 s after 5 s
    before = rss_mib(server.pid)

    samples, stop_sampling = [], threading.Event()

    def sample():
        while not stop_sampling.is_set():
            samples.append(rss_mib(server.pid))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    latencies: list[float] = []
    server_side: list[float | None] = []
    errors: list[str] = []
    lock = threading.Lock()
    results_latencies = []
    clients_open = []
    end = time.monotonic() + duration

    def user(index: int):
        rng = random.Random(index)
        try:
            client = Client(url)
        except Exception as exc:  # counted, not fatal
            with lock:
                errors.append(f"session {index} could not connect: {exc!r}")
            return
        with lock:
            clients_open.append(client)
            if client.full:
                errors.append(f"session {index}: the server is full (raise --max-sessions)")
                return
        layers = [value for value, _ in client.widgets["fca-layer"].options]
        conditions = list(client.widgets["fca-condition"].options)
        audits = [value for value, _ in client.widgets["fca-audit"].options]
        while time.monotonic() < end:
            if rng.random() < 0.25:  # the results view: its tab, then another audit with its tables and figure
                client.set("fca-tabs", 1, "active")
                audit = rng.choice([a for a in audits if a != client.widgets["fca-audit"].value] or audits)
                client.set("fca-audit", audit)
                ms, shown = client.wait_for_audit(audit, 60)
                client.set("fca-tabs", 0, "active")
                with lock:
                    if shown:
                        results_latencies.append(ms)
                    else:
                        errors.append(f"session {index}, results view: audit {audit} not shown within 60 s")
                continue
            choices = {
                "fca-layer": layers,
                "fca-condition": conditions,
                "fca-window": list(range(200)),
                "fca-seed": list(range(50)),
                "fca-checkpoint": names,
            }
            action = rng.choice(
                ["fca-layer", "fca-layer", "fca-condition", "fca-condition", "fca-window", "fca-seed", "fca-checkpoint"]
            )
            candidates = [v for v in choices[action] if v != client.widgets[action].value]
            if not candidates:  # e.g. a single checkpoint: nothing to change to
                continue
            client.set(action, rng.choice(candidates))
            ms, state = client.wait(60)
            with lock:
                if state == "ok":
                    latencies.append(ms)
                    if client.server_ms is not None:
                        server_side.append(client.server_ms)
                else:
                    errors.append(f"session {index}, {action}: {'timeout' if state is None else 'error shown'}")
            if action == "fca-checkpoint":  # the layer choices follow the checkpoint
                layers = [value for value, _ in client.widgets["fca-layer"].options]

    threads = [threading.Thread(target=user, args=(i,)) for i in range(sessions)]
    started, server_cpu, clients_cpu = time.monotonic(), cpu_seconds(server.pid), cpu_seconds(os.getpid())
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    server_cpu, clients_cpu = cpu_seconds(server.pid) - server_cpu, cpu_seconds(os.getpid()) - clients_cpu
    actions = len(latencies) + len(results_latencies)
    for client in clients_open:
        client.close()
    closed_at = time.monotonic()
    after = None
    while time.monotonic() - closed_at < 45:  # sessions are reaped within ~10 s
        time.sleep(3)
        after = rss_mib(server.pid)
        if after <= before * 1.10 and time.monotonic() - closed_at > 15:
            break
    stop_sampling.set()
    sampler.join()
    log = log_path.read_text()
    return {
        "sessions": sessions,
        "duration_s": elapsed,
        "checkpoints": names,
        "updates": len(latencies),
        "errors": len(errors),
        "error_examples": errors[:5],
        "update_latency": percentiles(latencies),
        "results_view_latency": percentiles(results_latencies),
        "server_side_update_latency": percentiles(server_side),
        "single_session_update_latency": percentiles(single),
        "single_session_server_side": percentiles([x for x in single_server if x is not None]),
        "cpu_ms_per_action": {
            "server": 1000 * server_cpu / max(actions, 1),
            "clients": 1000 * clients_cpu / max(actions, 1),
        },
        "server_rss_mib": {"before": before, "peak": max(samples) if samples else None, "after": after},
        "rss_after_over_before": after / before if after else None,
        "seconds_after_close": time.monotonic() - closed_at,
        "server_tracebacks": log.count("Traceback"),
    }


# ---------------------------------------------------------------------------------------------- memory


def settled_rss_mib() -> float:
    """This process's RSS once garbage is collected and freed pages are handed back."""
    release_memory()
    return rss_mib(os.getpid())


def seed_memory(name: str, folder: Path, seeds: int, analysed: int, calibration_windows) -> dict:
    """RSS growth over ``seeds`` seeds' derangements, then over ``analysed`` whole cross_input updates."""
    shared = SharedModel(folder, calibration_windows=calibration_windows)
    session = DashboardSession()
    text = window_input(shared, 0)
    session.analyse(name, shared, text, "cross_input", layer=0, seed=0)
    before = settled_rss_mib()
    started = time.perf_counter()
    for seed in range(seeds):
        shared.donor_for(0, seed)
    after_seeds = settled_rss_mib()
    seconds = time.perf_counter() - started
    for seed in range(analysed):
        session.analyse(
            name,
            shared,
            window_input(shared, seed % len(shared.eval_windows)),
            "cross_input",
            layer=seed % len(shared.slot_shapes),
            seed=seed,
        )
    after_analysed = settled_rss_mib()
    return {
        "checkpoint": name,
        "eval_windows": len(shared.eval_windows),
        "seeds": seeds,
        "seconds": seconds,
        "analysed_seeds": analysed,
        "rss_mib": {"before": before, "after_seeds": after_seeds, "after_analysed": after_analysed},
        "derangements_kept": shared.session.derangement.cache_info().currsize,
        "prefix_caches_kept": len(session.replays),
        "results_kept": len(session.results),
    }


def sessions_memory(
    names: list[str], registry: Registry, sessions: int, max_sessions: int, calibration_windows
) -> dict:
    """Server RSS with ``sessions`` sessions open at once (each made two updates), then after they closed."""
    with dashboard_server(names, registry, calibration_windows, "--max-sessions", str(max_sessions)) as (
        server,
        url,
        _,
    ):
        warm = Client(url)  # loads the model and its static profiles, then leaves
        warm.set("fca-condition", "layer_mean")
        warm.wait(300)
        warm.close()
        time.sleep(15)  # unused sessions are reaped every 5 s after 5 s
        before = rss_mib(server.pid)
        clients, failed = [], 0
        for index in range(sessions):
            try:
                client = Client(url)
            except RuntimeError:
                failed += 1
                continue
            clients.append(client)
            if not client.full:  # a new window and a layer: prefix caches and results, as a user makes them
                client.set("fca-window", 1 + index)
                client.wait(120)
                client.set("fca-layer", client.widgets["fca-layer"].options[-1][0])  # (value, label) pairs
                client.wait(120)
        time.sleep(2)
        with_open = rss_mib(server.pid)
        admitted = sum(not c.full for c in clients)
        for client in clients:
            client.close()
        closed_at = time.monotonic()
        while True:  # sessions are reaped within ~10 s of closing; give them up to 60 s
            time.sleep(3)
            after = rss_mib(server.pid)
            if after <= before * 1.10 or time.monotonic() - closed_at > 60:
                break
    return {
        "sessions": sessions,
        "max_sessions": max_sessions,
        "admitted": admitted,
        "server_full_pages": len(clients) - admitted,
        "failed": failed,
        "seconds_after_close": time.monotonic() - closed_at,
        "server_rss_mib": {"before": before, "open": with_open, "after_close": after},
    }


def model_memory(names: list[str], registry: Registry, calibration_windows) -> dict:
    """RSS with the checkpoints loaded and used (profiles included), then after ``ModelPool`` unloads them."""
    now = [0.0]
    pool = ModelPool(idle_seconds=600, clock=lambda: now[0])
    before = settled_rss_mib()
    session = DashboardSession()
    pool.attach(session)
    for name in names:
        shared = pool.acquire(registry.folder(name), calibration_windows=calibration_windows)
        session.analyse(name, shared, window_input(shared, 0), "layer_mean", layer=0)
        pool.release(shared)
    del shared
    loaded = settled_rss_mib()
    now[0] = 599.0
    kept = len(pool.unload_idle())
    now[0] = 600.0
    unloaded = pool.unload_idle()
    after = settled_rss_mib()
    return {
        "checkpoints": names,
        "idle_seconds": 600,
        "unloaded_before_idle": kept,
        "unloaded": len(unloaded),
        "rss_mib": {"before": before, "loaded": loaded, "after_unload": after},
    }


def memory_run(names: list[str], registry: Registry, args) -> dict:
    with_coefficients = [n for n in names if "dense" not in n] or names
    result: dict[str, Any] = {
        "seeds": seed_memory(
            with_coefficients[0],
            registry.folder(with_coefficients[0]),
            args.seeds,
            args.analysed_seeds,
            args.calibration_windows,
        )
    }
    result["models"] = model_memory(names, registry, args.calibration_windows)
    result["sessions"] = [
        sessions_memory(with_coefficients[:1], registry, args.memory_sessions, limit, args.calibration_windows)
        for limit in (DEFAULT_MAX_SESSIONS, 0)
    ]
    return result


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", default=None, help="registry JSON (default: the shipped checkpoints)")
    parser.add_argument(
        "--checkpoints",
        nargs="+",
        default=None,
        help="names to measure (default: featuregate-s0, muddpythia-s0, dense-s0 where shipped)",
    )
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--calibration-windows", type=int, default=None, help="for the static profiles (default: all)")
    parser.add_argument("--seeds", type=int, default=100_000, help="memory: seeds whose derangement is asked for")
    parser.add_argument("--analysed-seeds", type=int, default=300, help="memory: whole cross_input updates")
    parser.add_argument("--memory-sessions", type=int, default=40, help="memory: sessions open at once")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-load", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the server subprocess is stopped on the way out
    torch.set_num_threads(1)
    registry = Registry.from_file(args.registry) if args.registry else Registry.shipped()
    names = args.checkpoints or [n for n in ("featuregate-s0", "muddpythia-s0", "dense-s0") if n in registry.entries]
    if not names:
        sys.exit("no checkpoints to measure: none shipped yet; pass --registry and --checkpoints")
    RESULTS.mkdir(exist_ok=True)
    previous = RESULTS / "bench_dashboard.json"
    results = json.loads(previous.read_text()) if previous.is_file() else {}  # sections skipped keep their figures
    results.update({"machine": {"cpus": os.cpu_count(), "torch_threads": 1}, "checkpoints": names})
    if not args.skip_memory:  # first, while this process holds nothing else
        results["memory"] = memory_run(names, registry, args)
        results["memory"]["load_average_1min_at_end"] = os.getloadavg()[0]
    if not args.skip_latency:
        results["latency"] = [latency(n, registry.folder(n), args.repeats, args.calibration_windows) for n in names]
    if not args.skip_load:
        with_coefficients = [n for n in names if "dense" not in n] or names
        results["load"] = load_run(with_coefficients, registry, args.sessions, args.duration, args.calibration_windows)
    (RESULTS / "bench_dashboard.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "bench_dashboard.md").write_text(markdown(results))
    print(markdown(results))


def fmt(value, digits=1):
    return "—" if value is None else f"{value:.{digits}f}"


def markdown(r: dict) -> str:
    lines = [f"# Dashboard benchmark ({r['machine']['cpus']} CPUs, torch {r['machine']['torch_threads']} thread)", ""]
    if "latency" in r:
        lines += [
            "## Update latency, one 256-token window (ms)",
            "",
            "| checkpoint | full frozen forward p50 / p95 | prefix cache, one layer p50 / p95 | ratio (p50) | "
            "per-layer ratio | whole update p50 / p95 (goal p95 <= 300) |",
            "|---|---|---|---|---|---|",
        ]
        for x in r["latency"]:
            if "prefix_single_layer" not in x:
                lines.append(
                    f"| {x['checkpoint']} | {fmt(x['full_forward']['p50_ms'])} / {fmt(x['full_forward']['p95_ms'])} "
                    f"| — | — | — | {x['note']} |"
                )
                continue
            per_layer = ", ".join(f"{l}: {v:.2f}" for l, v in x["per_layer_ratio_p50"].items())
            lines.append(
                f"| {x['checkpoint']} | {fmt(x['full_forward']['p50_ms'])} / {fmt(x['full_forward']['p95_ms'])} "
                f"| {fmt(x['prefix_single_layer']['p50_ms'])} / {fmt(x['prefix_single_layer']['p95_ms'])} "
                f"| {x['ratio_p50_prefix_over_full']:.2f} | {per_layer} "
                f"| {fmt(x['dashboard_update']['p50_ms'])} / {fmt(x['dashboard_update']['p95_ms'])} |"
            )
        lines.append("")
    if "load" in r:
        x = r["load"]
        rss = x["server_rss_mib"]
        lines += [
            f"## Load: {x['sessions']} concurrent sessions for {x['duration_s']:.0f} s on loopback ({', '.join(x['checkpoints'])})",
            "",
            "| figure | measured | goal |",
            "|---|---|---|",
            f"| updates completed | {x['updates']} | |",
            f"| errors | {x['errors']} | 0 |",
            f"| update latency p50 / p95 (ms, client-observed) | {fmt(x['update_latency']['p50_ms'])} / "
            f"{fmt(x['update_latency']['p95_ms'])} | |",
            f"| same, server side (change received to views set) p50 / p95 (ms) | "
            f"{fmt(x['server_side_update_latency']['p50_ms'])} / {fmt(x['server_side_update_latency']['p95_ms'])} | |",
            f"| results view: another audit shown, p50 / p95 (ms, client-observed; {x['results_view_latency']['n']} "
            f"picks) | {fmt(x['results_view_latency']['p50_ms'])} / {fmt(x['results_view_latency']['p95_ms'])} | |",
            f"| one session alone, layer changes: p50 / p95 (ms, client-observed) | "
            f"{fmt(x['single_session_update_latency']['p50_ms'])} / {fmt(x['single_session_update_latency']['p95_ms'])} | |",
            f"| same, server side p50 / p95 (ms) | {fmt(x['single_session_server_side']['p50_ms'])} / "
            f"{fmt(x['single_session_server_side']['p95_ms'])} | |",
            *(
                [
                    f"| CPU per update or pick: server / the {x['sessions']} clients (ms; clients are Python websocket "
                    f"clients in one process) | {fmt(x['cpu_ms_per_action']['server'])} / {fmt(x['cpu_ms_per_action']['clients'])} | |"
                ]
                if "cpu_ms_per_action" in x
                else []
            ),
            f"| server RSS before / peak / after (MiB) | {fmt(rss['before'])} / {fmt(rss['peak'])} / {fmt(rss['after'])} | |",
            f"| RSS after / before | {fmt(x['rss_after_over_before'], 3)} | <= 1.10 |",
            f"| server tracebacks | {x['server_tracebacks']} | 0 |",
            "",
        ]
        if x["error_examples"]:
            lines += ["Errors (first 5): " + "; ".join(x["error_examples"]), ""]
    if "memory" in r:
        lines += memory_markdown(r["memory"])
    return "\n".join(lines)


def memory_markdown(m: dict) -> list[str]:
    seeds, models = m["seeds"], m["models"]
    rss, mrss = seeds["rss_mib"], models["rss_mib"]
    lines = [
        f"## Memory a long-running server accumulates (1-min load average at the end: {m['load_average_1min_at_end']:.1f})",
        "",
        "| figure | before (MiB) | after (MiB) | after / before | kept |",
        "|---|---|---|---|---|",
        f"| {seeds['seeds']:,} seeds' cross_input derangements ({seeds['checkpoint']}, {seeds['eval_windows']} eval "
        f"windows, {seeds['seconds']:.0f} s) | {fmt(rss['before'])} | {fmt(rss['after_seeds'])} | "
        f"{rss['after_seeds'] / rss['before']:.3f} | {seeds['derangements_kept']} derangements |",
        f"| then {seeds['analysed_seeds']:,} whole cross_input updates, a new seed, window and layer each | "
        f"{fmt(rss['after_seeds'])} | {fmt(rss['after_analysed'])} | {rss['after_analysed'] / rss['after_seeds']:.3f} | "
        f"{seeds['prefix_caches_kept']} prefix caches, {seeds['results_kept']} results |",
        f"| {', '.join(models['checkpoints'])} loaded and used, then idle for {models['idle_seconds']} s | "
        f"{fmt(mrss['loaded'])} | {fmt(mrss['after_unload'])} | {mrss['after_unload'] / mrss['loaded']:.3f} | "
        f"{models['unloaded']} unloaded ({models['unloaded_before_idle']} a second earlier); nothing loaded: "
        f"{fmt(mrss['before'])} MiB |",
    ]
    for x in m["sessions"]:
        srss = x["server_rss_mib"]
        limit = f"--max-sessions {x['max_sessions']}" if x["max_sessions"] else "no session limit (--max-sessions 0)"
        lines.append(
            f"| server with {x['sessions']} sessions open, {limit} | {fmt(srss['before'])} | {fmt(srss['open'])} | "
            f"{srss['open'] / srss['before']:.3f} | {x['admitted']} got the app, {x['server_full_pages']} the "
            f"'server is full' page, {x['failed']} failed; {fmt(srss['after_close'])} MiB "
            f"{x.get('seconds_after_close', 20):.0f} s after all closed |"
        )
    return lines + [""]


if __name__ == "__main__":
    main()
