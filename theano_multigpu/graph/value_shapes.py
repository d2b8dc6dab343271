"""The shapes of a compiled graph's values at a call, known before it runs.

``ValueShapes(fgraph, values)`` infers them op by op, in graph order, from
the values of the graph's inputs (the call's inputs and the weights): each
op's ``infer_shape`` given its inputs' shapes as numbers (``SHAPE_RULES``
for the GPU ops that have none), else Theano's shape inference
(``fgraph.shape_feature``).  A shape expression is evaluated with the ops'
Python implementations on scalars and shape vectors alone, never on a
tensor of data.  An op whose outputs' shapes cannot be told leaves them
unknown: asking for one raises ``NotPlannable``, naming the op.
"""
import numpy as np
from theano import gof
from theano.compile.ops import Shape, Shape_i
from theano.ifelse import IfElse
from theano.tensor import extra_ops, nnet
from theano.tensor.basic import MaxAndArgmax
from theano.tensor.nnet import corr

__all__ = ['NotPlannable', 'ValueShapes', 'SHAPE_RULES']


class NotPlannable(ValueError):
    """A shape, and so a plan, that only running the step would tell: the
    message says which op and why."""


class ValueShapes(object):
    """See the module docstring; ``value(v)`` is the value of a scalar or
    shape vector ``v`` (a branch's condition, a requested size)."""

    def __init__(self, fgraph, values):
        self.shape_of = getattr(getattr(fgraph, 'shape_feature', None), 'shape_of', None) or {}
        self.values = dict(values)
        self.known = {}
        self.why_not = {}
        for node in fgraph.toposort():
            self._infer(node)

    def shape(self, variable):
        if variable in self.values:
            value = self.values[variable]
            return tuple(value.shape) if hasattr(value, 'shape') else np.shape(value)
        if isinstance(variable, gof.Constant):
            return np.shape(variable.data)
        if variable.owner is None:
            if getattr(variable.type, 'ndim', 0):
                raise NotPlannable('%s has no value to read its shape from' % variable)
            return ()
        if variable not in self.known:
            raise NotPlannable(self.why_not.get(variable) or (
                'the shape of %s (computed by %s) is known only once it is computed'
                % (variable, variable.owner.op)))
        return self.known[variable]

    def _infer(self, node):
        rule = SHAPE_RULES.get(type(node.op).__name__)
        try:
            inputs = [self.shape(v) for v in node.inputs]
            if rule is not None:
                found = rule(node, inputs, self.value)
            elif hasattr(node.op, 'infer_shape'):
                found = node.op.infer_shape(node, inputs)
            else:
                found = [self.shape_of[o] for o in node.outputs]
            for output, shape in zip(node.outputs, found):
                self.known[output] = tuple(int(self.value(d)) for d in shape)
        except NotPlannable as error:
            for output in node.outputs:
                self.why_not[output] = str(error)
        except Exception as error:   # any op's own error: its shapes cannot be told
            for output in node.outputs:
                self.why_not[output] = ('the output shape of %s cannot be inferred from its '
                                        'inputs\' (%s: %s)'
                                        % (node.op, type(error).__name__, error))

    def value(self, variable):
        if not isinstance(variable, gof.Variable):
            return variable
        if variable in self.values:
            return self.values[variable]
        if isinstance(variable, gof.Constant):
            return variable.data
        node = variable.owner
        if node is None:
            raise NotPlannable('%s has no value' % variable)
        if isinstance(node.op, Shape_i):
            return np.asarray(self.shape(node.inputs[0])[node.op.i], dtype='int64')
        if isinstance(node.op, Shape):
            return np.asarray(self.shape(node.inputs[0]), dtype='int64')
        if isinstance(node.op, IfElse):   # the value of the side taken
            n, k = node.op.n_outs, node.outputs.index(variable)
            side = 1 if np.asarray(self.value(node.inputs[0])).item() else 1 + n
            return self.value(node.inputs[side + k])
        if any(getattr(v.type, 'ndim', 0) > 1 for v in node.inputs + node.outputs):
            raise NotPlannable('the shape of a value needs %s computed' % node.op)
        storage = [[None] for _ in node.outputs]
        node.op.perform(node, [np.asarray(self.value(v)) for v in node.inputs], storage)
        for output, cell in zip(node.outputs, storage):
            self.values[output] = cell[0]
        return self.values[variable]


def _same_as_first(node, shapes, value):
    return [shapes[0]]


def _dot22(node, shapes, value):
    return [(shapes[0][0], shapes[1][1])]


def _as_cpu(cpu_class):
    """The rule of a GPU op whose CPU twin's ``infer_shape`` reads the same
    inputs and attributes."""
    def rule(node, shapes, value):
        return cpu_class.infer_shape(node.op, node, shapes)
    return rule


def _undilated(cpu_class):
    """A correlation gradient's rule: the CPU twin's, which ignores
    ``filter_dilation`` (the GPU op applies it), so dilated ones are not
    planned."""
    def rule(node, shapes, value):
        if any(d != 1 for d in getattr(node.op, 'filter_dilation', (1,))):
            raise NotPlannable('the output shape of a dilated %s is not inferred' % node.op)
        return cpu_class.infer_shape(node.op, node, shapes)
    return rule


def _random_draws(node, shapes, value):
    """mrg_uniform: the generator's new state and draws of the requested size."""
    return [shapes[0], tuple(int(n) for n in np.ravel(value(node.inputs[1])))]


def _branch_taken(node, shapes, value):
    """IfElse: the shapes of the side its condition takes (its own
    infer_shape is a branch over shapes, with no Python implementation)."""
    n = node.op.n_outs
    return shapes[1:1 + n] if np.asarray(value(node.inputs[0])).item() else shapes[1 + n:1 + 2 * n]


# GPU ops, copies, branches and the random generator, which have no
# infer_shape of their own, or none that numbers can evaluate.
SHAPE_RULES = {
    'DeepCopyOp': _same_as_first, 'IfElse': _branch_taken,
    'GpuContiguous': _same_as_first, 'GpuGemm': _same_as_first, 'GpuGemv': _same_as_first,
    'GpuGer': _same_as_first, 'GpuDot22': _dot22,
    'GpuAdvancedIncSubtensor1': _same_as_first, 'GpuAdvancedIncSubtensor1_dev20': _same_as_first,
    'GpuMaxAndArgmax': _as_cpu(MaxAndArgmax),
    'GpuCumOp': _as_cpu(extra_ops.CumOp),
    'GpuCrossentropySoftmaxArgmax1HotWithBias':
        _as_cpu(nnet.CrossentropySoftmaxArgmax1HotWithBias),
    'GpuCrossentropySoftmax1HotWithBiasDx': _as_cpu(nnet.CrossentropySoftmax1HotWithBiasDx),
    'GpuCorrMM': _as_cpu(corr.CorrMM),
    'GpuCorrMM_gradWeights': _undilated(corr.CorrMM_gradWeights),
    'GpuCorrMM_gradInputs': _undilated(corr.CorrMM_gradInputs),
    'GPUA_mrg_uniform': _random_draws, 'mrg_uniform': _random_draws,
}
