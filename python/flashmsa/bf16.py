"""bf16 for numpy, which has no bfloat16 dtype: FlashMSA reads uint16 arrays as bf16 bits."""

import numpy as np


def to_bf16(x):
    """float array -> uint16 array of its bf16 bits, rounded to nearest even (NaN stays NaN)."""
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    # Rounding could carry a NaN's payload into the exponent (an infinity): keep it a quiet NaN.
    return np.where(np.isnan(f), np.uint16(0x7FC0) | (bits & np.uint16(0x8000)), bits)


def from_bf16(bits):
    """uint16 array of bf16 bits -> float32 array (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
