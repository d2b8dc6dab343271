"""Buffer operations that Scan's loop needs on every kind of context,
shared by the Python loop (``theano_fixes`` edits Theano's) and the
compiled one (``scan_loop.pyx``)."""

__all__ = ['device_address', 'host_address', 'rotate_left']


def device_address(array):
    """Where a GpuArray's data starts, on any kind of context (pygpu's
    ``gpudata`` answers for CUDA arrays only)."""
    return (array.base_data, array.offset)


def host_address(array):
    """Where an ndarray's data starts."""
    return array.__array_interface__['data'][0]


def rotate_left(buffer, shift, buffer_type):
    """``buffer[:] = roll(buffer, -shift, axis=0)`` through a temporary, so no
    copy reads and writes overlapping parts of one buffer (OpenCL refuses
    those: "Memory copy overlap")."""
    length = buffer.shape[0]
    rotated = buffer_type.value_zeros(buffer.shape)
    rotated[:length - shift] = buffer[shift:]
    rotated[length - shift:] = buffer[:shift]
    buffer[:] = rotated
