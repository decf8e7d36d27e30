"""tgc: a multi-level tensor-graph compiler."""
