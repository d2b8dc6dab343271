"""What stands between Keras and a compiled Function: each wrapper is
called as Keras calls a Function (``f(inputs)``) and gives the wrapped
Function's attributes (``function`` and the rest), and has one job:

- ``SplitFunction``: batch-wise, one Function per number of contexts a
  batch fills and of micro-batches it runs as;
- ``LayerwiseFunction``: layer-wise, compiled at its first call, whose
  batch size the plan counts;
- ``PeakChecked``: stops a call whose step's planned peak does not fit;
- ``FirstCallReport``: prints the placement report after the first call;
- ``FirstStepsWithoutLimit``: under MPI, the first call at each batch size
  waits for the other ranks without a time limit;
- ``SingleOutput``: a Function of ``[output]`` called as one of ``output``.

``call_rows`` is the one reading of the rows a call is handed.  The graph
layer is imported where a wrapper needs it: it imports Theano's gpuarray
backend, and a plain run without pygpu must not.
"""
import sys

import numpy as np

from ..config.flags import format_bytes

__all__ = ['call_rows', 'SplitFunction', 'LayerwiseFunction', 'PeakChecked', 'FirstCallReport',
           'FirstStepsWithoutLimit', 'SingleOutput']


def call_rows(inputs):
    """The rows of the batch a Function is handed: the length of its first
    input that has rows, or None where none has (a call of scalars)."""
    return next((len(x) for x in inputs if getattr(x, 'ndim', 0) >= 1), None)


def _fitting(inputs):
    """What whether a call fits depends on: in its ``inputs``, each
    array's shape and a scalar's value (the learning phase may choose a
    branch), and multigpu.device_memory (a script may raise it after a
    refusal)."""
    import theano
    return (tuple(np.shape(value) if np.ndim(value) else ('value', np.asarray(value).item())
                  for value in inputs), theano.config.multigpu.device_memory)


def _shares(rows, ranks):
    """Each of the ``ranks`` = (rank, size)'s number of rows of ``rows``."""
    from ..graph.rows import slice_bounds
    return [stop - start for start, stop in slice_bounds(rows, ranks[1])]


class _Wrapper(object):
    """Gives the attributes of the Function ``_wrapped()`` returns."""

    def __getattr__(self, name):
        if name.startswith('_'):
            raise AttributeError(name)
        return getattr(self._wrapped(), name)


