"""Arrow arrays from numpy arrays without pyarrow's pandas probe.

`pa.array(ndarray)` asks pyarrow's pandas shim whether the array is a pandas categorical, and
that imports pandas when it is installed: 0.3-0.5 CPU-s, once per process, measured as the
largest single cost of a 1M-entry `replay_as_of --engine local` after decoding (issue 23; the
first `take` of a chunk with a non-candidate entry paid it). `arrow_array` builds the same
array from the numpy buffer directly: fixed-width numbers, and booleans bit-packed.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa


def arrow_array(values: npt.NDArray[np.generic]) -> pa.Array:
    """A one-dimensional numeric or boolean numpy array as an Arrow array with no nulls."""
    assert values.ndim == 1
    if values.dtype == np.bool_:
        bits = np.packbits(values.astype(np.bool_, copy=False), bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])
    assert values.dtype.kind in "iuf", values.dtype
    native = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))
    arrow_type = pa.from_numpy_dtype(native.dtype)
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(native)])
