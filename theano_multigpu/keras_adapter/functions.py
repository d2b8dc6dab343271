"""Compiling one ``K.function`` in each mode: on one context, batch-wise
over the contexts (and under MPI over the ranks), or layer-wise, its
placement checked (and reported at its first call, if asked).

``keras_function`` is Keras's own ``K.function``, which the adapter passes
in; the rewrites get what Keras's graphs say from ``keras_graph``.  The
graph layer is imported only where a mode needs it: it imports Theano's
gpuarray backend, and a plain run without pygpu must not.
"""
from ..config import mesh as mesh_module
from ..config.mpi_environment import launched_by_mpi
from ..errors import ConfigurationError
from . import calls, progress

__all__ = ['compile_function', 'mpi_ranks', 'function_title']


def compile_function(keras_function, inputs, outputs, updates, kwargs, title):
    """One Theano function; in batch-wise and layer-wise mode, spread over
    the contexts, and under MPI over the ranks too."""
    mesh = mesh_module.current()
    ranks = mpi_ranks(mesh)
    kwargs = _measuring(kwargs, mesh)
    updates = list(updates)   # (a script may pass an iterator, read more than once here)
    accumulate = _accumulate(ranks)
    if mesh.mode == 'layer':
        if accumulate not in ('auto', 1):
            raise ConfigurationError(
                'multigpu.accumulate=%d: micro-batches are batch-wise mode\'s, but '
                'multigpu.mode is layer; set multigpu.mode=batch, or multigpu.accumulate=auto'
                % accumulate)
        updates = _unique_updates(updates)
        if ranks is not None:
            _refuse_states_across_ranks(list(outputs) + [new for _, new in updates], title)
        mpi = None if ranks is None else (ranks, _agreed(outputs, updates, title))
        layerwise = _layerwise_function(keras_function, list(inputs), list(outputs), updates,
                                        kwargs, mesh, title, mpi)
        return layerwise if ranks is None else calls.FirstStepsWithoutLimit(layerwise)
    if mesh.mode != 'batch' and ranks is None:
        if mesh.graph_name(mesh.master) is not None:
            _steer_to(inputs, mesh.graph_name(mesh.master))
        with progress.compiling(title, len(mesh.names)) as compile_progress:
            return _keras_compiled(keras_function, inputs, outputs, updates, kwargs,
                                   compile_progress)
    from ..graph import batchwise
    updates = _unique_updates(updates)
    roots = list(outputs) + [new for _, new in updates]
    if mesh.sharded:
        from ..graph import sharding
        from ..graph.gradients import stand_ins_in
        from . import keras_graph
        stand_ins = stand_ins_in(roots)
        losses = [s.tag.multigpu_gradient.loss for s in stand_ins]
        sharding.place_shards(_weights_read(roots, updates), updates, stand_ins, mesh,
                              keras_graph.trainable_weights(roots + losses))
    mpi = None
    if ranks is not None:
        mpi = (ranks, _agreed(outputs, updates, title))
        if mesh.graph_name(mesh.master) is not None:
            _steer_to(inputs, mesh.graph_name(mesh.master))
    else:
        # Each context's rows go from the host to it: Theano would move the
        # whole batch to its default context, and each slice from there.
        from ..graph.transfer import HOST
        _steer_to(inputs, HOST)

    def compile_for(mesh, idle=False, micro_batches=1):
        return _compile_batchwise(keras_function, list(inputs), list(outputs), updates,
                                  kwargs, mesh, title, mpi, idle, micro_batches)
    split = calls.SplitFunction(compile_for, mesh, ranks, accumulate)
    if ranks is None:
        return split
    # Ranks compile for different times (caches of their own): all of them
    # agreed to compile it, so wait for them without a limit.
    from ..mpi import world
    world.wait_for_every_rank(title, float('inf'))
    return calls.FirstStepsWithoutLimit(split)


def _accumulate(ranks):
    """multigpu.accumulate: 'auto' or a number of micro-batches; under MPI
    (``ranks``) auto is 1 (each rank would plan its own share)."""
    import theano
    from ..config.flags import parse_accumulate
    setting = parse_accumulate(theano.config.multigpu.accumulate)
    return 1 if setting == 'auto' and ranks is not None else setting


