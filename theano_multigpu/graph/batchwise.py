"""Batch-wise (data parallel) rewriting of one function's graph.

Keras hands ``K.function`` the full-batch graph.  The rewrite finds the
*frontier*: the layer outputs nearest the function's outputs and updates,
i.e. the model's outputs and whatever layer outputs the loss, metrics or
state updates read (which tensors are layer outputs is the caller's
knowledge: the Keras adapter passes ``is_layer_output``).  Each context
computes the frontier on a contiguous slice of the batch, from copies of
the weights moved to it from the master; the slices are joined on the
master, where the loss, metrics and updates run on the whole batch as Keras
defines them.  Gradients (``K.gradients`` returns stand-ins in batch-wise
mode) are taken of the rewritten loss, so each replica's backward runs on
its context and the weight gradients are summed on the master (the mirror
of the copies).  The full-batch forward graph itself is never computed.

How the batch is shared and joined is a *gather*: ``LocalGather`` for the
contexts of one process; the MPI layer has one across ranks, which shares
the batch among the ranks first.
"""
from theano import gof, tensor
from theano.compile import SharedVariable
from theano.gpuarray.basic_ops import HostFromGpu, host_from_gpu
from theano.gpuarray.type import GpuArrayType
from theano.tensor.opt import Assert

from ..errors import ConfigurationError
from .blocks import split_updates
from .gradients import gradient_stand_ins, real_gradients, stand_ins_in
from .micro_batches import accumulated_gradients, accumulates, after, refuse_meeting_rows
from .placed import (check_no_placeholder, holders, is_placed, placed_replacements, read_on,
                     split_cut, value_holder)
from .replace import Rebuilder, replaced
from .rows import find_rows_meeting, slice_bounds
from .transfer import HOST, on_context
from .whole_batch import (WholeBatch, join_on_master, moved, purpose_of, rows_back, rows_first,
                          rows_of)

__all__ = ['LocalGather', 'find_frontier', 'rewrite', 'Split', 'names_in_order']

_SHARD_OFF = ', and set multigpu.shard=False to train meanwhile'


class LocalGather(object):
    """The contexts of one process share the whole batch, and their rows
    are joined on the master; gradients are those of the joined loss.

    A gather has three parts, used in this order by ``rewrite``:
    ``replica_bounds`` (each replica's rows), ``join`` (the replicas' rows
    of each frontier tensor, joined on the master: the batch the loss
    reads) and ``gradients`` (the stand-ins' gradients of that loss).
    """

    def replica_bounds(self, batch_size, replicas):
        return slice_bounds(batch_size, replicas)

    def join(self, joined_here, batch_size, replicated=True, one_per_rank=False):
        """The whole batch's rows of each tensor; ``replicated``: what reads
        them is computed alike everywhere (the loss), not per replica;
        ``one_per_rank``: the tensors hold one row for the process, not the
        batch's rows."""
        return joined_here

    def gradients(self, stand_ins, replace, wrt=None):
        """``wrt(param)``: what to take each gradient with respect to."""
        return real_gradients(stand_ins, replace, wrt)


def find_frontier(roots, is_layer_output):
    """The layer outputs nearest ``roots`` that depend on a shared variable."""
    frontier, seen = [], set()
    todo = list(roots)
    while todo:
        variable = todo.pop()
        if id(variable) in seen:
            continue
        seen.add(id(variable))
        if is_layer_output(variable) and variable.ndim >= 1 and _depends_on_shared(variable):
            frontier.append(variable)
            continue
        if variable.owner is not None:
            todo.extend(variable.owner.inputs)
    return frontier


def _depends_on_shared(variable):
    return any(isinstance(v, SharedVariable) for v in gof.graph.inputs([variable]))


def _state_reads(frontier, state_ids):
    """How ``frontier`` reads the shared variables of ``state_ids``: the
    variable itself, or its host view where it lives on a context."""
    reads = [v for v in gof.graph.inputs(frontier) if id(v) in state_ids]
    for node in gof.graph.io_toposort(gof.graph.inputs(frontier), frontier):
        if isinstance(node.op, HostFromGpu) and id(node.inputs[0]) in state_ids:
            reads.append(node.outputs[0])
    return reads


