"""The step's memory per context, measured (``multigpu.measure_peak``).

A function compiled with ``measuring_mode`` runs on Theano's Python VM, the
Stack, which frees each value after its last use as the default C VM does
(in its own order: see ``peak_plan``), with a ``PeakMeter`` as its
callback: after every op, the meter adds up the bytes of the GPU arrays
the function holds on each context (its inputs, the shared variables it
reads, every value computed and not yet freed) and keeps the most seen,
per context, over the function's calls.  An array read through several
views counts once: each buffer is counted to the end of the furthest view
of it still held (a view of its head alone counts that head, though the
buffer stays whole).  Not counted: the values Scan keeps inside its loop,
an op's own workspace, and what the allocator caches.  The steps run
slower (a Python loop over the ops and a sum after each): a mode to
measure with, not to train with.
"""
import theano
from theano.gof.vm import VM_Linker
from theano.gpuarray.type import get_context

__all__ = ['PeakMeter', 'measuring_mode', 'peak_of']


class PeakMeter(object):
    """The Stack VM's callbacks: ``peak``, {context name: the most bytes
    live on it at any op of any call so far}; ``names``, {id of a
    GpuContext: its name} (a context it does not name is counted as
    'default')."""

    def __init__(self, names):
        self.names = dict(names)
        self.peak = {}
        self._roots = []     # the inputs, shared variables and constants read
        self._cells = {}     # id(variable): storage cell of each value held this call
        self._in_call = False

    def read_input(self, variable, value):
        """``callback_input``: a call begins by reading each of its
        inputs, shared variables and constants, held until it ends."""
        if self._in_call:
            self._roots, self._cells, self._in_call = [], {}, False
        self._roots.append(variable)

    def __call__(self, node, thunk, storage_map, compute_map):
        """``callback``: after ``node`` ran, before its inputs are freed.
        Values are read through the VM's own storage: the meter keeps none
        alive."""
        if not self._in_call:
            self._in_call = True
            self._cells = dict((id(v), storage_map[v]) for v in self._roots if v in storage_map)
        for output in node.outputs:
            self._cells[id(output)] = storage_map[output]
        for key in [k for k, cell in self._cells.items() if cell[0] is None]:
            del self._cells[key]
        live = self.live_bytes([cell[0] for cell in self._cells.values()])
        for name, n in live.items():
            if n > self.peak.get(name, 0):
                self.peak[name] = n

    def live_bytes(self, values):
        """{context name: bytes of the buffers that the GPU arrays among
        ``values`` hold}, each buffer once."""
        extents = {}
        for value in values:
            if hasattr(value, 'base_data') and hasattr(value, 'context'):
                key = (self.names.get(id(value.context), 'default'), value.base_data)
                extents[key] = max(extents.get(key, 0), _extent(value))
        live = {}
        for (name, _), n in extents.items():
            live[name] = live.get(name, 0) + n
        return live


def _extent(array):
    """Bytes from the start of an array's buffer to the end of its last
    element: its offset (its first element's, whichever way its strides
    run) and its elements along the strides that run forward."""
    if array.size == 0:
        return int(array.offset)
    forward = sum((dim - 1) * stride for dim, stride in zip(array.shape, array.strides)
                  if stride > 0)
    return int(array.offset) + forward + array.itemsize


def measuring_mode(graph_names):
    """A Theano Mode with the default optimizer whose functions measure
    their peak per context: ``graph_names``, {graph name of a context (None
    for Theano's default): the name to report it by}."""
    names = {}
    for graph_name, name in graph_names.items():
        context = get_context(graph_name)
        names[id(context)] = name
    meter = PeakMeter(names)
    default = theano.compile.mode.get_default_mode()
    linker = VM_Linker(allow_gc=True, use_cloop=False, callback=meter,
                       callback_input=meter.read_input)
    return theano.compile.Mode(linker=linker, optimizer=default.provided_optimizer)


def peak_of(theano_function):
    """{context name: peak bytes} measured over a function's calls so far,
    or None for a function not compiled in ``measuring_mode``."""
    meter = getattr(theano_function.maker.linker, 'callback', None)
    return dict(meter.peak) if isinstance(meter, PeakMeter) else None
