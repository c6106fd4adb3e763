"""Figures of the notebooks: written as offline HTML, shown in JupyterLab as plotly MIME bundles."""

from __future__ import annotations

import functools
import json
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fca_workbench.results.layout import FIGURES_DIR

if TYPE_CHECKING:  # imported when a figure is drawn, not by `import fca_workbench`
    import ipywidgets
    import plotly.graph_objects as go


def layer_position_matrix(means: list[torch.Tensor]) -> torch.Tensor:
    """``[L, T]`` from per-layer ``[T, *slot]`` coefficients: each layer's mean over its slots per position."""
    return torch.stack([m.flatten(1).mean(1) for m in means])


def write_figure(fig: go.Figure, out: str | Path, name: str) -> Path:
    """Write ``out/figures/<name>.html``: interactive and offline (plotly.js is written once beside it)."""
    folder = Path(out) / FIGURES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.html"
    fig.write_html(path, include_plotlyjs="directory", full_html=True)
    return path


def show(fig: go.Figure) -> None:
    """Display a figure in the notebook as a plotly MIME bundle (rendered by JupyterLab; keeps the executed
    notebooks small, the self-contained copy is the HTML file)."""
    fig.show(renderer="plotly_mimetype")


def mimebundle(fig: go.Figure) -> dict:
    """A figure as the plotly MIME bundle JupyterLab renders (plain JSON)."""
    import plotly.io as pio

    return {
        "application/vnd.plotly.v1+json": {**json.loads(pio.to_json(fig, validate=False)), "config": {}},
        "text/plain": f"<{fig.layout.title.text or 'plotly figure'}>",
    }


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
