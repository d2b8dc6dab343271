"""Buffer operations that Scan's loop needs on every kind of context,
shared by the Python loop (``theano_fixes`` edits Theano's) and the
compiled one (``scan_loop.pyx``)."""

__all__ = ['device_address', 'host_address', 'rotate_left', 'unfilled']


def device_address(array):
    """Where a GpuArray's data starts, on any kind of context (pygpu's
    ``gpudata`` answers for CUDA arrays only)."""
    return (array.base_data, array.offset)


def host_address(array):
    """Where an ndarray's data starts."""
    return array.__array_interface__['data'][0]


def unfilled(buffer_type, shape):
    """A new buffer of ``buffer_type`` (a GpuArrayType or TensorType) and
    ``shape``, its contents undefined.  Rule: only for a buffer the loop
    writes whole before it is read (each step's output, a rotation's
    temporary); Scan zeroes the rows a shortened loop left unwritten before
    it returns them.  No fill: on OpenCL a fill builds a kernel
    (libgpuarray's memset)."""
    context = getattr(buffer_type, 'context', None)
    if context is not None:
        import pygpu
        return pygpu.gpuarray.empty(shape, dtype=buffer_type.dtype, context=context)
    import numpy
    return numpy.empty(shape, dtype=buffer_type.dtype)


def rotate_left(buffer, shift, buffer_type):
    """``buffer[:] = roll(buffer, -shift, axis=0)`` through a temporary, so no
    copy reads and writes overlapping parts of one buffer (OpenCL refuses
    those: "Memory copy overlap")."""
    length = buffer.shape[0]
    rotated = unfilled(buffer_type, buffer.shape)
    rotated[:length - shift] = buffer[shift:]
    rotated[length - shift:] = buffer[:shift]
    buffer[:] = rotated
