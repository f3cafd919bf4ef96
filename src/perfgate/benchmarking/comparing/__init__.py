"""Comparison and statistics: window summaries, the A/B and its interval, host drift, comparability, differences, noise, screens."""
