"""The planner: every way a graph could run, its cost, and the choice of the fastest one.

See docs/planner.md. Layers: the planner uses the core, the dialects, the passes, codegen and the
runtime; nothing below it imports it.
"""
