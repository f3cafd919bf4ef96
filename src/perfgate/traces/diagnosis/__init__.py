"""What a profile says: ranked findings, the diff of two profiles, the host load while it was captured, and what a profiled segment earns."""
