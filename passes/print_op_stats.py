"""`print-op-stats`: count the ops of each kind, as MLIR's pass of that name does."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass

from tgc.builtin import ModuleOp
from tgc.pass_manager import Pass, PassStatistics, option, register_pass


@register_pass
@dataclass(frozen=True)
class PrintOpStats(Pass):
    """Print to stderr how many ops of each name the module holds (`json=true` for JSON).

    Contract: never changes the IR.
    """

    name = "print-op-stats"
    summary = "Print the number of ops of each kind"
    json: bool = option(False, "print JSON")

    def run_on_module(self, module: ModuleOp, stats: PassStatistics) -> None:
        counts = Counter(op.name for op in module.walk() if op is not module)
        if self.json:
            import json

            print(json.dumps(dict(sorted(counts.items()))), file=sys.stderr)
            return
        print("Operations encountered:", file=sys.stderr)
        print("-----------------------", file=sys.stderr)
        width = max((len(n) for n in counts), default=0)
        for name in sorted(counts):
            print(f"  {name.ljust(width)} , {counts[name]:>6}", file=sys.stderr)
