"""Micro-batches: a batch-wise step computed as K slices of rows per
context, one after another, whose gradients are summed into one update
(multigpu.accumulate).

Rule: the numbers are one step's at the whole batch, and a context holds
the activations of one micro-batch at a time.  The loss, metrics and
updates read the layer outputs joined over the whole batch, as without
micro-batches; what changes is the order, and the backward computes the
layers again:

1. forward: each context computes its micro-batches' layer outputs one
   after the other (``after``: a micro-batch reads its rows once the one
   before it is computed), each micro-batch's activations freed before the
   next one's exist;
2. the loss's gradient with respect to the joined layer outputs, on the
   master: the whole batch's;
3. backward: each micro-batch computes its layers again from its rows and
   takes its rows of that gradient back through them, one after the other;
   a context sums its micro-batches' gradients of its copy of each weight
   and sends the sum back once (the same traffic as one micro-batch).

The forward runs twice.  Where the rows of two micro-batches meet inside
the layers (synchronised batch normalisation, an op over the whole batch),
no order of micro-batches gives one step's numbers: ``refuse_meeting_rows``
stops before compiling.
"""
from collections import OrderedDict

import theano
from theano import gof
from theano.compile import SharedVariable
from theano.gpuarray.basic_ops import HostFromGpu, as_gpuarray_variable, host_from_gpu

from ..compat.optimizers import register_optimizer
from ..errors import ConfigurationError
from .gradients import by_loss, host_gradient, theano_grad
from .placed import holders, is_placed
from .replace import replaced

__all__ = ['After', 'after', 'refuse_meeting_rows', 'accumulates', 'accumulated_gradients',
           'estimated_micro_batches', 'MOST_MICRO_BATCHES']

# The most micro-batches per context multigpu.accumulate=auto chooses: each
# is a copy of the model in the compiled graph (twice: forward, and forward
# again with the backward), and compiling grows with them.
MOST_MICRO_BATCHES = 32


