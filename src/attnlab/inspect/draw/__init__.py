"""What draws: attention maps and statistic plots (``plots``), text -> image-patch
pictures (``image_attention``) and the offline HTML pages (``report``).

Every picture is a :class:`matplotlib.figure.Figure` on the Agg canvas, never
``pyplot``: nothing is shown, no global figure state, headless.
"""

from .image_attention import plot_text_to_image_attention
from .plots import bucket_attention, plot_head, plot_layer, plot_model, plot_statistic, save_figure
from .report import render_report, render_summary, stats_tables_html, write_report

__all__ = [
    "bucket_attention",
    "plot_head",
    "plot_layer",
    "plot_model",
    "plot_statistic",
    "plot_text_to_image_attention",
    "render_report",
    "render_summary",
    "save_figure",
    "stats_tables_html",
    "write_report",
]
