"""Registries stay consistent, so forgetting a step when adding an op or a pass fails a test."""

from __future__ import annotations

from pathlib import Path

import pytest

import tgc.dialects  # noqa: F401
import tgc.passes  # noqa: F401
from tgc.ir import Operation
from tgc.opdef import (
    ELEMENTWISE,
    FREE,
    MOVE,
    OPS,
    PURE,
    REDUCTION,
    VIEW,
    Operand,
    register,
)
from tgc.pass_manager import PASSES

LIT = Path(__file__).resolve().parent / "lit"


def test_op_registry_keys_are_op_names():
    assert OPS and all(name == cls.name for name, cls in OPS.items())


def test_pass_registry_keys_are_pass_names():
    assert PASSES and all(name == cls.name for name, cls in PASSES.items())


def test_every_op_and_pass_is_documented():
    for cls in OPS.values():
        assert cls.__doc__ and cls.__doc__.strip(), cls.name
    for cls in PASSES.values():
        assert cls.summary and cls.__doc__, cls.name


@pytest.mark.parametrize("name", sorted(PASSES))
def test_every_pass_has_lit_tests(name):
    folder = LIT / name
    tests = [p for p in folder.glob("*") if p.suffix in (".tg", ".mlir", ".test")]
    assert tests, f"pass '{name}' has no lit tests in test/lit/{name}/"


def test_duplicate_op_names_are_refused():
    class Again(Operation):
        """Impostor. `%y = atomic.add %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>`"""

        name = "atomic.add"
        operand_defs = (Operand("a"), Operand("b"))

    with pytest.raises(TypeError, match="registered twice"):
        register(Again)
    assert OPS["atomic.add"] is not Again


def test_ops_need_a_dialect_prefix_and_a_docstring():
    class NoDialect(Operation):
        """x"""

        name = "add"

    class NoDoc(Operation):
        name = "test.nodoc"

    with pytest.raises(TypeError, match="dialect.op"):
        register(NoDialect)
    with pytest.raises(TypeError, match="docstring"):
        register(NoDoc)


# -- op traits and the codegen table that serves each -------------------------------------------


def _code_for_op_entry(cls) -> bool:
    """An elementwise op's C expression: under its name, or under each of its variants."""
    from tgc.codegen.cuda_ops import CODE_FOR_OP

    return any(key == cls.name or key.startswith(cls.name + "[") for key in CODE_FOR_OP)


def _view_index_map(cls) -> bool:
    from tgc.codegen.emitter import VIEW_INDEX_MAPS

    return cls.name in VIEW_INDEX_MAPS


def _reduce_code(cls) -> bool:
    from tgc.codegen.cuda_ops import REDUCE_CODE

    return cls.name in REDUCE_CODE


# trait -> (the codegen table that must hold an entry for each op with it, its name)
TRAIT_TABLES = {
    ELEMENTWISE: (_code_for_op_entry, "cuda_ops.CODE_FOR_OP"),
    VIEW: (_view_index_map, "emitter.VIEW_INDEX_MAPS"),
    REDUCTION: (_reduce_code, "cuda_ops.REDUCE_CODE"),
}


def ops_missing_an_entry(trait: str) -> list[str]:
    """The registered ops with `trait` that the trait's codegen table has no entry for."""
    has_entry, _ = TRAIT_TABLES[trait]
    return sorted(cls.name for cls in OPS.values() if trait in cls.traits and not has_entry(cls))


@pytest.mark.parametrize("trait", sorted(TRAIT_TABLES))
def test_every_op_with_a_trait_has_its_codegen_entry(trait):
    assert any(trait in cls.traits for cls in OPS.values()), f"no op has the trait '{trait}'"
    missing = ops_missing_an_entry(trait)
    assert not missing, f"no {TRAIT_TABLES[trait][1]} entry for {missing}"


@pytest.mark.parametrize("trait", sorted(TRAIT_TABLES))
def test_an_op_without_its_codegen_entry_is_found(trait):
    """A new op with the trait and no table entry (a fake op, registered for this test only)
    is exactly what the check above reports."""

    class Forgotten(Operation):
        """A fake op. `%y = test.forgotten %x : (tensor<4xf32>) -> tensor<4xf32>`"""

        name = "test.forgotten"
        operand_defs = (Operand("x"),)
        traits = frozenset({PURE, trait})

    register(Forgotten)
    try:
        assert ops_missing_an_entry(trait) == ["test.forgotten"]
    finally:
        del OPS["test.forgotten"]
    assert ops_missing_an_entry(trait) == []


def test_every_view_op_has_a_stride_rule():
    """tgc/views.py follows every op with the VIEW trait through its stride rule."""
    from tgc.views import STRIDE_RULES

    views = sorted(cls.name for cls in OPS.values() if VIEW in cls.traits)
    assert views and [name for name in views if name not in STRIDE_RULES] == []


def test_trait_implications():
    """A view does no arithmetic (MOVE: the cost model counts no flops, a kernel that only moves
    data is named after its moves); every trait of this family sits on pure ops only."""
    for cls in OPS.values():
        if VIEW in cls.traits:
            assert MOVE in cls.traits, cls.name
        if cls.traits & {VIEW, REDUCTION, MOVE, FREE}:
            assert PURE in cls.traits, cls.name
        assert not (REDUCTION in cls.traits and cls.traits & {ELEMENTWISE, MOVE}), cls.name
