"""The analyses of one rank's trace: kernels, operators, host phases, idle time, temporal breakdown, code attribution, sequences, steps, efficiency."""
