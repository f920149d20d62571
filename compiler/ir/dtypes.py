"""Element types of tensors in the graph IR, and their numpy and ONNX equivalents."""

from __future__ import annotations

import enum

import numpy


class DType(enum.Enum):
    """Element type of a tensor. The value is the name used in text dumps."""

    FLOAT16 = "f16"
    FLOAT32 = "f32"
    FLOAT64 = "f64"
    INT8 = "i8"
    INT16 = "i16"
    INT32 = "i32"
    INT64 = "i64"
    UINT8 = "u8"
    UINT16 = "u16"
    UINT32 = "u32"
    UINT64 = "u64"
    BOOL = "bool"

    @property
    def np(self) -> numpy.dtype:
        """The numpy dtype with the same representation."""
        return _TO_NUMPY[self]

    @property
    def onnx(self) -> int:
        """The `onnx.TensorProto.DataType` value."""
        return _TO_ONNX[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.FLOAT16, DType.FLOAT32, DType.FLOAT64)

    @property
    def is_int(self) -> bool:
        return not self.is_float and self is not DType.BOOL

    @property
    def is_signed(self) -> bool:
        return self.is_float or self in (DType.INT8, DType.INT16, DType.INT32, DType.INT64)

    @property
    def size_bytes(self) -> int:
        return self.np.itemsize

    @classmethod
    def from_numpy(cls, dtype: numpy.dtype | type) -> DType:
        """The DType of a numpy dtype; raises TypeError for a dtype with no IR equivalent."""
        key = numpy.dtype(dtype)
        for d, n in _TO_NUMPY.items():
            if n == key:
                return d
        raise TypeError(f"numpy dtype {key} has no IR dtype; expected one of "
                        f"{sorted(str(n) for n in _TO_NUMPY.values())}")

    @classmethod
    def from_onnx(cls, elem_type: int) -> DType | None:
        """The DType of an ONNX `TensorProto.DataType`, or None when unsupported."""
        return _FROM_ONNX.get(elem_type)


_TO_NUMPY: dict[DType, numpy.dtype] = {
    DType.FLOAT16: numpy.dtype(numpy.float16), DType.FLOAT32: numpy.dtype(numpy.float32),
    DType.FLOAT64: numpy.dtype(numpy.float64), DType.INT8: numpy.dtype(numpy.int8),
    DType.INT16: numpy.dtype(numpy.int16), DType.INT32: numpy.dtype(numpy.int32),
    DType.INT64: numpy.dtype(numpy.int64), DType.UINT8: numpy.dtype(numpy.uint8),
    DType.UINT16: numpy.dtype(numpy.uint16), DType.UINT32: numpy.dtype(numpy.uint32),
    DType.UINT64: numpy.dtype(numpy.uint64), DType.BOOL: numpy.dtype(numpy.bool_),
}

# Values of onnx.TensorProto.DataType, written out so that this module does not import onnx.
_TO_ONNX: dict[DType, int] = {
    DType.FLOAT32: 1, DType.UINT8: 2, DType.INT8: 3, DType.UINT16: 4, DType.INT16: 5,
    DType.INT32: 6, DType.INT64: 7, DType.BOOL: 9, DType.FLOAT16: 10, DType.FLOAT64: 11,
    DType.UINT32: 12, DType.UINT64: 13,
}
_FROM_ONNX: dict[int, DType] = {v: k for k, v in _TO_ONNX.items()}
