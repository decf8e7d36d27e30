"""tgc's dialects. Importing this package registers every op (see tgc.opdef.OPS)."""

from tgc.dialects import atomic, hl, hl_conv, hl_image, hl_pool, kernel  # noqa: F401

hl.builtin_ops_loaded()
