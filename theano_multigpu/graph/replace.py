"""Rewriting a graph to read other variables, without copying it.

``theano.clone(outputs, replace=...)`` copies every replacement's whole
graph, once per replacement.  A rewrite that builds each layer on the
rewritten layers before it (layer-wise mode) therefore copied the model
once per layer it reads, and again per branch: a graph that doubled with
each merge, which Theano's merge optimisation then spent minutes folding
back, or which ran out of Python's recursion depth first.
"""
from theano import gof

__all__ = ['replaced']


def replaced(outputs, replace):
    """``outputs`` computed with each key of ``replace`` read as its value.

    Only the nodes between the keys and ``outputs`` that read a key, or a
    rebuilt node's output, are rebuilt; the values are used as they are
    (their own graphs are not searched for keys), and the nodes that read
    neither are shared with the original graph.  Types may change (a value
    on a context for a host tensor): a rebuilt node is made anew where they
    do.  A key may be one output of a node whose other outputs are read
    (BatchNormalization's normalised tensor and its statistics): the key
    reads its value, the others the rebuilt node's.
    """
    memo = dict((id(key), value) for key, value in replace.items())
    # clients={}: Theano's faster sort skips a node once its first output
    # is known, and would wait forever for another output of it.
    for node in gof.graph.io_toposort(list(replace), list(outputs), clients={}):
        inputs = [memo.get(id(v), v) for v in node.inputs]
        if any(new is not old for new, old in zip(inputs, node.inputs)):
            rebuilt = node.clone_with_new_inputs(inputs, strict=False)
            for old, new in zip(node.outputs, rebuilt.outputs):
                memo.setdefault(id(old), new)
    return [memo.get(id(v), v) for v in outputs]
