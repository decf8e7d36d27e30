"""tgc's passes, one module each. Importing this package registers them all."""

from tgc.passes import (  # noqa: F401
    algebraic,
    apply_rules,
    canonicalize,
    cse,
    dce,
    eqsat,
    fold_batch_norm,
    fuse,
    lower_hl,
    optimize,
    print_op_stats,
    raise_attention,
    raise_gelu,
    verify,
)
