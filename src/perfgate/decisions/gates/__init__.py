"""The gates a ``keep`` must pass, one module per gate or family of gates, listed in order by `registry`."""
