"""tgc's passes, one module each. Importing this package registers them all."""

from tgc.passes import algebraic, canonicalize, cse, dce, fuse, print_op_stats, verify, lower_hl, optimize  # noqa: F401
