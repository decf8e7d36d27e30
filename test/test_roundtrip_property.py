"""Property: every valid module round-trips. parse(print(m)) equals m (same ops, operands,
types, attributes and names), and printing is a fixed point, in both the custom and the generic
form. Modules are built at random with the builder, including awkward names and attributes.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tgc.attributes import DenseAttr, attribute_key
from tgc.builder import FunctionBuilder
from tgc.parser import parse_module
from tgc.printer import print_module
from tgc.types import TensorType

ELEMS = ["f32", "f16", "bf16", "f64"]
NAMES = st.one_of(
    st.none(),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_$.]{0,6}", fullmatch=True),
    st.integers(0, 20).map(str),
)


@st.composite
def modules(draw):
    elem = draw(st.sampled_from(ELEMS))
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    t = TensorType(shape, elem)
    n_args = draw(st.integers(1, 3))
    fb = FunctionBuilder(
        draw(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)),
        [t] * n_args,
        [draw(NAMES) for _ in range(n_args)],
    )
    values = list(fb.args)
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.integers(0, 6))
        x = draw(st.sampled_from(values))
        y = draw(st.sampled_from(values))
        if kind == 0:
            v = getattr(fb.atomic, draw(st.sampled_from(["add", "sub", "mul", "max", "div"])))(x, y)
        elif kind == 1:
            v = getattr(fb.atomic, draw(st.sampled_from(["neg", "exp", "abs", "sqrt", "erf"])))(x)
        elif kind == 2:
            axes = (draw(st.integers(-rank, rank - 1)),)
            r = fb.atomic.reduce_sum(x, axes=axes, keepdims=True)
            v = fb.atomic.add(x, r)
        elif kind == 3:
            perm = tuple(draw(st.permutations(range(rank))))
            v = fb.atomic.transpose(x, perm=perm)
            v = fb.atomic.transpose(v, perm=tuple(int(i) for i in np.argsort(perm)))
        elif kind == 4:
            value = draw(st.floats(-6e4, 6e4, allow_nan=False, width=16))
            c = fb.atomic.constant(
                value=DenseAttr.splat(value, t.with_shape(())), result_type=t.with_shape(())
            )
            v = fb.atomic.mul(x, c)
        elif kind == 5:
            data = np.array(
                draw(
                    st.lists(st.floats(-100, 100, width=16), min_size=shape[-1], max_size=shape[-1])
                )
            )
            ct = t.with_shape((shape[-1],))
            v = fb.atomic.add(x, fb.atomic.constant(value=DenseAttr(data, ct), result_type=ct))
        else:
            v = fb.atomic.cmp(x, y, pred=draw(st.sampled_from(["lt", "ge", "ne"])))
            v = fb.atomic.where(v, x, y)
        v.name_hint = draw(NAMES)
        values.append(v)
    results = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))
    return fb.ret(*results)


def signature(module) -> list:
    """Everything that makes a module what it is, with values named as the printer names them."""
    from tgc.printer import Printer

    out = []
    for func in module.funcs:
        p = Printer()
        p.assign_names(func)
        out.append((func.sym_name, func.function_type, [p.name(a) for a in func.body.args]))
        for op in func.body.ops:
            attrs = sorted((k, attribute_key(v)) for k, v in op.attributes.items())
            out.append(
                (
                    op.name,
                    [p.name(v) for v in op.operands],
                    [p.name(r) for r in op.results],
                    [r.type for r in op.results],
                    attrs,
                )
            )
    return out


@settings(max_examples=150, deadline=None)
@given(modules())
def test_random_modules_round_trip(module):
    text = print_module(module)
    again = parse_module(text, "prop.tg")
    assert signature(again) == signature(module)
    assert print_module(again) == text
    generic = print_module(module, generic=True)
    assert print_module(parse_module(generic, "prop-generic.tg")) == text
