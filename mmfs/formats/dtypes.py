"""Token dtypes and their MMIDIDX codes (megatron-core's DType enum)."""

import numpy as np

CODE_TO_DTYPE = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
DTYPE_TO_CODE = {dtype: code for code, dtype in CODE_TO_DTYPE.items()}

# Not an MMIDIDX code: the C core's code for .pbin files of 4-byte tokens.
UINT32_CODE = 9


_NATIVE_CODES: dict = {}  # as asked for -> code: asked for each of 100,000 arrays of a mount


def native_code(dtype: np.dtype) -> int:
    """The C core's dtype code for a token dtype."""
    code = _NATIVE_CODES.get(dtype)
    if code is None:
        found = np.dtype(dtype)
        code = UINT32_CODE if found == np.uint32 else DTYPE_TO_CODE[found]
        _NATIVE_CODES[dtype] = code
    return code


def optimal_dtype(vocab_size: int | None) -> np.dtype:
    """The dtype Megatron's preprocessing picks for a vocabulary size."""
    if vocab_size is not None and vocab_size < 65500:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)