def _measuring(kwargs, mesh):
    """``kwargs`` of a Keras function, with multigpu.measure_peak the mode
    that measures its peak per context (unless the script chose a mode)."""
    import theano
    if not theano.config.multigpu.measure_peak or 'mode' in kwargs:
        return kwargs
    from ..graph import peak
    return dict(kwargs, mode=peak.measuring_mode(mesh.names_by_graph_name()))


def mpi_ranks(mesh):
    """(rank, size) when this process is one of several MPI ranks, else
    None."""
    if not launched_by_mpi():
        return None
    from ..mpi.world import world
    _, rank, size = world()
    return rank, size


def _refuse_states_across_ranks(roots, title):
    """Layer-wise under MPI splits the batch over the ranks but not yet a
    stateful layer's states (each rank's rows of them): stop before
    compiling rather than carry the wrong rows."""
    from . import keras_graph
    states = keras_graph.row_states(roots)
    if states:
        raise ConfigurationError(
            'layer-wise mode under MPI splits each batch over the ranks, but %s reads the '
            'states of a stateful recurrent layer (%s), which it cannot split yet; use '
            'multigpu.mode=batch under MPI, or layer-wise in one process'
            % (title, ', '.join(sorted(set(s.name or 'unnamed' for s in states)))))


def _agreed(outputs, updates, title):
    """The function's number among those the ranks agreed on, once every
    rank holds rank 0's weights (see ``agreement.agree_and_broadcast``)."""
    from ..mpi import agreement
    roots = list(outputs) + [new for _, new in updates]
    return agreement.agree_and_broadcast(_weights_read(roots, updates), title)


def _weights_read(roots, updates):
    """The shared variables a function reads or updates, in graph order."""
    from theano import gof
    from theano.compile import SharedVariable
    from ..graph.gradients import stand_ins_in
    losses = [s.tag.multigpu_gradient.loss for s in stand_ins_in(roots)]
    found, seen = [], set()
    for variable in gof.graph.inputs(roots + losses) + [v for v, _ in updates]:
        if isinstance(variable, SharedVariable) and id(variable) not in seen:
            seen.add(id(variable))
            found.append(variable)
    return found


def _gather(mpi, idle, inputs, title):
    """The batch-wise gather: across MPI ranks (``mpi``: ((rank, size), the
    function's number), checking each step that every rank was handed the
    same ``inputs``, unless multigpu.mpi_check_inputs is off), or the local
    one."""
    import theano
    from ..graph import batchwise
    if mpi is None:
        return batchwise.LocalGather()
    from ..mpi.data_parallel import RankGather
    (rank, size), serial = mpi
    checked = inputs if theano.config.multigpu.mpi_check_inputs else ()
    return RankGather(rank, size, idle, title, serial, checked)


def _compile_batchwise(keras_function, inputs, outputs, updates, kwargs, mesh, title,
                       mpi=None, idle=False, micro_batches=1):
    """Keras's Function of the batch-wise rewrite for ``mesh`` (and under
    MPI, ``mpi``: ((rank, size), the function's number)), each context's
    rows computed as ``micro_batches``, its placement checked (and reported
    at its first call, if asked)."""
    from ..graph import batchwise
    from ..graph.gradients import stand_ins_in
    from . import keras_graph
    import theano
    shown = title   # (the ranks' gathers are named by the function's own title)
    if len(mesh.names) < len(mesh_module.current().names):
        shown += ' (for batches of %d row(s): on %s)' % (len(mesh.names), ', '.join(mesh.names))
    if micro_batches > 1:
        shown += ' (in %d micro-batches per context)' % micro_batches
    with progress.compiling(shown, len(mesh.names)) as compile_progress:
        compile_progress.rewriting()
        roots = list(outputs) + [new for _, new in updates]
        describe = keras_graph.node_describer(
            roots + [s.tag.multigpu_gradient.loss for s in stand_ins_in(roots)])
        outputs, updates, split = batchwise.rewrite(
            inputs, outputs, updates, mesh, keras_graph.is_layer_output,
            _gather(mpi, idle, inputs, title),
            describe, keras_graph.row_states(roots), theano.config.multigpu.batchnorm == 'sync',
            micro_batches)
        compiled = _keras_compiled(keras_function, inputs, outputs, updates, kwargs,
                                   compile_progress)
    return _checked(compiled, mesh, shown, split)


