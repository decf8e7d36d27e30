"""ONNX element types as tgc element types, and the words the errors use for them."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from tgc.types import ELEMENT_TYPE_OF_DTYPE

# TensorProto.DataType -> tgc element type: the ONNX types tgc can hold.
ELEMENT_TYPES: dict[int, str] = {
    TensorProto.FLOAT: "f32",
    TensorProto.DOUBLE: "f64",
    TensorProto.FLOAT16: "f16",
    TensorProto.BFLOAT16: "bf16",
    TensorProto.INT8: "i8",
    TensorProto.INT32: "i32",
    TensorProto.INT64: "i64",
    TensorProto.BOOL: "i1",
}

SUPPORTED_WORDS = "float, double, float16, bfloat16, int8, int32, int64, bool"


def onnx_type_name(data_type: int) -> str:
    """'FLOAT16' -> 'float16': ONNX's own name of an element type, as users know it."""
    try:
        return TensorProto.DataType.Name(data_type).lower()
    except ValueError:
        return f"<unknown element type {data_type}>"


def element_type(data_type: int) -> str | None:
    """The tgc element type of an ONNX one, or None when tgc has no such type."""
    return ELEMENT_TYPES.get(data_type)


def element_type_of_array(array: np.ndarray) -> str | None:
    """The tgc element type of a numpy array's dtype, or None."""
    return ELEMENT_TYPE_OF_DTYPE.get(array.dtype)
