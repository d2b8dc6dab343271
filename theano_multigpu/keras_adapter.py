"""The Keras adapter: the backend entries the shim takes over.

The shim's backend is Keras's own Theano backend with these entries
replaced, in ``keras.backend`` and in ``keras.backend.theano_backend`` (whose
functions call each other through module globals: ``K.zeros`` reaches
``variable`` there).  This module is the one place that knows Keras.
"""
import sys

import numpy as np

from . import mesh as mesh_module

__all__ = ['TAKEN_OVER', 'install', 'stock']

TAKEN_OVER = ('variable', 'function', 'gradients', 'get_value', 'set_value',
              'batch_get_value', 'batch_set_value', 'eval')

# Keras's own implementations, captured before they are replaced.
stock = {}


def variable(value, dtype=None, name=None):
    """A shared variable, placed on the master context when contexts are set
    (by Theano itself when the master is its default context); in layer-wise
    mode, on the context the plan gives its layer."""
    from keras.backend import floatx
    dtype = dtype or floatx()   # Keras 1.0.1's default is float64, 1.2's floatx
    mesh = mesh_module.current()
    if mesh.mode == 'layer' and not hasattr(value, 'tocoo'):
        from . import layerwise
        return layerwise.new_variable(value, dtype, name)
    target = mesh.graph_name(mesh.master)
    if target is None or hasattr(value, 'tocoo'):
        return stock['variable'](value, dtype=dtype, name=name)
    import theano
    value = np.asarray(value, dtype=dtype)
    shared = theano.shared(value=value, name=name, strict=False, target=target)
    shared._keras_shape = value.shape
    shared._uses_learning_phase = False
    return shared


def function(inputs, outputs, updates=[], **kwargs):
    """One Theano function; in batch-wise and layer-wise mode, spread over
    the contexts, and under MPI over the ranks too."""
    mesh = mesh_module.current()
    ranks = _mpi_ranks(mesh)
    if mesh.mode == 'layer':
        return _layerwise_function(list(inputs), list(outputs), _unique_updates(updates),
                                   kwargs, mesh, _function_title(sys._getframe(1)))
    if mesh.mode != 'batch' and ranks is None:
        if mesh.graph_name(mesh.master) is not None:
            _steer_to(inputs, mesh.graph_name(mesh.master))
        return stock['function'](inputs, outputs, updates=updates, **kwargs)
    from . import batchwise
    updates = _unique_updates(updates)
    roots = list(outputs) + [new for _, new in updates]
    _refuse_stateful(roots)
    title = _function_title(sys._getframe(1))
    if ranks is not None:
        from . import mpi
        mpi.agree_and_broadcast(_weights_read(roots, updates), title)
        if mesh.graph_name(mesh.master) is not None:
            _steer_to(inputs, mesh.graph_name(mesh.master))

    def compile_for(mesh, idle=False):
        return _compile_batchwise(list(inputs), list(outputs), updates, kwargs, mesh, title,
                                  ranks, idle)
    return batchwise.SplitFunction(compile_for, mesh, ranks)


def _mpi_ranks(mesh):
    """(rank, size) when this process is one of several MPI ranks, else
    None.  Layer-wise mode is refused under MPI."""
    from . import launcher
    if not launcher.launched_by_mpi():
        return None
    if mesh.mode == 'layer':
        from .errors import ConfigurationError
        raise ConfigurationError(
            'under MPI each rank trains batch-wise on its share of the batch, but '
            'THEANO_FLAGS sets multigpu.mode=layer; use multigpu.mode=batch (or '
            'auto), or run layer-wise in one process without mpirun')
    from . import mpi
    _, rank, size = mpi.world()
    return rank, size


def _weights_read(roots, updates):
    """The shared variables a function reads or updates, in graph order."""
    from theano import gof
    from theano.compile import SharedVariable
    from .gradients import stand_ins_in
    losses = [s.tag.multigpu_gradient.loss for s in stand_ins_in(roots)]
    found, seen = [], set()
    for variable in gof.graph.inputs(roots + losses) + [v for v, _ in updates]:
        if isinstance(variable, SharedVariable) and id(variable) not in seen:
            seen.add(id(variable))
            found.append(variable)
    return found