class WithoutBatchSize(object):
    """Ops that do not claim the batch's size, for one rewrite's replicas:
    a replica computes some of the rows.  Rule: an op's static shape hints
    leave the rows' count unknown, inside loops too.  The convolutions'
    ``imshp`` is such a hint, whose first entry Keras fills from a
    Deconvolution2D's ``output_shape`` and, in ConvLSTM2D's loop, from a
    fixed ``batch_input_shape``; Theano would otherwise fold the whole
    batch's count into the replica's shapes (a Flatten after it reshaping
    4 rows as 8).  Each op is looked at once for all the replicas."""

    def __init__(self):
        self._done = {}   # id(op): (op, kept alive so its id is not reused; its version)

    def __call__(self, op):
        """``op``, or a copy of it without the batch's size."""
        if id(op) not in self._done:
            self._done[id(op)] = (op, self._without(op))
        return self._done[id(op)][1]

    def _without(self, op):
        from theano.scan_module.scan_op import Scan
        from theano.tensor.nnet.abstract_conv import BaseAbstractConv
        if isinstance(op, BaseAbstractConv) and op.imshp is not None and op.imshp[0] is not None:
            import copy
            copied = copy.copy(op)
            copied.imshp = (None,) + tuple(op.imshp[1:])
            return copied
        # A loop of Keras's graph (Theano moves loops to GPUs later, with
        # types of their own).
        if isinstance(op, Scan) and not op.info.get('gpua'):
            inner = Rebuilder(rebuilt_op=self)(op.outputs)
            if any(a is not b for a, b in zip(inner, op.outputs)):
                return Scan(op.inputs, inner, dict(op.info))
        return op


def _replica(frontier, inputs, context, bounds, whole, batch_size, without_batch_size,
             earlier=()):
    """The Rebuilder of one replica (see ``_replica_reading``)."""
    return _replica_reading(frontier, inputs, context, bounds, whole, batch_size,
                            without_batch_size, earlier)[0]


def _replica_reading(frontier, inputs, context, bounds, whole, batch_size, without_batch_size,
                     earlier=()):
    """(the Rebuilder of one replica, what it reads for each weight:
    {id(key): (key, value)}): replacements that make ``frontier`` compute
    on ``context`` (HOST: on
    the host, as Theano places it): each batch input sliced and moved there,
    each weight's host view read from a copy moved there, and each tensor
    made for the whole batch (``whole``: [(variable, rows axis)], e.g. a
    random draw of the batch's shape, or a stateful layer's states) read as
    its rows of the one tensor one context would compute: a generator's
    state advances once.  ``without_batch_size``: the ops it applies
    (WithoutBatchSize); ``earlier``: variables computed before it reads its
    rows (the micro-batch before it)."""
    start, stop = bounds

    def place(x):
        return x if context == HOST else on_context(x, context)
    inputs = set(id(v) for v in inputs)
    replace, weights = {}, {}
    for variable in gof.graph.inputs(frontier):
        if id(variable) in inputs and variable.ndim >= 1:
            replace[variable] = place(after(variable[start:stop], earlier))
        elif is_placed(variable):   # copied from its owner, or gathered from its blocks
            replace[variable] = read_on(variable, context)
            weights[id(variable)] = (variable, replace[variable])
        elif isinstance(variable, SharedVariable) and not isinstance(variable.type,
                                                                     GpuArrayType):
            # A host weight, read as it is.
            weights[id(variable)] = (variable, variable)
    if context != HOST:
        for node in gof.graph.io_toposort(gof.graph.inputs(frontier), frontier):
            source = node.inputs[0] if isinstance(node.op, HostFromGpu) else None
            if isinstance(source, SharedVariable) and isinstance(source.type, GpuArrayType):
                replace[node.outputs[0]] = on_context(source, context)
                weights[id(node.outputs[0])] = (node.outputs[0], replace[node.outputs[0]])
    for variable, axis in whole:
        # What it reads of a sharded weight, read where the weight lives (a
        # replacement's own graph is not searched for keys).
        source = replaced([variable], placed_replacements(gof.graph.inputs([variable]),
                                                          context))[0]
        replace[variable] = place(after(rows_of(source, axis, bounds, batch_size), earlier))
        weights.pop(id(variable), None)   # (a stateful layer's states: rows, not a weight)
    return Rebuilder(replace, rebuilt_op=without_batch_size), weights


