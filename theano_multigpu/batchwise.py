"""Batch-wise (data parallel) rewriting of one Keras function's graph.

Keras hands ``K.function`` the full-batch graph.  The rewrite finds the
*frontier*: the Keras tensors (layer outputs, ``_keras_history``) nearest the
function's outputs and updates, i.e. the model's outputs and whatever layer
outputs the loss, metrics or state updates read.  Each context computes the
frontier on a contiguous slice of the batch, from copies of the weights
moved to it from the master; the slices are gathered on the master, where
the loss, metrics and updates run on the whole batch as Keras defines them.
Gradients (``K.gradients`` returns stand-ins in batch-wise mode) are taken
of the rewritten loss, so each replica's backward runs on its context and
the weight gradients are summed on the master (the mirror of the copies).
The full-batch forward graph itself is never computed.
"""
import theano
from theano import gof, tensor
from theano.compile import SharedVariable
from theano.gpuarray.basic_ops import HostFromGpu
from theano.gpuarray.type import GpuArrayType
from theano.sandbox.rng_mrg import mrg_uniform

from .gradients import real_gradients, stand_ins_in
from .transfer import on_context

__all__ = ['rewrite', 'slice_bounds', 'SplitFunction', 'HOST']

# The replica of a mesh without contexts (under MPI on the CPU): no copies.
HOST = '<host replica>'


