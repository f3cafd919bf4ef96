"""Reading what a run wrote: the harness's rank records and training logs in the formats other launchers print."""