def rewrite(inputs, outputs, updates, mesh, is_layer_output, gather=None, describe=None,
            row_states=(), sync_batchnorm=True, micro_batches=1):
    """(outputs, updates, split) of the batch-wise function for ``mesh``;
    ``split`` (a Split) says which layers each replica computes and what
    runs on the master, for the placement report.

    ``inputs`` are the function's inputs; ``updates`` a list of pairs;
    ``is_layer_output(variable)`` tells the layer outputs; ``gather``
    shares and joins the rows (a LocalGather by default); ``describe(node)``
    names a node's layer and says whether rows may meet there per slice
    (see ``rows.find_rows_meeting``); ``row_states`` are shared variables
    holding a row per sample of the batch (a stateful layer's states): each
    replica reads its rows and computes their new value, joined like a
    layer output; ``sync_batchnorm``: batch normalisation uses the whole
    batch's statistics (else each replica's).  The mesh's contexts (or the
    host, if it has none) each compute their share; where the batch's rows
    meet, the master computes over the whole batch (``whole_batch``).
    ``micro_batches``: each context computes its share as that many
    micro-batches, one after the other (see ``micro_batches``).
    """
    gather = gather or LocalGather()
    contexts = [mesh.graph_name(name) for name in mesh.names] or [HOST]
    master = HOST if contexts == [HOST] else mesh.graph_name(mesh.master)
    outputs, updates = _by_block(outputs, updates, master)
    update_values = [new for _, new in updates]
    roots = list(outputs) + update_values
    stand_ins = stand_ins_in(roots)
    # The losses gradients are taken of: a function may return gradients alone.
    losses = [s.tag.multigpu_gradient.loss for s in stand_ins]
    state_ids = set(id(s) for s in row_states)
    new_states = set(id(new) for var, new in updates if id(var) in state_ids)
    frontier = find_frontier(roots + losses,
                             lambda v: is_layer_output(v) or id(v) in new_states)
    if not frontier:
        if stand_ins:
            raise RuntimeError('K.gradients was called on a graph with no Keras '
                               'layer output; batch-wise mode cannot split it')
        return _unsplit(outputs, updates, master, set(id(v) for v in inputs))

    input_ids = set(id(v) for v in inputs)
    batch_inputs = [v for v in gof.graph.inputs(frontier) if id(v) in input_ids and v.ndim >= 1]
    if not batch_inputs:
        return _unsplit(outputs, updates, master, input_ids)
    state_reads = _state_reads(frontier, state_ids)
    describe = describe or (lambda node: (None, False))
    found = find_rows_meeting(batch_inputs + state_reads, frontier, describe, sync_batchnorm)
    if micro_batches > 1:
        if not isinstance(gather, LocalGather) or contexts == [HOST]:
            raise ConfigurationError(
                'multigpu.accumulate=%d: micro-batches run on the contexts of one process for '
                'now, but this function %s; set multigpu.accumulate=auto or 1'
                % (micro_batches, 'has no contexts' if contexts == [HOST]
                   else 'is joined across MPI ranks'))
        refuse_meeting_rows(found, micro_batches, describe)
    # Each context computes ``micro_batches`` replicas, one after the other.
    places = [context for context in contexts for _ in range(micro_batches)]
    batch_size = batch_inputs[0].shape[0]
    # What a replica reads of a whole-batch value (its rows of a tensor
    # computed over the whole batch) is read once that value is built.
    after_whole = _downstream(frontier, [v for w in found.computed_whole
                                         for v in w.node.outputs])
    operands = found.whole + [(read, 0) for read in state_reads]
    sliced_first = [(v, axis) for v, axis in operands if id(v) not in after_whole]
    sliced_later = [(v, axis) for v, axis in operands if id(v) in after_whole]
    # Each replica's graph is built once, piece by piece, in graph order:
    # a synchronised batch normalisation or a whole-batch op reads every
    # replica's rows, and every later layer of every replica reads its
    # result.
    without_batch_size = WithoutBatchSize()
    bounds = gather.replica_bounds(batch_size, len(places))
    # A micro-batch reads its rows once the one before it on its context
    # computed the layer outputs that hold rows.
    with_rows = [v for v, axis in zip(frontier, found.frontier_rows) if axis is not None]
    replicas = []
    for number, (context, rows) in enumerate(zip(places, bounds)):
        earlier = replicas[-1](with_rows) if number % micro_batches else ()
        replicas.append(_replica(frontier, inputs, context, rows, sliced_first, batch_size,
                                 without_batch_size, earlier))

    def join(pieces, axis, replicated, purpose=None, per_rank=None):
        """The replicas' ``pieces`` (their rows on ``axis``) joined on the
        master; ``per_rank(rows)``, where given, makes one row of this
        process's rows (on axis 0), and the ranks' such rows are joined."""
        here = join_on_master(mesh, places, [rows_first(piece, axis) for piece in pieces],
                              purpose)
        if per_rank is not None:
            here = per_rank(here)
        whole, = gather.join([here], batch_size, replicated=replicated,
                             one_per_rank=per_rank is not None)
        # (Joined across the ranks on the host: computed with on the master.)
        return rows_back(moved(whole, HOST, master, purpose), axis)

    def whole_batch(replicated):
        return WholeBatch(_replica(frontier, (), master, (0, batch_size), sliced_first,
                                   batch_size, without_batch_size),
                          replicas, found, join, replicated)
    for_replicas = whole_batch(replicated=False)

    def send(variable, value, axis, purpose):
        """Each replica reads ``variable`` as ``value`` (computed on the
        master), or as its rows of it on ``axis``."""
        for context, rows, replica in zip(places, bounds, replicas):
            here = value if axis is None else rows_of(value, axis, rows, batch_size)
            replica.add(variable, moved(here, master, context, purpose))

    def layer_of(variable):
        return describe(variable.owner)[0] or str(variable.owner.op)
    later_ids = set(id(v) for v, _ in sliced_later)
    for kind, item in _in_graph_order(frontier, found.synced, found.computed_whole,
                                      sliced_later):
        if kind == 'synced':
            _synchronise_batchnorm(item, master, places, replicas, join)
        elif kind == 'whole':
            purpose = purpose_of(item.layer or str(item.node.op))
            total = _sum_of_partial_sums(item.node, found, replicas, join, purpose)
            if total is not None:
                for_replicas.add(item.node.outputs[0], total)
            values = for_replicas(item.node.outputs, purpose)
            for variable, value, axis in zip(item.node.outputs, values, item.rows):
                if id(variable) not in later_ids:
                    send(variable, value, axis, purpose)
        else:
            variable, axis = item
            purpose = purpose_of(layer_of(variable))
            send(variable, for_replicas([variable], purpose)[0], axis, purpose)

    rows_at = found.frontier_rows
    joined = [k for k, axis in enumerate(rows_at) if axis is not None]
    computed = _checked(frontier, found.checks, joined[0] if joined else 0)
    gathered, values = {}, []
    if joined:
        pieces = [[rows_first(replica([computed[k]])[0], rows_at[k]) for replica in replicas]
                  for k in joined]
        values = gather.join([join_on_master(mesh, places, p) for p in pieces], batch_size)
        gathered.update((frontier[k], rows_back(value, rows_at[k]))
                        for k, value in zip(joined, values))
    unjoined = [k for k, axis in enumerate(rows_at) if axis is None]
    if unjoined:   # layer outputs that hold no rows: computed over the whole batch
        for_the_loss = whole_batch(replicated=True)
        for k in unjoined:
            gathered[frontier[k]] = for_the_loss([computed[k]],
                                                 purpose_of(layer_of(frontier[k])))[0]
    # What reads a sharded weight outside the layers (a regulariser, the
    # update of a weight with one owner) reads it where it lives, or, split,
    # gathered on the master.
    gathered.update(placed_replacements(gof.graph.inputs(roots + losses), master))
    gathered.update(_on_master(roots + losses, input_ids, master))
    by_micro_batch = [s for s in stand_ins if accumulates(s)
                      and id(s.tag.multigpu_gradient.param) not in state_ids] \
        if micro_batches > 1 and values else []
    if by_micro_batch:
        def recompute(context, rows):
            def again(earlier):
                replica, weights = _replica_reading(frontier, inputs, context, rows,
                                                    sliced_first, batch_size,
                                                    without_batch_size, earlier)
                return ([rows_first(replica([computed[k]])[0], rows_at[k]) for k in joined],
                        weights)
            return again
        gathered.update(accumulated_gradients(
            by_micro_batch, dict(gathered), values,
            [(context, rows, recompute(context, rows)) for context, rows in zip(places, bounds)],
            value_holder, lambda value, context: moved(value, master, context)))
    # (A gradient of what is not a weight, an input's: through the first forward.)
    gathered.update(gather.gradients([s for s in stand_ins if s not in by_micro_batch],
                                     dict(gathered), value_holder))

    new_roots = replaced(roots, gathered)
    check_no_placeholder(new_roots, 'batch-wise rewrite', _SHARD_OFF)
    new_outputs = new_roots[:len(outputs)]
    new_updates = [(value_holder(var), new)
                   for (var, _), new in zip(updates, new_roots[len(outputs):])]
    split = Split(names_in_order(describe(node)[0] for node in _reading(batch_inputs + state_reads,
                                                                frontier)),
                  names_in_order(describe(node)[0] for node in found.synced),
                  [(w.layer, str(w.node.op), w.why) for w in found.computed_whole])
    return new_outputs, new_updates, split