class After(gof.Op):
    """``After()(x, *earlier)`` is ``x`` itself (a view of it), computed
    only once ``earlier`` are: an order the VM keeps, nothing more.  No
    gradient reaches ``earlier``."""
    __props__ = ()
    view_map = {0: [0]}

    def make_node(self, x, *earlier):
        return gof.Apply(self, [x] + list(earlier), [x.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = inputs[0]

    def infer_shape(self, node, shapes):
        return [shapes[0]]

    def connection_pattern(self, node):
        return [[True]] + [[False]] * (len(node.inputs) - 1)

    def grad(self, inputs, output_grads):
        return [output_grads[0]] + [theano.gradient.DisconnectedType()() for _ in inputs[1:]]


def after(x, earlier):
    """``x``, read once ``earlier`` (variables) are computed; ``x`` itself
    when there are none."""
    return After()(x, *earlier) if earlier else x


@gof.local_optimizer([After])
def local_after_on_gpu(node):
    """After(HostFromGpu(g), HostFromGpu(e), ...) -> HostFromGpu(After(g, e,
    ...)): the order needs no copy to the host, of the value or of what it
    waits for."""
    if not isinstance(node.op, After):
        return False
    if not any(v.owner is not None and isinstance(v.owner.op, HostFromGpu)
               for v in node.inputs):
        return False
    on_gpu = [v.owner.inputs[0] if v.owner is not None and isinstance(v.owner.op, HostFromGpu)
              else v for v in node.inputs]
    x = node.inputs[0]
    if x.owner is not None and isinstance(x.owner.op, HostFromGpu):
        return [host_from_gpu(After()(*on_gpu))]
    return [After()(x, *on_gpu[1:])]


# After the GPU lifting (which makes the HostFromGpu), before ToContext
# reads device to device (to_context_from_host_view, at -0.2).
register_optimizer('after_on_gpu', local_after_on_gpu, 'merge2', -0.3)


def refuse_meeting_rows(found, micro_batches, describe):
    """Stop when the rows of micro-batches meet inside the layers (``found``:
    the row analysis, ``rows.RowsFound``; ``describe(node)``: its layer's
    name first): each micro-batch would need the others' rows before it
    ends."""
    why = (['%s (BatchNormalization with the whole batch\'s statistics)'
            % (describe(node)[0] or node.op) for node in found.synced]
           + ['%s (%s: %s)' % (w.layer or 'outside the layers', w.node.op, w.why)
              for w in found.computed_whole])
    if why:
        raise ConfigurationError(
            'multigpu.accumulate: each batch would be computed as %d micro-batches per context, '
            'one after the other, but the rows of the whole batch meet inside the layers at %s: '
            'no micro-batch can finish before the others, so the numbers would not be one '
            "step's.  Choose multigpu.batchnorm=local (each micro-batch normalises its own "
            'rows), a smaller batch, or multigpu.accumulate=1.'
            % (micro_batches, '; '.join(why)))


def estimated_micro_batches(at_one, at_two):
    """The fewest micro-batches per context whose peaks fit, estimated from
    the planned peaks at one and at two (``peak_plan.peaks_and_room``'s
    [(context names, peak, room)] of each): a peak taken as a part that
    does not shrink (weights, their state, copies and gradients) and one
    that divides by the micro-batches (the activations).  None where the
    part that does not shrink alone takes the room."""
    fewest = 1
    for (_, one, room), (_, two, _) in zip(at_one, at_two):
        if one <= room:
            continue
        shrinking = 2 * (one - two)
        fixed = one - shrinking
        if shrinking <= 0 or fixed >= room:
            return None
        fewest = max(fewest, -(-shrinking // (room - fixed)))
    return int(fewest)


def _needed(key, wanted):
    """Whether the gradient of what a replica reads for ``key`` (a placed
    variable, the host view of a GPU shared variable, or a host shared
    variable read as itself) reaches one of ``wanted`` (ids of the
    variables gradients are taken of)."""
    if is_placed(key):
        held = holders(key)
    elif key.owner is not None and isinstance(key.owner.op, HostFromGpu):
        held = [key.owner.inputs[0]]
    else:
        held = [key]
    return any(id(h) in wanted for h in held)


def _apart(total, context):
    """``total``, a sum of gradients on ``context`` (a graph name), that
    Theano must not merge into one sum with what is added to it: each
    gradient is freed once added, not held until all are.  The sum stays a
    GPU array there (a host op between would leave the addition to Theano's
    default context)."""
    return host_from_gpu(After()(as_gpuarray_variable(total, context)))


def accumulates(stand_in):
    """Whether the gradient ``stand_in`` stands for is taken micro-batch
    by micro-batch: one of a weight's (a gradient of an input, a saliency
    map's, is taken through the first forward, whole)."""
    param = stand_in.tag.multigpu_gradient.param
    return isinstance(param, SharedVariable)


def accumulated_gradients(stand_ins, replace, joined, micro_batches, wrt, move):
    """{stand-in: host-typed gradient of its loss}, the backward taken
    micro-batch by micro-batch (see the module docstring).

    ``replace``: the rewrite's replacements (the loss reads the joined
    layer outputs through them); ``joined``: the rows-first joined tensors
    the loss reads, on the master; ``micro_batches``: [(context, (start,
    stop), recompute)] in row order, ``recompute(earlier)`` -> (the micro-
    batch's rows-first pieces of ``joined`` computed again once ``earlier``
    are, {id(key): (key, what it reads for key)} of the weights it reads);
    ``wrt(param)``: what a gradient is taken of; ``move(value, context)``:
    a value of the master as read on a context."""
    real = {}
    previous = {}   # context: its gradient sums, up to its last micro-batch (of any loss)
    for loss, group in by_loss(stand_ins).items():
        loss = replaced([loss], replace)[0]
        targets = [wrt(s.tag.multigpu_gradient.param) for s in group]
        wanted = set(id(t) for t in targets)
        outer = theano_grad(loss, joined, disconnected_inputs='ignore',
                            return_disconnected='None')
        # (context, id(key)): [what the first micro-batch reads, the gradients' sum]
        sums = OrderedDict()
        for context, (start, stop), recompute in micro_batches:
            earlier = previous.get(context) or [g for g in outer if g is not None]
            pieces, reads = recompute(earlier)
            # Each piece's gradient given at a node of its own: a piece that
            # a later one reads also gets what comes back through it.
            known = OrderedDict((After()(piece), move(g[start:stop], context))
                                for piece, g in zip(pieces, outer) if g is not None)
            keys = [(key, read) for key, read in reads.values() if _needed(key, wanted)]
            if not keys:
                continue
            grads = theano_grad(None, [read for _, read in keys], known_grads=known,
                                disconnected_inputs='ignore', return_disconnected='None')
            for (key, read), grad in zip(keys, grads):
                if grad is not None:
                    entry = sums.setdefault((context, id(key)), [read, None])
                    entry[1] = grad if entry[1] is None else _apart(entry[1], context) + grad
            previous[context] = [total for (c, _), (_, total) in sums.items() if c == context]
        # (A host weight is read as itself on every context: its sums add up.)
        known = OrderedDict()
        for read, total in sums.values():
            known[read] = known[read] + total if read in known else total
        through_layers = theano_grad(None, targets, known_grads=known,
                                     disconnected_inputs='ignore', return_disconnected='None')
        # What the loss reads of the weights outside the layers (a regulariser).
        direct = theano_grad(loss, targets, consider_constant=joined,
                             disconnected_inputs='ignore', return_disconnected='None')
        for stand_in, target, a, b in zip(group, targets, through_layers, direct):
            total = [g for g in (a, b) if g is not None]
            real[stand_in] = host_gradient(
                theano.tensor.zeros_like(target) if not total else
                total[0] if len(total) == 1 else total[0] + total[1])
    return real