class SplitFunction(_Wrapper):
    """A Keras backend Function over all contexts, and over fewer for a
    batch with fewer rows than contexts (compiled when first needed), so
    that no context computes on an empty slice: BLAS libraries refuse
    zero-row products (CLBlast does) and there is nothing to gain.  Under
    MPI (``ranks`` = (rank, size)) every rank with rows computes on as many
    contexts as the smallest share that is not empty has rows: the ranks'
    graphs, and so the order of their collectives, are alike.  A call
    without rows counts as one of as many rows as contexts.

    ``accumulate`` (multigpu.accumulate): each context computes its rows as
    that many micro-batches (of at least one row each), or, ``'auto'``, as the
    fewest whose planned peak fits (see ``_fewest_that_fit``).

    ``compile_for(mesh, idle=False, micro_batches=1)`` returns the Keras
    Function for ``mesh`` (``idle``: for an MPI rank whose share of the
    batch is empty).
    """

    def __init__(self, compile_for, mesh, ranks=None, accumulate=1):
        self._compile_for = compile_for
        self._mesh = mesh
        self._ranks = ranks
        self._accumulate = accumulate
        self._first = (mesh.size, 1 if accumulate == 'auto' else accumulate)
        self._compiled = {self._first: compile_for(mesh, micro_batches=self._first[1])}
        self._chosen = {}   # (contexts, _fitting(inputs)): micro-batches

    def __call__(self, inputs):
        rows = call_rows(inputs)
        rows = self._mesh.size if rows is None else rows
        if self._ranks is not None:
            shares = _shares(rows, self._ranks)
            rows = min(share for share in shares if share) if shares[self._ranks[0]] else 0
        count = min(rows, self._mesh.size) if self._ranks else max(1, min(rows, self._mesh.size))
        most = max(1, rows // max(count, 1))   # micro-batches of a row or more
        if self._accumulate == 'auto':
            key = (count, _fitting(inputs))
            if key not in self._chosen:
                self._chosen[key] = self._fewest_that_fit(count, most, rows, inputs)
            micro_batches = self._chosen[key]
        else:
            micro_batches = min(self._accumulate, most)
        return self._function(count, micro_batches)(inputs)

    def _function(self, count, micro_batches):
        if (count, micro_batches) not in self._compiled:
            # count 0: an MPI rank without rows (idle, see the MPI gather)
            self._compiled[count, micro_batches] = self._compile_for(
                self._mesh.first(max(count, 1)), idle=count == 0, micro_batches=micro_batches)
        return self._compiled[count, micro_batches]

    def _fewest_that_fit(self, count, most, rows, inputs):
        """The fewest micro-batches per context (up to ``most``, and
        ``MOST_MICRO_BATCHES``) whose planned peak fits (``PeakChecked``):
        1 where it fits; else 2; else from the estimate of two plans
        (``micro_batches.estimated_micro_batches``), up by doubling until
        one fits, then the fewest between.  PlanError when none fits, or
        the function cannot run as micro-batches."""
        from ..errors import ConfigurationError, PlanError
        from ..graph.micro_batches import MOST_MICRO_BATCHES, estimated_micro_batches
        whole = self._function(count, 1)
        misfit = whole.misfit(inputs)
        if misfit is None:
            return 1
        limit = min(most, MOST_MICRO_BATCHES)

        def function(micro_batches):
            try:
                return self._function(count, micro_batches)
            except ConfigurationError as why:
                raise PlanError('%s\nmultigpu.accumulate=auto cannot make it fit: %s'
                                % (misfit, why))

        def cannot(why):
            return PlanError('%s\nmultigpu.accumulate=auto: %s; use a smaller batch or more '
                             'contexts, or set multigpu.accumulate to a number by hand.'
                             % (misfit, why))
        if limit < 2:
            raise cannot('the contexts have too few rows for 2 micro-batches each')
        if function(2).misfit(inputs) is None:
            low, high = 1, 2
        else:
            estimate = estimated_micro_batches(whole.planned(inputs),
                                               function(2).planned(inputs))
            if estimate is None or estimate > limit:
                raise cannot('its planned peak at 2 micro-batches per context (%s) leaves too '
                             'little room for what does not shrink with them (weights, their '
                             'optimizer state, copies and gradients; on the master, the whole '
                             "batch's outputs, their gradient and random draws) within %d "
                             'micro-batches'
                             % (', '.join('%s %s' % ('+'.join(names), format_bytes(need))
                                          for names, need, _ in function(2).planned(inputs)),
                                limit))
            if limit == 2:
                raise cannot('2 micro-batches per context do not fit, and the contexts have '
                             'too few rows for more')
            low, high = 2, min(max(3, estimate), limit)
            while function(high).misfit(inputs) is not None:
                if high >= limit:
                    raise cannot('%d micro-batches per context do not fit either' % high)
                low, high = high, min(2 * high, limit)
        while high - low > 1:
            middle = (low + high) // 2
            fits = function(middle).misfit(inputs) is None
            low, high = (low, middle) if fits else (middle, high)
        sys.stderr.write(
            'theano_multigpu: %s: a batch of %d rows does not fit at once on %d context(s); '
            'each computes its rows as %d micro-batches (multigpu.accumulate=auto)\n'
            % (whole.title, rows, count, high))
        return high

    def _wrapped(self):
        return self._compiled[self._first]


class LayerwiseFunction(_Wrapper):
    """A Keras backend Function compiled at its first call, when the batch
    size the plan counts activations with is known (1 row for a call
    without rows).  Under MPI (``ranks`` = (rank, size)) the rows counted
    are the largest rank's share, and a rank without rows (fewer rows than
    ranks) has a function of its own.

    ``compile_for(batch_rows, idle=False)`` returns the Keras Function.
    """

    def __init__(self, compile_for, ranks=None):
        self._compile_for = compile_for
        self._ranks = ranks
        self._compiled = {}   # idle: the Function

    def __call__(self, inputs):
        rows = call_rows(inputs) or 1
        idle = False
        if self._ranks is not None:
            # Every rank plans with the largest share: the same plan.
            shares = _shares(rows, self._ranks)
            rows, idle = max(shares), shares[self._ranks[0]] == 0
        if idle not in self._compiled:
            self._compiled[idle] = self._compile_for(max(rows, 1), idle)
        return self._compiled[idle](inputs)

    def _wrapped(self):
        """The Function of a rank with rows (compiled with the latest plan's
        batch size, if it was never called)."""
        if False not in self._compiled:
            from ..graph.plan import current_plan
            plan = current_plan()
            self._compiled[False] = self._compile_for(plan.batch_rows if plan else 1)
        return self._compiled[False]


class FirstCallReport(_Wrapper):
    """A Keras backend Function that prints its placement report after its
    first call, when the batch size and the bytes moved are known."""

    def __init__(self, keras_function, mesh, title, stream=None, split=None):
        self._keras_function = keras_function
        self._mesh = mesh
        self._title = title
        self._stream = stream
        self._split = split
        self._reported = False

    def __call__(self, inputs):
        if self._reported:
            return self._keras_function(inputs)
        from ..graph import report, transfer
        function = self._keras_function.function
        before, copied_before = dict(transfer.bytes_moved()), report.copied_for(function)
        outputs = self._keras_function(inputs)
        self._reported = True
        moved = {key: n - before.get(key, 0) for key, n in transfer.bytes_moved().items()}
        copied = {key: n - copied_before.get(key, 0)
                  for key, n in report.copied_for(function).items()}
        text = report.report(function, self._mesh, self._title, call_rows(inputs) or 0, moved,
                             self._split, copied, inputs)
        (self._stream or sys.stderr).write(text + '\n')
        return outputs

    def _wrapped(self):
        return self._keras_function


class PeakChecked(_Wrapper):
    """A Keras backend Function whose call with inputs of shapes (and
    scalars) not seen before stops, before it runs, when its planned peak
    does not fit (PlanError, see ``graph.peak_plan.misfit``)."""

    def __init__(self, keras_function, mesh, title):
        self._keras_function = keras_function
        self._mesh = mesh
        self.title = title
        # _fitting(inputs): (peak_plan.peaks_and_room's, the PlanError or None)
        self._planned = {}

    def __call__(self, inputs):
        misfit = self.misfit(inputs)
        if misfit is not None:
            raise misfit
        return self._keras_function(inputs)

    def planned(self, inputs):
        """[(context names, planned peak, room)] of a call with ``inputs``
        (``peak_plan.peaks_and_room``), or None where it is not planned."""
        return self._plan(inputs)[0]

    def misfit(self, inputs):
        """The PlanError a call with ``inputs`` raises before it runs, or
        None where its planned peak fits."""
        return self._plan(inputs)[1]

    def _plan(self, inputs):
        """Planned once per shapes and budget: a step's call looks it up."""
        key = _fitting(inputs)
        if key not in self._planned:
            from ..graph import peak_plan
            limits = peak_plan.peaks_and_room(self._keras_function.function, inputs, self._mesh)
            self._planned[key] = (limits, peak_plan.misfit(limits, self.title))
        return self._planned[key]

    def _wrapped(self):
        return self._keras_function


class FirstStepsWithoutLimit(_Wrapper):
    """Under MPI, a function (a SplitFunction or LayerwiseFunction) whose
    first call at each batch size waits for the other ranks without a time
    limit: a rank may first compile a function for its share of rows of
    that size (or build a kernel or Scan's loop at its first call) while
    the others wait in the step."""

    def __init__(self, split):
        self._split = split
        self._sizes_seen = set()

    def __call__(self, inputs):
        rows = call_rows(inputs)
        if rows in self._sizes_seen:
            return self._split(inputs)
        from ..mpi import world
        with world.without_limit():
            result = self._split(inputs)
        self._sizes_seen.add(rows)
        return result

    def _wrapped(self):
        return self._split


class SingleOutput(_Wrapper):
    """A Keras Function compiled for ``[output]``, called as one compiled
    for ``output``: a call returns the array, not a list of one."""

    def __init__(self, keras_function):
        self._keras_function = keras_function

    def __call__(self, inputs):
        return self._keras_function(inputs)[0]

    def _wrapped(self):
        return self._keras_function
