"""`verify`: check the module (useful with --disable-verify, and to test the pass machinery)."""

from __future__ import annotations

from dataclasses import dataclass

from tgc.builtin import ModuleOp
from tgc.pass_manager import Pass, PassStatistics, register_pass
from tgc.verifier import verify


@register_pass
@dataclass(frozen=True)
class Verify(Pass):
    """Verify every op of the module. Contract: never changes the IR; fails on the first error."""

    name = "verify"
    summary = "Verify the module (changes nothing)"

    def run_on_module(self, module: ModuleOp, stats: PassStatistics) -> None:
        verify(module)
