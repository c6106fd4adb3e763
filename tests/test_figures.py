"""Figures for papers: every figure as HTML and, drawn by the system Chromium, PDF, SVG and PNG; one line and the
HTML alone without a browser; the PNG kept beside plotly's JSON when a notebook shows a figure."""

import shutil
import subprocess

import numpy as np
import plotly.express as px
import pytest
from PIL import Image

from fca_workbench.results import figures
from fca_workbench.results.figures import OKABE_ITO, STATIC_FORMATS, mimebundle, use_paper_style, write_figure


def bar_figure():
    use_paper_style()
    return px.bar(x=["cross_input", "token_shuffle"], y=[0.5, 0.25], color=["a", "b"], labels={"y": "ΔNLL (nats)"})


@pytest.fixture
def no_browser(monkeypatch, tmp_path):
    """A machine where plotly's exporter finds no Chrome or Chromium (``static_exporter`` is found once per
    process: forgotten before and after)."""
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-browser"))
    figures.static_exporter.cache_clear()
    yield
    figures.static_exporter.cache_clear()


def test_without_a_browser_the_html_is_written_and_one_line_says_why(no_browser, tmp_path, capsys):
    paths = write_figure(bar_figure(), tmp_path, "delta", caption="tiny; 4 eval windows × 64 tokens; seed 0")
    assert list(paths) == ["html"] and paths["html"].is_file()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HTML only" in err and "BROWSER_PATH" in err


def test_paper_style_draws_in_the_okabe_ito_colours():
    fig = bar_figure()
    assert [trace.marker.color for trace in fig.data] == list(OKABE_ITO[:2])


def test_a_figure_is_written_for_papers_and_its_pdf_is_not_blank(tmp_path):
    if not figures.static_exporter():
        pytest.skip("no Chrome or Chromium for plotly's exporter (scripts/setup.sh installs chromium)")
    if shutil.which("pdftoppm") is None:
        pytest.skip("no pdftoppm (poppler-utils, installed by scripts/setup.sh)")
    fig = bar_figure()
    paths = write_figure(fig, tmp_path, "delta", caption="tiny; 4 eval windows × 64 tokens; seed 0")
    assert list(paths) == ["html", *STATIC_FORMATS] and all(p.stat().st_size > 0 for p in paths.values())
    assert paths["pdf"].read_bytes().startswith(b"%PDF") and b"<svg" in paths["svg"].read_bytes()[:500]
    assert "seed 0" in paths["svg"].read_text()  # the caption is part of the figure
    subprocess.run(["pdftoppm", "-png", "-r", "40", "-singlefile", paths["pdf"], tmp_path / "page"], check=True)
    page = np.asarray(Image.open(tmp_path / "page.png").convert("RGB")).astype(int)
    ink = (page.min(axis=2) < 200).mean()  # share of pixels that are not white
    first = np.array([int(OKABE_ITO[0][i : i + 2], 16) for i in (1, 3, 5)])
    coloured = (np.abs(page - first).max(axis=2) <= 8).mean()
    assert 0.01 < ink < 0.9 and coloured > 0.005  # text, axes and the bars, one in the palette's first colour
    bundle = mimebundle(fig, paths["png"])
    assert bundle["image/png"] and "application/vnd.plotly.v1+json" in bundle
