"""What Theano does while it compiles a function, told to whoever watches
that compile: when linking starts (and over how many ops), each op linked,
each C module built.

A watcher is an object with ``linking(ops)``, ``linked()``,
``module_built()`` and ``entering(phase)`` (which returns the phase it
was in; the shim's rewrite tells it ``phase('gradients')`` while it takes
the gradients); ``watching(watcher)`` makes it the watcher of the
compiles this thread runs inside the block (the innermost block's, when
blocks nest).  Only the ops of the function's own graph count, each once:
the inner functions Scan compiles while its op is linked (and the
constants their optimiser folds) are a part of linking that op.  Ops link
through ``Op.make_thunk``, or Scan's and IfElse's own.  Without a watcher,
the hooks cost one attribute read.
"""
import contextlib
import threading

from .. import importhook
from ..patch_targets import Parameters, wrap

__all__ = ['install', 'watching', 'phase']

MAKE_ALL = Parameters(
    'theano.gof.vm.VM_Linker.make_all',
    ('self', 'profiler', 'input_storage', 'output_storage', 'storage_map'),
    "wrapped: the watcher learns that linking starts, and over how many ops")
MAKE_THUNK_PARAMETERS = ('self', 'node', 'storage_map', 'compute_map', 'no_recycling', 'impl')
MAKE_THUNK = Parameters('theano.gof.op.Op.make_thunk', MAKE_THUNK_PARAMETERS,
                        'wrapped: the watcher counts the ops linked')
SCAN_MAKE_THUNK = Parameters('theano.scan_module.scan_op.Scan.make_thunk',
                             MAKE_THUNK_PARAMETERS, 'wrapped: the watcher counts the ops linked')
IFELSE_MAKE_THUNK = Parameters('theano.ifelse.IfElse.make_thunk', MAKE_THUNK_PARAMETERS,
                               'wrapped: the watcher counts the ops linked')
COMPILE_CMODULE = Parameters(
    'theano.gof.cc.CLinker.compile_cmodule', ('self', 'location'),
    'wrapped: the watcher counts the C modules built')

# This thread's watchers (a stack), how deep inside make_all it is, and
# the nodes of the graph make_all links at depth 1 not linked yet.
_state = threading.local()


@contextlib.contextmanager
def watching(watcher):
    """``watcher`` is told of the compiles this thread runs in the block."""
    stack = _stack()
    stack.append(watcher)
    try:
        yield watcher
    finally:
        stack.pop()


@contextlib.contextmanager
def phase(name):
    """While the block runs, this thread's watcher (if any) is in phase
    ``name``; then in the phase it was in."""
    stack = _stack()
    if not stack:
        yield
        return
    watcher = stack[-1]
    before = watcher.entering(name)
    try:
        yield
    finally:
        watcher.entering(before)


def _stack():
    if not hasattr(_state, 'watchers'):
        _state.watchers, _state.depth, _state.unlinked = [], 0, set()
    return _state.watchers


def _watcher(outermost=True):
    """This thread's watcher, if any (with ``outermost``, only while the
    function's own graph is linked)."""
    stack = _stack()
    if not stack or (outermost and _state.depth != 1):
        return None
    return stack[-1]


def _telling_linking(make_all):
    def watched_make_all(self, *args, **kwargs):
        _stack()
        _state.depth += 1
        try:
            watcher = _watcher()
            if watcher is not None:
                _state.unlinked = set(self.fgraph.apply_nodes)
                watcher.linking(len(_state.unlinked))
            return make_all(self, *args, **kwargs)
        finally:
            _state.depth -= 1
            if _state.depth == 0:
                _state.unlinked = set()
    return watched_make_all


def _counting_ops(make_thunk):
    def watched_make_thunk(self, node, *args, **kwargs):
        thunk = make_thunk(self, node, *args, **kwargs)
        watcher = _watcher()
        if watcher is not None and node in _state.unlinked:
            _state.unlinked.discard(node)
            watcher.linked()
        return thunk
    return watched_make_thunk


def _counting_modules(compile_cmodule):
    def watched_compile_cmodule(self, *args, **kwargs):
        module = compile_cmodule(self, *args, **kwargs)
        watcher = _watcher(outermost=False)
        if watcher is not None:
            watcher.module_built()
        return module
    return watched_compile_cmodule


def _watch_linking(vm):
    wrap(MAKE_ALL, vm.VM_Linker, 'make_all', _telling_linking)


def _watch_ops(op):
    wrap(MAKE_THUNK, op.Op, 'make_thunk', _counting_ops)


def _watch_scan_ops(scan_op):
    wrap(SCAN_MAKE_THUNK, scan_op.Scan, 'make_thunk', _counting_ops)


def _watch_ifelse_ops(ifelse):
    wrap(IFELSE_MAKE_THUNK, ifelse.IfElse, 'make_thunk', _counting_ops)


def _watch_modules(cc):
    wrap(COMPILE_CMODULE, cc.CLinker, 'compile_cmodule', _counting_modules)


def install():
    """Register the hooks, each applied when its Theano module is imported."""
    importhook.after_import('theano.gof.vm', _watch_linking)
    importhook.after_import('theano.gof.op', _watch_ops)
    importhook.after_import('theano.scan_module.scan_op', _watch_scan_ops)
    importhook.after_import('theano.ifelse', _watch_ifelse_ops)
    importhook.after_import('theano.gof.cc', _watch_modules)
