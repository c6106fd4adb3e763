"""Text from model folders, audit files and the browser, shown as text wherever the dashboard shows it.

Plotly renders its labels (axis ticks, hover, titles, legend) as a small HTML dialect (``<a href>``, ``<b>``,
``<br>``) and Markdown panes (Panel's ``Alert`` is one) render links, images and autolinks, so every string that
reaches either goes through one of these two; HTML panes take ``html.escape``.
"""

from __future__ import annotations

import html


def plotly_text(text: object) -> str:
    """A label for plotly: its markup shown literally (plotly decodes the entities, parses no tag)."""
    return html.escape(str(text))


def markdown_text(text: object, css_class: str = "fca-text") -> str:
    """Text for a Markdown pane: one raw HTML block (a ``div`` on one line, which Markdown passes through
    without looking for links, images or emphasis) holding the escaped text, its line breaks as ``<br>``."""
    lines = html.escape(str(text)).splitlines() or [""]
    return f'<div class="{css_class}">' + "<br>".join(lines) + "</div>"
