"""Experiments, their evidence, and the gates a `keep` decision must pass."""
