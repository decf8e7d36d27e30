"""Registries stay consistent, so forgetting a step when adding an op or a pass fails a test."""

from __future__ import annotations

from pathlib import Path

import pytest

import tgc.dialects  # noqa: F401
import tgc.passes  # noqa: F401
from tgc.ir import Operation
from tgc.opdef import OPS, Operand, register
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


def test_elementwise_atomic_ops_have_a_cuda_expression():
    codegen = pytest.importorskip("tgc.codegen.cuda_ops", reason="codegen table not built yet")
    table = getattr(codegen, "CODE_FOR_OP")
    missing = [cls.name for cls in OPS.values()
               if cls.name.startswith("atomic.") and "elementwise" in cls.traits
               and not any(key == cls.name or key.startswith(cls.name + "[") for key in table)]
    assert not missing, f"no CODE_FOR_OP entry for {missing}"
