"""Fleet causality: rules above the single job and incident grouping, pure functions over
the plain records of `model` (no I/O, no clock)."""
