"""``nki.dtype``: the dtypes of ``nki.language`` as a module of their own (the older SDK's and
NKI-lib's simulator name them here too)."""

from torchneuron.nki.language import (bfloat16, bool_, float4_e2m1fn_x4, float8_e4m3, float8_e4m3fn, float8_e4m3fn_x4,
                                      float8_e5m2, float8_e5m2_x4, float8_e8m0fnu, float16, float32, int8, int16, int32,
                                      tfloat32, uint8, uint16, uint32)

bool = bool_  # noqa: A001 - as NKI names it

__all__ = ["bool", "bool_", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16", "float32", "bfloat16",
           "tfloat32", "float8_e4m3", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float8_e5m2_x4",
           "float8_e4m3fn_x4", "float4_e2m1fn_x4"]
