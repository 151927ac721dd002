"""Attention capture, analysis, plots and reports."""
