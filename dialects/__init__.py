"""tgc's dialects. Importing this package registers every op (see tgc.opdef.OPS)."""

from tgc.dialects import atomic, hl, kernel  # noqa: F401
