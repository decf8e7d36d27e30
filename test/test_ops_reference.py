"""docs/ops.md is the op definitions (tgc/tools/ops_reference.py), and the definitions keep one
spelling of axis attributes."""

from __future__ import annotations

from pathlib import Path

import tgc
from tgc.opdef import INT, INTS, OPS
from tgc.tools import ops_reference

DOC = Path(__file__).resolve().parent.parent / "docs" / "ops.md"
REGENERATE = "python -m tgc.tools.ops_reference > docs/ops.md"


def test_docs_ops_md_is_made_from_the_definitions():
    tgc.load_all()
    made = ops_reference.reference()
    assert DOC.read_text() == made, f"docs/ops.md is out of date: run `{REGENERATE}`"


def test_every_op_has_a_section_and_a_line():
    tgc.load_all()
    made = ops_reference.reference()
    listed = ops_reference.list_ops(None).splitlines()
    for name in OPS:
        assert f"### `{name}`" in made
    assert [line.split()[0] for line in listed] == sorted(OPS)


def test_an_hl_section_shows_the_decomposition_without_the_op():
    tgc.load_all()
    section = ops_reference.section("hl.softmax")
    lowered = section.split("Decomposes into", 1)[1]
    assert "atomic.exp" in lowered and "atomic.reduce_max" in lowered
    assert "hl.softmax" not in lowered
    assert "- attributes: `axis` (an integer, default -1)" in section


def test_axis_attributes_have_one_spelling():
    """`axis` is one integer (an op along one axis: softmax, concat, layernorm from `axis` on);
    `axes` is a list (an op over a set of axes: the reductions, mean); no op says `dim`."""
    tgc.load_all()
    for name, cls in OPS.items():
        for attr, d in cls.attr_defs.items():
            assert attr not in ("dim", "dims", "axises"), name
            if attr == "axis":
                assert d.kind is INT, name
            if attr == "axes":
                assert d.kind is INTS, name