def _on_master(roots, input_ids, master):
    """{input: its copy on the master} for the inputs of ``roots``, as what
    reads them outside the layers (the loss: targets, sample weights; an
    output or loss term that reads an input the layers read too) reads
    them: the replicas read their rows, moved from the host; a sparse input
    stays as it is.  Left on the host (batch-wise inputs are, see
    functions.py), an op reading inputs alone would run there, and Theano
    places the ops that read them by where their results go: with the
    weights sharded, the loss's gradient would run on a weight's owner."""
    if master == HOST:
        return {}
    return dict((v, on_context(v, master)) for v in gof.graph.inputs(roots)
                if id(v) in input_ids and isinstance(v.type, tensor.TensorType)
                and v.ndim >= 1)


def _unsplit(outputs, updates, master, input_ids):
    """(outputs, updates, split) of a function computed as it is, on the
    master: its inputs (``input_ids``) moved there, a sharded weight read
    where it lives (gathered on the master, split), written there."""
    roots = list(outputs) + [new for _, new in updates]
    on_master = placed_replacements(gof.graph.inputs(roots), master)
    on_master.update(_on_master(roots, input_ids, master))
    roots = replaced(roots, on_master)
    check_no_placeholder(roots, 'batch-wise rewrite', _SHARD_OFF)
    return (roots[:len(outputs)],
            [(value_holder(var), new) for (var, _), new in zip(updates, roots[len(outputs):])],
            Split([], []))


