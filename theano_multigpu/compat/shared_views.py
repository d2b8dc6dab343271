"""Shared variables whose value lives elsewhere, read right by any Theano
function.

A layer-wise weight is a host shared variable whose value lives on its
context (``graph.placed``); the host variable holds only a placeholder of
its shape.  The shim's own functions read the copy, but a user's
``W.eval()`` or ``theano.function([], W * 2)`` compiled the placeholder
and silently read zeros.  So every ``theano.function`` now reads such a
variable through the graph its ``graph_view()`` method returns (a host view
of the copy): any shared variable with that method takes part.

Except while ``theano.scan`` builds its graph: it compiles a function of
the step to learn which shared variables the step reads, and records those
as the loop's inputs, while the step's graph keeps reading the variables
themselves; a view there made Scan refuse the loop ("ScanOp is missing an
input", a recurrent layer called again once its weights were placed).
Scan then takes the variable as an input like any other, and the
functions that compile the loop read its view.

Imports no Theano: ``install`` runs once ``theano.compile.function`` has,
``install_scan`` once ``theano.scan_module.scan`` has.
"""
import functools
import threading

from ..patch_targets import Parameters, wrap

__all__ = ['install', 'install_scan', 'views_of']

PFUNC = Parameters(
    'theano.compile.function.pfunc',
    ('params', 'outputs', 'mode', 'updates', 'givens', 'no_default_updates',
     'accept_inplace', 'name', 'rebuild_strict', 'allow_input_downcast', 'profile',
     'on_unused_input', 'output_keys'),
    'wrapped: shared variables whose value lives elsewhere are read through their view')


def views_of(roots):
    """[(variable, its view)] for the shared variables ``roots`` read whose
    value lives elsewhere; ``roots`` may hold theano.Out wrappers (Scan
    compiles its inner function with them)."""
    from theano import gof
    roots = [getattr(r, 'variable', r) for r in roots]
    found = []
    for variable in gof.graph.inputs([r for r in roots if isinstance(r, gof.Variable)]):
        view = getattr(variable, 'graph_view', None)
        view = view() if view is not None else None
        if view is not None:
            found.append((variable, view))
    return found


SCAN = Parameters(
    'theano.scan_module.scan.scan',
    ('fn', 'sequences', 'outputs_info', 'non_sequences', 'n_steps', 'truncate_gradient',
     'go_backwards', 'mode', 'name', 'profile', 'allow_gc', 'strict', 'return_list'),
    'wrapped: shared variables are read as they are while it builds its graph')

# How many theano.scan calls of this thread are building their graph.
_building = threading.local()


def _reading_views(pfunc):
    def pfunc_reading_views(params, outputs=None, mode=None, updates=None, givens=None,
                            *args, **kwargs):
        if getattr(_building, 'scans', 0):
            return pfunc(params, outputs, mode, updates, givens, *args, **kwargs)
        roots = list(outputs) if isinstance(outputs, (list, tuple)) else (
            [outputs] if outputs is not None else [])
        pairs = list(updates.items()) if isinstance(updates, dict) else list(updates or [])
        views = views_of(roots + [value for _, value in pairs])
        if views:
            given = list(givens.items()) if isinstance(givens, dict) else list(givens or [])
            taken = set(id(v) for v, _ in given)
            givens = given + [(v, view) for v, view in views if id(v) not in taken]
        return pfunc(params, outputs, mode, updates, givens, *args, **kwargs)
    return pfunc_reading_views


def install(function_module):
    """Wrap the ``pfunc`` that ``theano.function`` calls."""
    wrap(PFUNC, function_module, 'pfunc', _reading_views)


def _building_without_views(scan):
    @functools.wraps(scan)
    def scan_without_views(*args, **kwargs):
        _building.scans = getattr(_building, 'scans', 0) + 1
        try:
            return scan(*args, **kwargs)
        finally:
            _building.scans -= 1
    return scan_without_views


def install_scan(scan_module):
    """Wrap ``theano.scan_module.scan.scan``: the names ``theano.scan`` and
    ``theano.scan_module.scan`` bind it after this module has run."""
    wrap(SCAN, scan_module, 'scan', _building_without_views)
