"""Presentation only: HTML and plotly figures of a ``fca_workbench.viewmodel.Analysis`` and of an audit's
tables. No numbers are computed here beyond colour scaling; every value shown comes from the core."""

from __future__ import annotations

import functools
import html
import io
import types
from typing import Any

import numpy as np
import pandas as pd
import panel as pn

from fca_workbench.results.conditions import REFERENCE
from fca_workbench.viewmodel import Analysis, condition_named
from fca_workbench.viewmodel.escaping import plotly_text


class FigurePane(pn.pane.Plotly):
    """A Plotly pane for the plain-dict figures of ``views``: it hands them to plotly.js as they are instead of
    building a validated ``go.Figure`` on every update (about 40 ms a figure on this machine)."""

    def _to_figure(self, obj):
        if isinstance(obj, dict):
            return types.SimpleNamespace(_data=list(obj["data"]), _layout=dict(obj["layout"]))
        return super()._to_figure(obj)


DIFF_SCALE = [[0.0, "#2166ac"], [0.5, "#f7f7f7"], [1.0, "#b2182b"]]  # blue (lower), white (0), red (higher)
VALUE_SCALE = "Viridis"


def _colour(delta: float, scale: float) -> str:
    """Red for tokens the intervention made harder to predict, blue for easier; alpha by |ΔNLL| / scale."""
    if not np.isfinite(delta) or scale <= 0:
        return "transparent"
    alpha = min(abs(delta) / scale, 1.0) * 0.85
    rgb = "220,40,40" if delta > 0 else "40,90,220"
    return f"rgba({rgb},{alpha:.3f})"


def token_html(tokens: list[str], delta: np.ndarray) -> str:
    """Each token HTML-escaped in its own span, coloured by the ΔNLL of predicting it (token 0 is context)."""
    scale = float(np.nanmax(np.abs(delta))) if len(delta) else 0.0
    scale = max(scale, 1e-6)
    spans = []
    for position, token in enumerate(tokens):
        value = delta[position - 1] if position > 0 else np.nan
        title = "context (not predicted)" if position == 0 else f"token {position}: ΔNLL {value:+.4f}"
        spans.append(
            f'<span class="fca-token" data-position="{position}" title="{html.escape(title)}" '
            f'style="background:{_colour(value, scale)}">{html.escape(token)}</span>'
        )
    legend = (
        f'<div class="fca-legend">colour: ΔNLL of predicting each token; full red = +{scale:.3f} nats, '
        f"full blue = −{scale:.3f} (hover a token for its value)</div>"
    )
    return (
        '<div class="fca-tokens" style="white-space:pre-wrap;font-family:monospace;line-height:1.6;'
        'max-height:260px;overflow:auto;border:1px solid #ddd;padding:6px">' + "".join(spans) + "</div>" + legend
    )


def _title(text: str, x: float, y: float) -> dict:
    return dict(
        text=plotly_text(text),
        x=x,
        y=y,
        xref="paper",
        yref="paper",
        xanchor="center",
        yanchor="bottom",
        showarrow=False,
        font=dict(size=14),
    )


def delta_figure(analysis: Analysis) -> dict:
    """Per-token ΔNLL (bars) above the NLL of ``correct`` and of the intervention (lines).

    Figures are plain plotly dicts: building ``go.Figure`` objects validates every property and costs
    ~35 ms a figure here, most of an update's time."""
    positions = np.arange(1, len(analysis.nll_correct) + 1)
    labels = [plotly_text(t) for t in analysis.tokens[1:]]
    delta = analysis.delta
    data = [
        dict(
            type="bar",
            x=positions,
            y=delta,
            name="ΔNLL",
            customdata=labels,
            xaxis="x",
            yaxis="y",
            hovertemplate="token %{x} %{customdata}<br>ΔNLL %{y:+.4f}<extra></extra>",
            marker=dict(color=np.where(delta > 0, "#d62728", "#1f77b4").tolist()),
        ),
        dict(
            type="scatter",
            mode="lines",
            x=positions,
            y=analysis.nll_correct,
            name=REFERENCE,
            xaxis="x2",
            yaxis="y2",
            line=dict(color="#555"),
        ),
        dict(
            type="scatter",
            mode="lines",
            x=positions,
            y=analysis.nll_condition,
            name=plotly_text(analysis.condition),
            xaxis="x2",
            yaxis="y2",
            line=dict(color="#d62728"),
        ),
    ]
    layout = dict(
        height=420,
        margin=dict(l=50, r=20, t=40, b=40),
        legend=dict(orientation="h", y=-0.2),
        xaxis=dict(anchor="y", domain=[0, 1], matches="x2", showticklabels=False),
        yaxis=dict(anchor="x", domain=[0.54, 1], title=dict(text="nats"), zeroline=True),
        xaxis2=dict(anchor="y2", domain=[0, 1], title=dict(text="position of the predicted token")),
        yaxis2=dict(anchor="x2", domain=[0, 0.46], title=dict(text="nats")),
        annotations=[
            _title(f"ΔNLL per token ({analysis.condition} − correct)", 0.5, 1.0),
            _title("NLL per token", 0.5, 0.46),
        ],
    )
    return dict(data=data, layout=layout)