def _by_block(outputs, updates, master):
    """(outputs, updates) with the update of each variable split into
    blocks of rows (``placed.place_blocks``: a weight, its optimizer state)
    replaced by one update per block, computed from that block of the
    weight, its state and its gradient (``blocks.split_updates``) and
    written to the block where it lives: its ops run there, on a stand-in
    for the gradient of that block alone, which the gradients of the
    replicas' gathered copies are summed into on that context (the mirror
    of the gather: a reduce-scatter).  Whatever else reads a split weight's
    gradient (the update of a weight with one owner, under clipnorm; an
    output) reads it gathered on ``master``.

    An update that reads across a split variable's rows (a constraint
    with a dot or a sort along the first axis, of a weight split before
    this function knew its update) is computed whole on ``master``, from
    the gathered weight, state and gradient, and each block receives its
    rows: the same numbers, at the cost of a whole copy on the master
    during the step."""
    roots = list(outputs) + [new for _, new in updates]
    stand_ins = stand_ins_in(roots)
    # (A function may read a split weight only through its gradient.)
    cut = split_cut(gof.graph.inputs(roots) + [v for v, _ in updates]
                    + [s.tag.multigpu_gradient.param for s in stand_ins], stand_ins)
    if not cut:
        return outputs, updates
    block_stand_ins = dict(
        (s, [gradient_stand_ins(s.tag.multigpu_gradient.loss, [holder])[0]
             for holder in holders(s.tag.multigpu_gradient.param)])
        for s in stand_ins if s in cut)

    def block_leaf(leaf, k):
        if leaf in block_stand_ins:
            return block_stand_ins[leaf][k]
        return host_from_gpu(leaf.blocks[k].variable)
    by_block, refused = split_updates(updates, cut, block_leaf)
    gathered = dict((s, tensor.concatenate([on_context(b, master) for b in blocks], axis=0))
                    for s, blocks in block_stand_ins.items())
    kept = [(v, new) for v, new in updates if v not in cut or v in refused]
    rest = replaced(list(outputs) + [new for _, new in kept], gathered)
    rest_updates = []
    for (variable, _), new in zip(kept, rest[len(outputs):]):
        if variable in refused:
            rest_updates += [(block.variable, on_context(new[block.start:block.stop],
                                                         block.variable.type.context_name,
                                                         came_from=master))
                             for block in variable.blocks]
        else:
            rest_updates.append((variable, new))
    return (rest[:len(outputs)], rest_updates
            + [(variable.blocks[k].variable, new) for variable, k, new in by_block])


def _reading(inputs, outputs):
    """The nodes between ``inputs`` and ``outputs`` that read the inputs,
    in graph order."""
    reached = set(id(v) for v in inputs)
    nodes = []
    for node in gof.graph.io_toposort(gof.graph.inputs(outputs), outputs):
        if any(id(v) in reached for v in node.inputs):
            nodes.append(node)
            reached.update(id(v) for v in node.outputs)
    return nodes


