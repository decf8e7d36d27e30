"""Importers: models from other frameworks (ONNX, torch.export) to tgc modules.

Each importer builds a verified `builtin.module` with the core builder and the ops of
`tgc.dialects`; it imports nothing else of tgc (see test/test_layering.py).
"""