def _heatmaps(original, intervened, diff, y_labels, title) -> dict:
    finite = np.concatenate([original[np.isfinite(original)], intervened[np.isfinite(intervened)]])
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    span = float(np.nanmax(np.abs(diff))) if np.isfinite(diff).any() else 0.0
    span = max(span, 1e-9)
    x = np.arange(original.shape[1])
    domains = ([0.0, 0.29], [0.345, 0.635], [0.69, 0.98])
    panels = (
        (original, VALUE_SCALE, lo, hi, "original (correct)"),
        (intervened, VALUE_SCALE, lo, hi, "intervened"),
        (diff, DIFF_SCALE, -span, span, "difference"),
    )
    data: list[dict] = []
    layout: dict[str, Any] = dict(
        height=max(260, 40 + 14 * len(y_labels)),
        margin=dict(l=70, r=30, t=60, b=40),
        title=dict(text=plotly_text(title), font=dict(size=14)),
        annotations=[],
    )
    for index, ((values, scale, zmin, zmax, name), domain) in enumerate(zip(panels, domains), start=1):
        suffix = "" if index == 1 else str(index)
        data.append(
            dict(
                type="heatmap",
                z=np.ascontiguousarray(values, dtype=np.float64),
                x=x,
                y=[plotly_text(label) for label in y_labels],
                colorscale=scale,
                zmin=zmin,
                zmax=zmax,
                xaxis=f"x{suffix}",
                yaxis=f"y{suffix}",
                name=name,
                showscale=index != 1,
                colorbar=dict(x=domain[1] + 0.005, len=0.9, thickness=10, xanchor="left"),
                hovertemplate="position %{x}<br>%{y}<br>%{z:.4f}<extra></extra>",
            )
        )
        layout[f"xaxis{suffix}"] = dict(anchor=f"y{suffix}", domain=domain, title=dict(text="position"))
        layout[f"yaxis{suffix}"] = dict(
            anchor=f"x{suffix}", domain=[0, 1], showticklabels=index == 1, **({} if index == 1 else {"matches": "y"})
        )
        layout["annotations"].append(_title(name, sum(domain) / 2, 1.0))
    return dict(data=data, layout=layout)


def layer_heatmap(analysis: Analysis, slot: str) -> dict:
    """One slot of every controller by position, a controller named ``layer L`` where it is its layer's only one,
    else by its module path."""
    original, intervened, diff = analysis.layer_position(slot)
    labels = analysis.controller_labels
    axis = "layer" if all(label.startswith("layer ") for label in labels) else "controller"
    return _heatmaps(original, intervened, diff, labels, f"{axis} × position, slot {slot}")


def slot_heatmap(analysis: Analysis, index: int) -> dict:
    """Controller ``index``'s slots by position."""
    original, intervened, diff = analysis.slot_position(index)
    title = f"slot × position, {analysis.controller_labels[index]}"
    return _heatmaps(original, intervened, diff, analysis.slot_labels[index], title)


def summary_html(analysis: Analysis) -> str:
    def fmt(value: object, signed: bool = False) -> str:
        if value is None:
            return "—"
        if isinstance(value, float):
            return f"{value:+.4f}" if signed else f"{value:.4f}"
        return str(value)

    summary = analysis.summary
    rows = [
        ("checkpoint", f"{analysis.checkpoint} ({analysis.arch})"),
        ("intervention", analysis.condition),
        ("intervened at", analysis.where),
    ]
    if analysis.donor is not None:
        rows.append(("donor window", str(analysis.donor)))
    if condition_named(analysis.condition).seeded:
        rows.append(("seed", str(analysis.seed)))
    rows += [(name, fmt(value, "Δ" in name)) for name, value in summary.items() if name != "retention"]
    if analysis.retention is not None or analysis.nll_global_mean is not None:
        rows.append(("mean NLL global_mean", fmt(analysis.nll_global_mean)))
        rows.append(("gap retention", fmt(summary["retention"])))
    if analysis.profiles_source:
        rows.append(("static profiles", analysis.profiles_source))
    rows.append(
        ("replayed from", "embeddings" if analysis.start_layer == 0 else f"layer {analysis.start_layer} (prefix cache)")
    )
    rows.append(("compute", f"{analysis.compute_ms:.0f} ms"))
    body = "".join(
        f"<tr><th style='text-align:left;padding-right:12px'>{html.escape(k)}</th>"
        f"<td class='fca-summary-{html.escape(k.replace(' ', '-'))}'>{html.escape(v)}</td></tr>"
        for k, v in rows
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in analysis.notes)
    return f"<table class='fca-summary'>{body}</table>" + (f"<ul class='fca-notes'>{notes}</ul>" if notes else "")


