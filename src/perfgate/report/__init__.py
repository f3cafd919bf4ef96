"""Plots (optional matplotlib) and the self-contained HTML report."""