def _compile_batchwise(inputs, outputs, updates, kwargs, mesh, title, ranks=None, idle=False):
    """Keras's Function of the batch-wise rewrite for ``mesh`` (and MPI
    ``ranks``), its placement checked (and reported at its first call, if
    asked)."""
    from . import batchwise
    outputs, updates = batchwise.rewrite(inputs, outputs, updates, mesh, ranks, idle)
    compiled = stock['function'](inputs, outputs, updates=updates, **kwargs)
    if len(mesh.names) < len(mesh_module.current().names):
        title += ' (for batches of %d row(s): on %s)' % (len(mesh.names), ', '.join(mesh.names))
    return _checked(compiled, mesh, title)


def _checked(compiled, mesh, title):
    """``compiled`` (a Keras Function) with its placement checked, and
    reported at its first call if multigpu.report is set."""
    import theano
    from . import placement
    placement.check(compiled.function, mesh, theano.config.multigpu.check, title)
    if theano.config.multigpu.report:
        compiled = placement.FirstCallReport(compiled, mesh, title)
    return compiled


def _layerwise_function(inputs, outputs, updates, kwargs, mesh, title):
    """A Function compiled at its first call (the plan counts activations
    at that batch size), its placement checked (and reported, if asked)."""
    from . import layerwise

    def compile_for(batch_rows):
        new_outputs, new_updates = layerwise.rewrite(inputs, outputs, updates, mesh, batch_rows)
        compiled = stock['function'](inputs, new_outputs, updates=new_updates, **kwargs)
        return _checked(compiled, mesh, title)
    return layerwise.LayerwiseFunction(compile_for)


_KERAS_FUNCTIONS = {'_make_train_function': "Keras's train function",
                    '_make_test_function': "Keras's test function",
                    '_make_predict_function': "Keras's predict function"}


def _function_title(caller_frame):
    """Which function is compiled, from the name of K.function's caller."""
    return _KERAS_FUNCTIONS.get(caller_frame.f_code.co_name,
                                'K.function from %s' % caller_frame.f_code.co_name)


def _refuse_stateful(roots):
    """Batch-wise mode splits every batch over the contexts, so a stateful
    recurrent layer's state rows (one per sample of the batch) would have to
    be split too; that is not supported, so say so before compiling."""
    from theano import gof
    for variable in gof.graph.ancestors(roots):
        history = getattr(variable, '_keras_history', None)
        layer = history[0] if history else None
        if getattr(layer, 'stateful', False):
            raise ValueError(
                'batch-wise mode expects layers without state carried between '
                'batches, but received the stateful recurrent layer %r; its '
                'states hold one row per sample of the batch, which batch-wise '
                "mode does not split. Use stateful=False, or run on one context "
                "(THEANO_FLAGS multigpu.contexts=dev0)"
                % layer.name)


def _steer_to(inputs, context_name):
    """Host inputs go to the weights' context.  Without a target Theano
    moves them to its default context, and every weight would then be
    copied there on each call (DESIGN.md, trap 4)."""
    for placeholder in inputs:
        if not hasattr(placeholder.tag, 'target'):
            placeholder.tag.target = context_name


def _unique_updates(updates):
    """Keras's Function keeps the first update of each variable; so do we."""
    seen, unique = set(), []
    for variable, new_value in updates:
        if id(variable) not in seen:
            seen.add(id(variable))
            unique.append((variable, new_value))
    return unique


def gradients(loss, variables):
    """Gradients; in batch-wise and layer-wise mode and under MPI,
    stand-ins that ``function`` replaces by the gradients of the rewritten
    loss."""
    from . import launcher
    if mesh_module.current().mode in ('batch', 'layer') or launcher.launched_by_mpi():
        from .gradients import gradient_stand_ins
        return gradient_stand_ins(loss, variables)
    return stock['gradients'](loss, variables)


def get_value(x):
    return stock['get_value'](x)


def set_value(x, value):
    return stock['set_value'](x, value)


def eval(x):
    """The value of ``x``; in layer-wise mode read from the weights' copies
    on their contexts."""
    if mesh_module.current().mode == 'layer':
        from . import layerwise
        x = layerwise.host_graph(x)
    return stock['eval'](x)


def batch_get_value(xs):
    return [get_value(x) for x in xs]


def batch_set_value(tuples):
    for x, value in tuples:
        set_value(x, value)


def install(keras_backend):
    """Replace the taken-over entries of Keras's Theano backend."""
    theano_backend = sys.modules['keras.backend.theano_backend']
    own = sys.modules[__name__]
    for name in TAKEN_OVER:
        if not hasattr(theano_backend, name):
            continue   # e.g. batch_get_value, which Keras 1.0.1 lacks
        stock.setdefault(name, getattr(theano_backend, name))
        for module in (keras_backend, theano_backend):
            setattr(module, name, getattr(own, name))
