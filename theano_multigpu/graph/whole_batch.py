"""Computing over the whole batch what the replicas cannot compute apart:
the ops where the batch's rows meet (``rows.WholeBatchNode``), and layer
outputs that hold none of the rows.

Such a value is computed on the master, as one device computes it, from
the nearest tensors the replicas compute rows of, joined there (and
across the ranks under MPI, by the gather).  Each replica then reads the
value: all of it, or its rows of it where the value holds the rows.  The
gradient goes back the same way: the joins' and the transfers' gradients.
"""
from theano import tensor
from theano.tensor.opt import Assert

from .transfer import HOST, on_context

__all__ = ['WholeBatch', 'rows_of', 'join_on_master', 'rows_first', 'rows_back', 'moved',
           'purpose_of']


def rows_of(whole, axis, bounds, batch_size):
    """``whole``'s rows ``bounds`` along ``axis``, checked to number the
    batch's rows (one device refuses a tensor of other rows too)."""
    start, stop = bounds
    rows = whole.shape[axis]
    checked = Assert('batch-wise mode: a tensor made for a fixed batch size (a stateful '
                     "layer's states, a random draw or a constant of the batch's shape) "
                     'meets a batch of another size, which one device refuses too')(
        whole, tensor.eq(rows, batch_size))
    return checked[(slice(None),) * axis + (slice(start, stop),)]


def join_on_master(mesh, contexts, pieces, purpose=None):
    """The replicas' rows of one tensor (rows on axis 0), joined on the
    master; ``purpose``: see ToContext."""
    if contexts == [HOST]:
        return pieces[0]
    master = mesh.graph_name(mesh.master)
    return tensor.concatenate([on_context(piece, master, came_from=name, purpose=purpose)
                               for name, piece in zip(contexts, pieces)], axis=0)


def rows_first(variable, axis):
    """``variable`` with its rows' axis ``axis`` moved to the front."""
    if axis == 0:
        return variable
    return variable.dimshuffle([axis] + [k for k in range(variable.ndim) if k != axis])


def rows_back(variable, axis):
    """The inverse of ``rows_first(., axis)``."""
    if axis == 0:
        return variable
    order = [axis] + [k for k in range(variable.ndim) if k != axis]
    return variable.dimshuffle([order.index(k) for k in range(variable.ndim)])


def moved(value, source, context, purpose=None):
    """``value``, computed on context ``source``, as read on ``context``."""
    if context in (source, HOST):
        return value
    return on_context(value, context, came_from=source, purpose=purpose)


def purpose_of(layer):
    """The purpose (see ToContext) of the copies that compute ``layer`` (a
    name, or an op where no layer is known) over the whole batch."""
    return 'whole batch: %s' % layer


class WholeBatch(object):
    """The whole batch's version of a graph whose replicas compute rows of
    it, built on the master as far as asked.

    ``rebuilder`` is a Rebuilder that computes on the master, without keys
    for the batch inputs (it reads them, as every tensor of rows, joined
    from the replicas' rows); ``replicas`` the replicas' Rebuilders;
    ``found`` the row analysis (``rows.RowsFound``); ``join(pieces, axis,
    replicated, purpose)`` joins the replicas' rows of a tensor held on
    ``axis`` into the whole batch's, on the master.  ``replicated``: the
    values are read alike on every rank (the loss reads them), rather than
    each rank using them for its own rows (see ``RankGather.join``).
    """

    def __init__(self, rebuilder, replicas, found, join, replicated):
        self._rebuilder, self._replicas, self._found = rebuilder, replicas, found
        self._join, self._replicated = join, replicated

    def __call__(self, variables, purpose=None):
        """The whole batch's value of each of ``variables``; ``purpose``:
        of the copies that join what they read (see ToContext)."""
        for variable, axis in self._boundary(variables):
            if axis is None:   # a number no row changes: any replica computes it alike
                value = self._replicas[0]([variable])[0]
            else:
                value = self._join([replica([variable])[0] for replica in self._replicas],
                                   axis, self._replicated, purpose)
            self._rebuilder.add(variable, value)
        return self._rebuilder(variables)

    def add(self, variable, value):
        """Read ``variable`` as ``value``, computed on the master."""
        self._rebuilder.add(variable, value)

    def _boundary(self, variables):
        """[(variable, rows axis)]: the nearest tensors above ``variables``
        that the replicas compute rows of, and (axis None) numbers computed
        from their shapes that no row changes (a tensor's other sizes)."""
        found, seen = [], set()
        todo = [v for variable in variables if variable.owner is not None
                for v in variable.owner.inputs]
        while todo:
            variable = todo.pop()
            if id(variable) in seen or self._rebuilder.has(variable):
                continue
            seen.add(id(variable))
            facts = self._found.facts_of(variable)
            # (A batch input too: under MPI a rank may hold a batch of its
            # own, whose share is all the ranks' whole batch has of it.)
            if facts.rows is not None:
                found.append((variable, facts.rows))
            elif variable.owner is None:
                continue
            elif facts.count is not None and not facts.involved:
                found.append((variable, None))
            else:
                todo.extend(variable.owner.inputs)
        return found
