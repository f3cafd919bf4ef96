"""Hardware facts: the sourced peak table and device lookups."""