class Split(object):
    """What a batch-wise function computes where: ``layers``, the layers
    each replica computes on its rows; ``synchronised``, the layers whose
    statistics the master computes from the whole batch; ``whole``,
    [(layer or None, op, why)]: the ops computed over the whole batch on
    the master, where the batch's rows meet."""

    def __init__(self, layers, synchronised, whole=()):
        self.layers, self.synchronised, self.whole = layers, synchronised, list(whole)


def names_in_order(names):
    """The names, each once, in order, without None."""
    found = []
    for name in names:
        if name is not None and name not in found:
            found.append(name)
    return found


def _checked(frontier, checks, at):
    """``frontier``, its tensor ``at`` asserting the shape conditions the
    split is exact under (each replica asserts them on its rows)."""
    checked = list(frontier)
    for condition, message in checks:
        checked[at] = Assert(message)(checked[at], condition)
    return checked


def _downstream(outputs, sources):
    """The ids of ``sources`` and of what reads them, up to ``outputs``."""
    if not sources:
        return set()
    return set(id(v) for v in sources).union(
        id(v) for node in _reading(sources, outputs) for v in node.outputs)


def _in_graph_order(outputs, synced, computed_whole, sliced_later):
    """[(kind, item)] of the synchronised batch normalisations ('synced'),
    the whole-batch nodes ('whole') and the replicas' rows of whole-batch
    values ('sliced', after the node that makes the value), in the order
    the graph up to ``outputs`` computes them."""
    if not (synced or computed_whole):
        return []
    order = dict((id(node), k) for k, node in enumerate(
        gof.graph.io_toposort(gof.graph.inputs(outputs), outputs)))
    events = ([(order[id(node)], 0, 'synced', node) for node in synced]
              + [(order[id(w.node)], 0, 'whole', w) for w in computed_whole]
              + [(order[id(v.owner)], 1, 'sliced', (v, axis)) for v, axis in sliced_later])
    return [(kind, item) for _, _, kind, item in sorted(events, key=lambda e: e[:2])]


def _sum_of_partial_sums(node, found, replicas, join, purpose):
    """A sum over the batch's rows (``node``) as one device computes it,
    from the sums of each replica's rows, summed in each process: one row
    per process moved across the ranks, one per replica to the master,
    rather than the rows; None for another op."""
    if not isinstance(node.op, tensor.elemwise.Sum):
        return None
    x, = node.inputs
    rows = found.facts_of(x).rows
    # (A sum of a tensor made for the whole batch, or along other axes,
    # has no replicas' sums to add.)
    if rows is None or rows not in (range(x.ndim) if node.op.axis is None else node.op.axis):
        return None

    def partial(rows_at, value):
        """``value`` summed along ``rows_at``, which it keeps (as one row,
        not broadcastable: the joins' gradients are not)."""
        total = tensor.elemwise.Sum(axis=[rows_at], dtype=node.op.dtype,
                                    acc_dtype=node.op.acc_dtype)(value)
        return tensor.unbroadcast(tensor.shape_padaxis(total, rows_at), rows_at)
    pieces = [partial(rows, replica([x])[0]) for replica in replicas]
    return node.op(join(pieces, rows, False, purpose, per_rank=lambda here: partial(0, here)))


def _synchronise_batchnorm(node, master, contexts, replicas, join):
    """Make each replica (a Rebuilder) normalise with the whole batch's
    statistics: the replicas' inputs of batch normalisation ``node`` are
    joined, its mean and 1/std computed from them on the master, sent to
    every replica, and each replica normalises its rows with them (and its
    gradient flows back the same way)."""
    x, scale, bias = node.inputs[:3]
    pieces = [replica([x])[0] for replica in replicas]
    x_whole = join(pieces, 0, False)
    # As Theano's batch_normalization_train computes them (its op has no
    # gradient for its statistics alone).
    axes, epsilon = node.op.axes, node.inputs[3]
    mean = x_whole.mean(axes, keepdims=True)
    invstd = tensor.inv(tensor.sqrt(x_whole.var(axes, keepdims=True) + epsilon))
    for context, replica, piece in zip(contexts, replicas, pieces):
        scale_here, bias_here = replica([scale, bias])
        replica.add(node.outputs[0], (piece - moved(mean, master, context))
                    * (scale_here * moved(invstd, master, context)) + bias_here)
