"""tgc's dialects. Importing this package registers every op (see tgc.opdef.OPS)."""

from dialects import atomic, hl  # noqa: F401
