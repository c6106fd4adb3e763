"""A ``fca reproduce`` run's plan (``Plan``: its folder, notebooks, audits, cache) and what the run writes
about itself: ``reproduce_config.json`` (``plan_summary``) and the index, ``README.md`` (``write_index``)."""

from __future__ import annotations

import datetime
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from fca_workbench.audit.settings import AuditSettings
from fca_workbench.foundation.files import write_atomic
from fca_workbench.notebooks.notebook_execution import KERNEL_NAME, NotebookJob, NotebookResult
from fca_workbench.notebooks.notebook_run import read_finished
from fca_workbench.results import layout

PROCESSES = "processes"  # the config key: how many audits, then notebooks, run at once
DEFAULT_PROCESSES = 2  # the reference machine's two cores, one audit or notebook kernel each


@dataclass
class Plan:
    out: Path
    jobs: list[NotebookJob]
    audits: dict[str, AuditSettings]  # checkpoint -> settings, shared by every notebook that reads it
    cache: Path
    config_path: str | None
    overwrite: bool
    processes: int = DEFAULT_PROCESSES


def plan_summary(plan_: Plan) -> dict:
    return {
        "config": plan_.config_path,
        "out": str(plan_.out),
        "cache": str(plan_.cache),
        PROCESSES: plan_.processes,
        "kernel": KERNEL_NAME,
        "notebooks": {job.name: job.parameters for job in plan_.jobs},
        "audits": {Path(c).name: asdict(s) for c, s in plan_.audits.items()},
    }


def write_index(plan_: Plan, results: list[NotebookResult], audit_seconds: float, total_seconds: float) -> Path:
    """``DIR/README.md``: what ran on which models, data and settings, and where every output lies."""
    out = plan_.out
    audits = [
        (Path(c).name, read_finished(out / layout.AUDITS_DIR / Path(c).name / layout.AUDIT_FILE)) for c in plan_.audits
    ]
    passed = sum(r.ok for r in results)
    lines = [
        "# fca reproduce",
        "",
        f"Run on {datetime.datetime.now().isoformat(timespec='seconds')} with `fca reproduce"
        + (f" --config {plan_.config_path}" if plan_.config_path else "")
        + f" --out {out}`"
        + f" (Jupyter kernel `{KERNEL_NAME}`, Python {sys.version.split()[0]}).",
        "",
        f"**{passed} of {len(results)} notebooks passed.** Wall time {total_seconds:.0f} s "
        f"(audits {audit_seconds:.0f} s, notebooks {total_seconds - audit_seconds:.0f} s, {plan_.processes} at a time).",
        "",
        "## Notebooks",
        "",
        "| notebook | status | seconds | executed notebook |",
        "|---|---|---:|---|",
    ]
    for r in results:
        status = "passed" if r.ok else f"**FAILED**: {r.error}".replace("|", "\\|")
        lines.append(f"| {r.name} | {status} | {r.seconds:.1f} | [{r.output.name}]({r.output.relative_to(out)}) |")
    lines += ["", "## Models", "", "| model | arch | params | fingerprint | path |", "|---|---|---:|---|---|"]
    for name, audit in audits:
        if audit:
            m = audit["model"]
            lines.append(f"| {name} | {m['arch']} | {m['params']:,} | `{m['fingerprint'][:12]}` | `{m['path']}` |")
        else:
            lines.append(f"| {name} | (audit missing) | | | |")
    first = next((a for _, a in audits if a), None)
    if first:
        lines += ["", "## Data", ""]
        for split in ("eval", "calibration"):
            d = first["data"][split]
            lines.append(
                f"- {split}: `{d['source']}`, {d['windows']} windows × {d['window']} tokens "
                f"({d['tokens']:,} tokens), fingerprint `{d['fingerprint'][:12]}`"
            )
        s = first["settings"]
        lines += [
            "",
            "## Settings",
            "",
            f"device {s['device']}, dtype {s['dtype']}, seed {s['seed']}, window {first['data']['eval']['window']}, "
            f"max windows {s['max_windows']}, batch size {s['batch_size']}, bootstrap resamples {s['resamples']}, "
            f"latency repeats {s['latency_repeats']}; coefficient caches in `{plan_.cache}`; audits in "
            "[audits/](audits/). Every notebook's parameters are in "
            "[reproduce_config.json](reproduce_config.json).",
        ]
    lines += ["", "## Tables and figures", ""]
    for r in results:
        tables = sorted({p.with_suffix("") for p in r.files if p.parent == out / layout.TABLES_DIR})
        figures = sorted(p for p in r.files if p.parent == out / layout.FIGURES_DIR and p.suffix == ".html")
        if not tables and not figures:
            continue
        lines += [f"### {r.name}", ""]
        for stem in tables:
            rel = stem.relative_to(out)
            links = ", ".join(
                f"[{ext}]({rel}.{ext})" for ext in ("csv", "md", "tex") if stem.with_suffix(f".{ext}").exists()
            )
            lines.append(f"Table `{stem.name}` ({links}):")
            lines.append("")
            md = stem.with_suffix(".md")
            if md.exists():
                lines += [md.read_text().rstrip(), ""]
        if figures:
            lines.append(
                "Figures (interactive HTML, offline): "
                + ", ".join(f"[{p.stem}]({p.relative_to(out)})" for p in figures)
            )
            lines.append("")
    path = out / layout.INDEX_FILE
    write_atomic(path, ("\n".join(lines).rstrip() + "\n").encode())
    return path