def per_layer_heatmap(table: pd.DataFrame, title: str) -> dict:
    """The per-layer sweep (``tables.per_layer_table`` of one audit) as a decoder layer × condition heatmap of
    ΔNLL; its per-controller rows (``tables.per_controller_table``) as controller (module path) × condition."""
    conditions = list(dict.fromkeys(table["condition"]))  # the audit's order
    axis = "controller" if "controller" in table.columns else "layer"
    grids = {
        key: table.pivot(index=axis, columns="condition", values=key)[conditions]
        for key in ("delta", "delta_ci95_lo", "delta_ci95_hi")
    }
    delta, low, high = (grids[key].to_numpy(dtype=np.float64) for key in ("delta", "delta_ci95_lo", "delta_ci95_hi"))
    text = [[f"ΔNLL {d:+.4f} [{lo:+.4f}, {hi:+.4f}]" for d, lo, hi in zip(*row)] for row in zip(delta, low, high)]
    layers = grids["delta"].index
    data = [
        dict(
            type="heatmap",
            z=delta,
            x=[plotly_text(condition) for condition in conditions],
            y=[f"layer {layer}" if axis == "layer" else plotly_text(str(layer)) for layer in layers],
            text=text,
            colorscale=VALUE_SCALE,
            colorbar=dict(title=dict(text="ΔNLL")),
            hovertemplate="%{y}, %{x}<br>%{text}<extra></extra>",
        )
    ]
    layout = dict(
        height=max(260, 80 + 36 * len(layers)),
        margin=dict(l=70, r=30, t=50, b=80),
        title=dict(text=plotly_text(title), font=dict(size=14)),
        yaxis=dict(autorange="reversed"),
    )
    return dict(data=data, layout=layout)


def bar_errors(b) -> dict:
    """A bar's whiskers: its 95% CI where it has one (``low`` / ``high``), else ± the sd over seeds (n > 1)."""
    if b.low is not None and b.high is not None:
        minus = [m - lo for m, lo in zip(b.mean, b.low)]
        plus = [hi - m for m, hi in zip(b.mean, b.high)]
        return dict(type="data", symmetric=False, array=plus, arrayminus=minus, visible=True)
    return dict(type="data", array=b.sd, visible=b.n > 1)


def bars_figure(bars: list, title: str, y_title: str, percent: bool = False) -> dict | None:
    """Grouped bars (``dashboard.overview.Bars``): one colour per architecture, mean ± sd over its seeds."""
    if not bars:
        return None
    data = [
        dict(
            type="bar",
            name=plotly_text(f"{b.arch} (n={b.n})"),
            x=[plotly_text(x) for x in b.x],
            y=b.mean,
            error_y=bar_errors(b),
            hovertemplate=f"%{{x}}: %{{y:{'.2%' if percent else '+.4f'}}}<extra>{plotly_text(b.arch)}</extra>",
        )
        for b in bars
    ]
    # the legend in a row above the plot (under the title), the condition names below it slanted, with room
    # made for them (``automargin``): long names neither clip nor run into the legend
    layout = dict(
        barmode="group",
        height=400,
        margin=dict(l=70, r=30, t=90, b=40),
        title=dict(text=plotly_text(title), font=dict(size=14), y=0.97, yanchor="top"),
        xaxis=dict(automargin=True, tickangle=-30),
        yaxis=dict(title=dict(text=plotly_text(y_title)), tickformat=".0%" if percent else None, automargin=True),
        legend=dict(orientation="h", x=0, xanchor="left", y=1.02, yanchor="bottom"),
        showlegend=True,
    )
    return dict(data=data, layout=layout)


def csv_download(name: str, csv: str) -> pn.widgets.FileDownload:
    """A table's CSV as a download button (class ``fca-download-<name>``: what the browser tests click)."""
    return pn.widgets.FileDownload(
        callback=functools.partial(io.BytesIO, csv.encode()),
        filename=f"{name}.csv",
        label=f"{name}.csv",
        css_classes=[f"fca-download-{name}"],
        sizing_mode="fixed",
        width=230,
        height=38,
    )


def table_pane(name: str, caption: str, table_html: str) -> pn.pane.HTML:
    """A rendered table under its caption (class ``fca-table-<name>``)."""
    return pn.pane.HTML(
        f"<div class='fca-table-{name}'><h4>{html.escape(caption)}</h4>{table_html}</div>",
        css_classes=["fca-results-table"],
    )
