"""Figures of the notebooks: offline HTML, and PDF, SVG and PNG for papers and slides; shown in JupyterLab as
plotly MIME bundles with the PNG beside them, so nbconvert, GitHub and HTML exports still show each figure.

The static formats are drawn by plotly's exporter (kaleido 1.x), which drives an installed Chrome or Chromium
(``BROWSER_PATH``, else the first one on ``PATH``) and never downloads one; without it the HTML is still written
and one line says why the rest is not.
"""

from __future__ import annotations

import atexit
import base64
import functools
import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fca_workbench.foundation.checkpoint import recorded_name
from fca_workbench.results.layout import FIGURES_DIR

if TYPE_CHECKING:  # imported when a figure is drawn, not by `import fca_workbench`
    import ipywidgets
    import pandas as pd
    import plotly.graph_objects as go


def layer_position_matrix(means: list[torch.Tensor]) -> torch.Tensor:
    """``[L, T]`` from per-layer ``[T, *slot]`` coefficients: each layer's mean over its slots per position."""
    return torch.stack([m.flatten(1).mean(1) for m in means])


STATIC_FORMATS = ("pdf", "svg", "png")  # for a paper (vector), for the web, for slides
PNG_SCALE = 2  # slides and screens with twice the pixels
STATIC_WIDTH, STATIC_HEIGHT = 900, 500  # CSS pixels of a figure that sets no size (the exporter's default is 700 wide)
# Okabe & Ito (2008): distinguishable with every common colour-vision deficiency, and in greyscale by lightness
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
PAPER_TEMPLATE = "fca_paper"


def use_paper_style() -> None:
    """Make every figure drawn after this one of the paper's: white background, the Okabe-Ito colours (set
    before a figure is drawn, as plotly express picks its colours then)."""
    import plotly.graph_objects as go
    import plotly.io as pio

    template = go.layout.Template(pio.templates["plotly_white"])
    template.layout.colorway = OKABE_ITO
    template.layout.font = {"family": "Arial, Helvetica, sans-serif", "size": 13}
    pio.templates[PAPER_TEMPLATE] = template
    pio.templates.default = PAPER_TEMPLATE


@functools.cache
def static_exporter() -> bool:
    """Whether PDF, SVG and PNG can be drawn here: kaleido and an installed Chrome or Chromium. Found once per
    process, which then keeps one browser for every figure (closed at exit); when not, says so in one line."""
    try:
        import kaleido
        from choreographer.browsers.chromium import Chromium
    except ImportError:
        print("figures: HTML only; PDF, SVG and PNG need kaleido>=1 (the notebooks extra)", file=sys.stderr)
        return False
    browser = Chromium.find_browser(skip_local=True)  # BROWSER_PATH or PATH: never a downloaded browser
    if browser is None or not os.access(browser, os.X_OK):
        print(
            "figures: HTML only; PDF, SVG and PNG need Chrome or Chromium (install chromium, or set BROWSER_PATH)",
            file=sys.stderr,
        )
        return False
    os.environ["BROWSER_PATH"] = browser  # the one kaleido starts
    kaleido.start_sync_server(mathjax=False, silence_warnings=True)  # offline: no MathJax from a CDN
    atexit.register(kaleido.stop_sync_server, silence_warnings=True)
    return True


def audit_caption(audits: list[dict]) -> str:
    """What a figure of these audits was drawn from: the models (or how many of each architecture), the eval
    windows and the seed."""
    if not audits:
        return ""
    names = [recorded_name(a["model"]) for a in audits]
    if len(names) > 4:
        archs = [a["model"]["arch"] for a in audits]
        names = [f"{archs.count(arch)}× {arch}" for arch in dict.fromkeys(archs)]
    data, settings = audits[0]["data"]["eval"], audits[0]["settings"]
    return (
        f"{', '.join(names)}; {data['windows']} eval windows × {data['window']} tokens; seed {settings['seed']}; "
        f"{settings['device']}, {settings['dtype']}"
    )


def caption_figure(fig: go.Figure, caption: str) -> None:
    """Say under the title what the figure was drawn from (model, windows, seed), so a copy keeps it."""
    fig.update_layout(title_subtitle_text=caption, margin_t=max(fig.layout.margin.t or 0, 110))


def write_figure(fig: go.Figure, out: str | Path, name: str, caption: str | None = None) -> dict[str, Path]:
    """Write ``out/figures/<name>.html`` (interactive and offline: plotly.js is written once beside it) and, when
    ``static_exporter`` can, ``<name>.pdf``, ``.svg`` and ``.png``; returns the paths by format."""
    import plotly.io as pio

    if caption:
        caption_figure(fig, caption)
    folder = Path(out) / FIGURES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"html": folder / f"{name}.html"}
    fig.write_html(paths["html"], include_plotlyjs="directory", full_html=True)
    if static_exporter():
        static = {fmt: folder / f"{name}.{fmt}" for fmt in STATIC_FORMATS}
        scales = [PNG_SCALE if fmt == "png" else 1 for fmt in static]
        with warnings.catch_warnings():  # plotly passes its page options, which the running browser already has
            warnings.filterwarnings("ignore", "The kopts argument is ignored", UserWarning)
            pio.write_images(
                [fig] * len(static),
                list(static.values()),
                scale=scales,
                width=fig.layout.width or STATIC_WIDTH,
                height=fig.layout.height or STATIC_HEIGHT,
                validate=False,
            )
        paths.update(static)
    return paths