def slice_bounds(batch_size, n_replicas):
    """Symbolic (start, stop) of each replica's rows: contiguous, differing
    by at most one row; empty when the batch has fewer rows than replicas."""
    return [((i * batch_size) // n_replicas, ((i + 1) * batch_size) // n_replicas)
            for i in range(n_replicas)]


def _is_keras_tensor(variable):
    return hasattr(variable, '_keras_history') and variable.ndim >= 1


def find_frontier(roots):
    """Keras tensors nearest ``roots`` that depend on a shared variable."""
    frontier, seen = [], set()
    todo = list(roots)
    while todo:
        variable = todo.pop()
        if id(variable) in seen:
            continue
        seen.add(id(variable))
        if _is_keras_tensor(variable) and _depends_on_shared(variable):
            frontier.append(variable)
            continue
        if variable.owner is not None:
            todo.extend(variable.owner.inputs)
    return frontier


def _depends_on_shared(variable):
    return any(isinstance(v, SharedVariable) for v in gof.graph.inputs([variable]))


def _replica_replacements(frontier, inputs, context, bounds):
    """Replacements that make ``frontier`` compute on ``context`` (HOST: on
    the host, as Theano places it): each batch input sliced and moved there,
    each weight's host view read from a copy moved there."""
    start, stop = bounds

    def place(x):
        return x if context is HOST else on_context(x, context)
    inputs = set(id(v) for v in inputs)
    replace = {}
    for variable in gof.graph.inputs(frontier):
        if id(variable) in inputs and variable.ndim >= 1:
            replace[variable] = place(variable[start:stop])
    for node in gof.graph.io_toposort(gof.graph.inputs(frontier), frontier):
        if isinstance(node.op, HostFromGpu) and context is not HOST:
            source = node.inputs[0]
            if isinstance(source, SharedVariable) and isinstance(source.type, GpuArrayType):
                replace[node.outputs[0]] = on_context(source, context)
        elif isinstance(node.op, mrg_uniform) and node.outputs[1].ndim >= 2:
            # Random numbers drawn for the whole batch (Keras draws them with
            # the shape of the batch), sliced: dropout masks are one
            # context's, and the generator's state advances once per call.
            replace[node.outputs[1]] = place(node.outputs[1][start:stop])
    return replace


def _local_bounds(batch_size, n_replicas, ranks, idle):
    """(start, stop) of each local replica's rows: of the whole batch, or,
    with ``ranks`` = (rank, size), of this rank's share of it.  An ``idle``
    rank (no rows) computes on the first row, and contributes none."""
    if ranks is None:
        return slice_bounds(batch_size, n_replicas)
    if idle:
        return [(0, 1)]
    from .mpi import rank_bounds
    start, stop = rank_bounds(batch_size, *ranks)
    return [(start + a, start + b) for a, b in slice_bounds(stop - start, n_replicas)]


def rewrite(inputs, outputs, updates, mesh, ranks=None, idle=False):
    """(outputs, updates) of the batch-wise function for ``mesh``.

    ``inputs`` are the function's inputs; ``updates`` a list of pairs.
    With ``ranks`` = (rank, size) the batch is first shared among MPI
    ranks, and the mesh's contexts (or the host, if it has none) split
    this rank's share; ``idle``: this rank's share is empty (a batch with
    fewer rows than ranks).  Kernels refuse empty operands, so an idle rank
    computes one row and sends none.
    """
    update_values = [new for _, new in updates]
    roots = list(outputs) + update_values
    frontier = find_frontier(roots)
    stand_ins = stand_ins_in(roots)
    if not frontier:
        if stand_ins:
            raise RuntimeError('K.gradients was called on a graph with no Keras '
                               'layer output; batch-wise mode cannot split it')
        return list(outputs), list(updates)

    input_ids = set(id(v) for v in inputs)
    batch_inputs = [v for v in gof.graph.inputs(frontier) if id(v) in input_ids and v.ndim >= 1]
    if not batch_inputs:
        return list(outputs), list(updates)
    batch_size = batch_inputs[0].shape[0]
    contexts = [mesh.graph_name(name) for name in mesh.names] or [HOST]
    per_replica = []
    for context, bounds in zip(contexts, _local_bounds(batch_size, len(contexts), ranks, idle)):
        replace = _replica_replacements(frontier, inputs, context, bounds)
        per_replica.append(theano.clone(frontier, replace=replace, strict=False))
    local = [_gather_on_master(mesh, contexts, [replica[k] for replica in per_replica])
             for k in range(len(frontier))]
    if idle:
        local = [rows[:0] for rows in local]
    if ranks is None:
        gathered = dict(zip(frontier, local))
        gathered.update(real_gradients(stand_ins, gathered))
    else:
        from . import mpi
        rows = [stop - start for start, stop in
                (mpi.rank_bounds(batch_size, r, ranks[1]) for r in range(ranks[1]))]
        whole = mpi.all_gather_rows(local, rows)
        gathered = dict(zip(frontier, whole))
        gathered.update(mpi.data_parallel_gradients(stand_ins, dict(gathered)))

    new_roots = theano.clone(roots, replace=gathered, strict=False)
    new_outputs = new_roots[:len(outputs)]
    new_updates = [(var, new) for (var, _), new in zip(updates, new_roots[len(outputs):])]
    return new_outputs, new_updates


def _gather_on_master(mesh, contexts, pieces):
    """The replicas' rows of one frontier tensor, joined on the master."""
    if contexts == [HOST]:
        return pieces[0]
    master = mesh.graph_name(mesh.master)
    return tensor.concatenate([on_context(piece, master, came_from=name)
                               for name, piece in zip(contexts, pieces)], axis=0)


class SplitFunction(object):
    """A Keras backend Function over all contexts, and over fewer for a
    batch with fewer rows than contexts (compiled when first needed), so
    that no context computes on an empty slice: BLAS libraries refuse
    zero-row products (CLBlast does) and there is nothing to gain.  Under
    MPI (``ranks`` = (rank, size)) the rows counted are this rank's share.

    ``compile_for(mesh, idle=False)`` returns the Keras Function for
    ``mesh`` (``idle``: for an MPI rank whose share of the batch is empty).
    """

    def __init__(self, compile_for, mesh, ranks=None):
        self._compile_for = compile_for
        self._mesh = mesh
        self._ranks = ranks
        self._by_count = {mesh.size: compile_for(mesh)}

    def __call__(self, inputs):
        rows = next((len(x) for x in inputs if getattr(x, 'ndim', 0) >= 1), self._mesh.size)
        if self._ranks is not None:
            from .mpi import rank_bounds
            start, stop = rank_bounds(rows, *self._ranks)
            rows = stop - start
        count = min(rows, self._mesh.size) if self._ranks else max(1, min(rows, self._mesh.size))
        if count not in self._by_count:
            # count 0: an idle MPI rank (see rewrite)
            self._by_count[count] = self._compile_for(self._mesh.first(max(count, 1)),
                                                      idle=count == 0)
        return self._by_count[count](inputs)

    def __getattr__(self, name):
        """``function`` and the rest: the all-contexts Function's."""
        return getattr(self._by_count[self._mesh.size], name)