def _keras_compiled(keras_function, inputs, outputs, updates, kwargs, compile_progress):
    """Keras's Function of the graph, Theano's optimiser and linker told to
    ``compile_progress`` (and how to count the nodes it is handed, counted
    only if a line shows them)."""
    def count_nodes():
        from theano import gof
        roots = list(outputs) + [new for _, new in updates]
        return len(gof.graph.io_toposort(gof.graph.inputs(roots), roots))
    compile_progress.optimising(count_nodes)
    return keras_function(inputs, outputs, updates=updates, **kwargs)


def _checked(compiled, mesh, title, split=None):
    """``compiled`` (a Keras Function) with its placement checked, and
    reported at its first call if multigpu.report is set (``split``: what
    a batch-wise function computes where; layer-wise, the Plan of its
    layers)."""
    import theano
    from ..graph import placement, report
    placement.check(compiled.function, mesh, theano.config.multigpu.check, title)
    if not launched_by_mpi():   # (ranks would disagree on a plan of their own shares)
        compiled = calls.PeakChecked(compiled, mesh, title)
    if theano.config.multigpu.report:
        compiled = calls.FirstCallReport(compiled, mesh, title, split=split)
    return compiled


def _layerwise_function(keras_function, inputs, outputs, updates, kwargs, mesh, title,
                        mpi=None):
    """A Function compiled at its first call (the plan counts activations
    at that batch size), its placement checked (and reported, if asked).
    Under MPI (``mpi``: ((rank, size), the function's number)) each rank
    computes its share of the batch layer-wise and the ranks join their
    rows as in batch-wise mode (``_across_ranks``)."""
    from ..graph import layerwise
    from . import keras_graph

    def compile_for(batch_rows, idle=False):
        with progress.compiling(title, len(mesh.names)) as compile_progress:
            compile_progress.rewriting()
            placed_outputs = None if mpi is None else set()
            new_outputs, new_updates, plan = layerwise.rewrite(
                inputs, outputs, updates, mesh, batch_rows, keras_graph.layer_calls,
                placed_outputs)
            if mpi is not None:
                new_outputs, new_updates = _across_ranks(inputs, new_outputs, new_updates,
                                                         placed_outputs, mpi, idle, title)
            compiled = _keras_compiled(keras_function, inputs, new_outputs, new_updates, kwargs,
                                       compile_progress)
        return _checked(compiled, mesh, title, plan)
    return calls.LayerwiseFunction(compile_for, None if mpi is None else mpi[0])


def _across_ranks(inputs, outputs, updates, placed_outputs, mpi, idle, title):
    """(outputs, updates) of a layer-wise graph (its gradients stand-ins,
    its layer outputs' ids ``placed_outputs``) computed by each rank on its
    share of the batch: the batch-wise rewrite across the ranks, with the
    rank's layer-wise graph as its one replica."""
    import theano
    from ..graph import batchwise
    outputs, updates, _ = batchwise.rewrite(
        inputs, outputs, updates, mesh_module.Mesh([], {}, None, 'batch'),
        lambda v: id(v) in placed_outputs,
        _gather(mpi, idle, inputs, title), None, (),
        theano.config.multigpu.batchnorm == 'sync')
    return outputs, updates


_KERAS_FUNCTIONS = {'_make_train_function': "Keras's train function",
                    '_make_test_function': "Keras's test function",
                    '_make_predict_function': "Keras's predict function"}


def function_title(caller_frame):
    """Which function is compiled, from the name of K.function's caller."""
    return _KERAS_FUNCTIONS.get(caller_frame.f_code.co_name,
                                'K.function from %s' % caller_frame.f_code.co_name)


def _steer_to(inputs, context_name):
    """Host inputs go to the weights' context.  ``K.placeholder`` sets no
    target, and Theano then moves host inputs to its default context: every
    weight would be copied there on each call."""
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
