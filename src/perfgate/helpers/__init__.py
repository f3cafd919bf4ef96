"""Small helpers that know no domain: files and locks in the workspace, CPUs, deadlines, lazy attributes, capped log lines."""
