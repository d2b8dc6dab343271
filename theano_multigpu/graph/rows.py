"""The batch's rows: how they are shared among replicas and ranks, and where
in a graph they meet.

Splitting a batch over replicas is exact only where each row of an output
depends on its own row of the input.  ``find_rows_meeting`` walks the part
of a graph each replica computes, from the batch inputs to the frontier,
and tracks for each variable on which axis the batch's rows lie.  Ops that
make rows meet there (a reduction, cumulative op, sort, join or index along
the rows; a product contracting them or pairing them; ``K.shape(x)[0]``
used as a number, an op no rule knows) are found, with their layer and
why, before anything is compiled: the rewrite computes them over the
whole batch (``whole_batch``).  A tensor made for the whole batch without reading its
rows (a random draw of the batch's shape, a constant of a fixed batch size)
that meets the rows elementwise is returned: each replica takes its rows of
it, so it is the tensor one context would use.
"""
import operator

from .row_rules import NONE, Check, Facts, is_random_draw, node_facts

__all__ = ['slice_bounds', 'checked_bounds', 'find_rows_meeting', 'RowsFound', 'WholeBatchNode']


def slice_bounds(batch_size, parts):
    """[(start, stop)] of each of ``parts`` shares of ``batch_size`` rows:
    contiguous, in order, differing by at most one row; some are empty when
    there are fewer rows than parts.  Symbolic when ``batch_size`` is."""
    return [((i * batch_size) // parts, ((i + 1) * batch_size) // parts)
            for i in range(parts)]


def checked_bounds(bounds, rows=None):
    """``bounds``, [(start, stop)] of blocks of rows, as a tuple of pairs of
    whole numbers; ValueError saying what is wrong unless there is a block,
    each is non-empty, the first starts at row 0, each starts where the one
    before stopped, and the last stops at ``rows`` (where it is known)."""
    try:
        pairs = tuple((operator.index(start), operator.index(stop)) for start, stop in bounds)
    except (TypeError, ValueError):
        raise ValueError('not a list of (start, stop) pairs of whole rows')
    if not pairs:
        raise ValueError('no parts')
    at = 0
    for start, stop in pairs:
        if start != at:
            raise ValueError('part %r starts at row %d, not %d (%s)' % (
                (start, stop), start, at, 'a gap' if start > at else 'an overlap'))
        if stop <= start:
            raise ValueError('part %r is empty' % ((start, stop),))
        at = stop
    if rows is not None and at != rows:
        raise ValueError('the parts stop at row %d' % at)
    return pairs


class WholeBatchNode(object):
    """A node whose rows meet, computed once over the whole batch: ``why``
    the rows meet there, its ``layer`` (or None), and for each output the
    axis its whole-batch value holds the rows on, where each replica then
    reads its rows of it, or None where each reads all of it."""
    __slots__ = ('node', 'layer', 'why', 'rows')

    def __init__(self, node, layer, why, rows):
        self.node, self.layer, self.why, self.rows = node, layer, why, rows


class RowsFound(object):
    """What ``find_rows_meeting`` found:

    - ``whole``: [(variable, rows axis)], tensors made for the whole batch
      that the rows meet elementwise (see the module docstring);
    - ``synced``: the batch normalisation nodes (Theano's
      AbstractBatchNormTrain) whose statistics span the rows: with
      ``sync_batchnorm`` they must be the whole batch's; otherwise each
      replica's rows are its batch, by choice (multigpu.batchnorm=local);
    - ``checks``: [(condition, message)], shape conditions the split is
      exact under that only the run can decide: each replica asserts them;
    - ``computed_whole``: the WholeBatchNodes, in graph order;
    - ``frontier_rows``: the axis each frontier tensor holds the rows on,
      or None where it holds none (computed over the whole batch).
    """

    def __init__(self, whole, synced, checks, computed_whole, frontier_rows, facts):
        self.whole, self.synced, self.checks = whole, synced, checks
        self.computed_whole, self.frontier_rows = computed_whole, frontier_rows
        self._facts = facts   # id(variable): its Facts, where the rows reach it

    def facts_of(self, variable):
        return self._facts.get(id(variable), NONE)


def find_rows_meeting(batch_inputs, frontier, describe, sync_batchnorm=True):
    """Walk the graph from ``batch_inputs`` (rows on axis 0) to
    ``frontier``; returns a RowsFound.

    ``describe(node)`` -> (layer name or None, whether it is a layer whose
    statistics may meet the rows per slice: BatchNormalization, whose own
    statistics ops do so when ``sync_batchnorm`` is off).
    An op that makes rows meet, or that no rule knows (``row_rules``), is a
    WholeBatchNode: what one device computes there is computed once, from
    the whole batch.
    """
    found = _walk(batch_inputs, [Facts(rows=0)] * len(batch_inputs), frontier, describe,
                  sync_batchnorm, inner=False)
    facts, whole, synced, computed_whole, all_facts = found
    operands = [f for f in whole if not isinstance(f[0], Check)]
    checks = [(f[0].condition, _message(f[1], f[2], f[0].why)
               + ' (found as it ran: only the shapes of a batch tell)')
              for f in whole if isinstance(f[0], Check)]
    return RowsFound(operands, synced, checks, computed_whole, [f.rows for f in facts],
                     all_facts)


def _walk(inputs, input_facts, outputs, describe, sync_batchnorm, inner):
    """(facts of ``outputs``, whole, synced, whole-batch nodes); in a
    loop's step (``inner``), where no node can be computed apart, (why,
    node, layer) where the rows meet."""
    from theano import gof
    from theano.tensor.nnet.bn import AbstractBatchNormTrain
    facts = dict((id(v), f) for v, f in zip(inputs, input_facts))
    whole, synced, computed_whole = [], [], []

    def of(variable):
        return facts.get(id(variable), NONE)

    refused = []

    def walk_inner(inner_inputs, inner_facts, inner_outputs):
        found = _walk(inner_inputs, inner_facts, inner_outputs, lambda n: layer_of_outer,
                      sync_batchnorm, inner=True)
        if isinstance(found[0], str):
            refused.append(found)
            return found[0]
        return found[:3]

    # Values computed over the whole batch that hold no rows (a mean over
    # them), and what is computed from them alone: every replica reads them.
    replicated = set()

    def compute_whole(node, layer, why, rows):
        computed_whole.append(WholeBatchNode(node, layer, why, rows))
        for variable, axis in zip(node.outputs, rows):
            facts[id(variable)] = Facts(rows=axis)
            if axis is None:
                replicated.add(id(variable))

    nodes = gof.graph.io_toposort(gof.graph.inputs(outputs), outputs)
    met_at = {}   # a whole-batch tensor's id: the nodes that read it row by row
    for node in nodes:
        ins = [of(v) for v in node.inputs]
        reads_replicated = any(id(v) in replicated for v in node.inputs)
        if reads_replicated and not inner and any(f.involved for f in ins) \
                and not any(f.rows is not None for f in ins):
            # As one device: with the whole batch's count of rows or draw
            # (a mean is a sum over the rows divided by their count).
            compute_whole(node, describe(node)[0], 'computes a value of the whole batch '
                          'with the number of rows or a tensor of the batch\'s shape',
                          [None] * len(node.outputs))
            continue
        if not any(f.involved for f in ins) and not is_random_draw(node):
            if reads_replicated:
                replicated.update(id(v) for v in node.outputs)
            continue
        layer, statistics_layer = describe(node)
        # Rows meet per slice there only by choice (multigpu.batchnorm=local).
        per_slice = statistics_layer and not sync_batchnorm
        layer_of_outer = (layer, statistics_layer)
        if isinstance(node.op, AbstractBatchNormTrain) and ins[0].rows in node.op.axes:
            # The output keeps the rows; mean and 1/std span them.
            if sync_batchnorm:
                synced.append(node)
            facts[id(node.outputs[0])] = Facts(rows=ins[0].rows)
            continue
        del refused[:]
        outs, found = node_facts(node, ins, per_slice, walk_inner)
        if refused and inner:   # inside a loop's step: name the op there
            return refused[0]
        if isinstance(found, str):
            if inner:
                return found, node, layer
            compute_whole(node, layer, found, [f.rows for f in outs] or
                          [None] * len(node.outputs))
            continue
        whole += [(f, node, layer) if isinstance(f, Check) else f for f in found]
        for f in found:
            if not isinstance(f, Check):
                met_at.setdefault(id(f[0]), set()).add(id(node))
        for variable, fact in zip(node.outputs, outs):
            facts[id(variable)] = fact
    # Each replica reads its rows of a whole-batch tensor wherever the
    # replica's graph reads it: only where the rows meet it row by row.
    # Another reader of it is computed over the whole batch.
    for node in nodes:
        if any(id(v) in met_at and id(node) not in met_at[id(v)] for v in node.inputs):
            why = ('reads a tensor made for the whole batch (a random draw, a constant or '
                   'a range of the batch\'s shape) whole, where elsewhere the rows meet it '
                   'row by row')
            if inner:
                return why, node, describe(node)[0]
            if not any(w.node is node for w in computed_whole):
                compute_whole(node, describe(node)[0], why,
                              [of(v).rows for v in node.outputs])
    order = dict((id(node), k) for k, node in enumerate(nodes))
    computed_whole.sort(key=lambda w: order[id(w.node)])
    return [of(v) for v in outputs], whole, synced, computed_whole, facts


def _message(node, layer, why):
    """Why a shape condition checked as the step runs failed."""
    where = 'in layer %r' % layer if layer else 'outside any layer'
    return ('batch-wise mode splits each batch\'s rows over the contexts (and ranks), so '
            'each must compute its rows as one device computes them, but %s %s %s: on '
            'one device it sees the whole batch, on several contexts each would see only '
            'its rows, and the numbers would differ. Compute it in the loss, or run on '
            'one context (THEANO_FLAGS contexts=dev0->...) in one process.'
            % (node.op, where, why))