def show(fig: go.Figure, png: Path | None = None) -> None:
    """Display a figure in the notebook as a plotly MIME bundle (rendered by JupyterLab; keeps the executed
    notebooks small, the self-contained copy is the HTML file), with ``png`` as the image a reader without
    plotly.js shows."""
    from IPython.display import display

    display(mimebundle(fig, png), raw=True)


def mimebundle(fig: go.Figure, png: Path | None = None) -> dict:
    """A figure as the plotly MIME bundle JupyterLab renders (plain JSON), and ``png`` as its static image."""
    import plotly.io as pio

    bundle = {
        "application/vnd.plotly.v1+json": {**json.loads(pio.to_json(fig, validate=False)), "config": {}},
        "text/plain": f"<{fig.layout.title.text or 'plotly figure'}>",
    }
    if png is not None:
        bundle["image/png"] = base64.b64encode(png.read_bytes()).decode("ascii")
    return bundle


def show_in(output: ipywidgets.Output, *figs: go.Figure) -> None:
    """Replace an ``ipywidgets.Output``'s content with the figures in one step. Setting its ``outputs`` from
    the kernel (rather than printing inside ``with output:``) also keeps papermill/nbclient from blocking
    on the widget's capture messages (jupyter/nbclient#312)."""
    output.outputs = tuple({"output_type": "display_data", "data": mimebundle(fig), "metadata": {}} for fig in figs)


def show_text_in(output: ipywidgets.Output, markdown: str) -> None:
    """Replace an ``ipywidgets.Output``'s content with a Markdown message, as ``show_in`` replaces it with figures:
    one state update, never a capture whose messages could arrive after a later update."""
    data = {"text/markdown": markdown, "text/plain": markdown}
    output.outputs = ({"output_type": "display_data", "data": data, "metadata": {}},)


def errors_shown_in(output: ipywidgets.Output) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a widget callback so that an exception it raises is shown in ``output`` as a cell's error is
    (ipywidgets would only log it to the console, leaving the view as it was), then raised as before."""

    def decorate(callback: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(callback)
        def shown(*args: Any, **kwargs: Any) -> Any:
            try:
                return callback(*args, **kwargs)
            except Exception as exc:
                error = {"ename": type(exc).__name__, "evalue": str(exc), "traceback": traceback.format_exception(exc)}
                output.outputs = ({"output_type": "error", **error},)
                raise

        return shown

    return decorate


DESIGN_COLUMNS = 4  # design axes side by side in a design-study figure


def design_axis_figure(points: pd.DataFrame, figure: str, title: str, percent: bool = False) -> go.Figure:
    """One figure of a design study (``design_study.design_points``) against each design axis, a panel per axis:
    each variant with its error bar and, where it has several seeds, each seed as a grey dot; the default as
    the dashed reference line, its error band shaded."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    axes = [a for a in dict.fromkeys(points.axis) if a != "default"]
    p = points[points.figure == figure]
    default = p[p.axis == "default"]
    rows = -(-len(axes) // DESIGN_COLUMNS)
    fig = make_subplots(
        rows=rows, cols=DESIGN_COLUMNS, subplot_titles=axes, shared_yaxes="all", vertical_spacing=0.3 / rows
    )
    for i, axis in enumerate(axes):
        row, col = i // DESIGN_COLUMNS + 1, i % DESIGN_COLUMNS + 1
        q = p[p.axis == axis]
        fig.add_trace(
            go.Scatter(
                x=q.label,
                y=q.value,
                mode="markers",
                marker={"size": 10, "color": OKABE_ITO[0]},
                name="variant",
                legendgroup="variant",
                showlegend=i == 0,
                customdata=q[["variant", "error"]],
                error_y={"type": "data", "symmetric": False, "array": q.error_plus, "arrayminus": q.error_minus},
                hovertemplate="%{customdata[0]}: %{y}<br>error bar: %{customdata[1]}<extra></extra>",
            ),
            row,
            col,
        )
        spread = q[q.n > 1].explode("values")
        fig.add_trace(
            go.Scatter(
                x=spread.label,
                y=spread["values"],
                mode="markers",
                marker={"size": 5, "color": "grey"},
                name="one seed",
                legendgroup="seed",
                showlegend=i == 0,
            ),
            row,
            col,
        )
        for d in default.itertuples():
            fig.add_hline(y=d.value, line_dash="dash", line_color="black", row=row, col=col)
            if d.error_minus or d.error_plus:
                fig.add_hrect(
                    y0=d.value - d.error_minus,
                    y1=d.value + d.error_plus,
                    fillcolor="grey",
                    opacity=0.2,
                    line_width=0,
                    row=row,
                    col=col,
                )
    where = f"dashed: the default (n={default.n.iloc[0]})" if len(default) else "no default run"
    fig.update_layout(
        title=f"{title} by design axis ({where}; error bars: 95% CI for one seed, sd over seeds)", height=330 * rows
    )
    fig.update_yaxes(title_text=title, row=None, col=1)
    if percent:
        fig.update_yaxes(tickformat=".0%")
    return fig
