"""What Keras's graphs say, read from Keras's internals: the one module
that reads them (``_keras_history``, ``inbound_nodes``, ``_keras_shape``,
``stateful``, ``states``, ``trainable`` and ``trainable_weights``).

Keras 1.x marks each tensor a layer call returns with ``_keras_history``
(layer, node index, tensor index); the layer's ``inbound_nodes[index]``
holds that call's input and output tensors.  The graph machinery below
takes these facts as arguments and never reads Keras itself.
"""
from theano import gof

__all__ = ['is_layer_output', 'layer_calls', 'node_describer', 'row_states',
           'trainable_weights', 'mark_as_weight']


def _layer_of(variable):
    history = getattr(variable, '_keras_history', None)
    return history[0] if history else None


def is_layer_output(variable):
    """Whether a Keras layer call returned ``variable``."""
    return hasattr(variable, '_keras_history')


def layer_calls(roots):
    """The Keras layer calls whose outputs ``roots`` read, as LayerCalls,
    in the order the graph's ancestors list them."""
    from ..graph.layerwise import LayerCall   # layer-wise mode alone needs it
    found = {}
    for variable in gof.graph.ancestors(roots):
        layer = _layer_of(variable)
        if layer is not None and variable.owner is not None:
            key = (id(layer), variable._keras_history[1])
            if key not in found:
                node = layer.inbound_nodes[key[1]]
                found[key] = LayerCall(
                    layer, layer.name, node.input_tensors, node.output_tensors,
                    [getattr(t, '_keras_shape', None) or (None,) * t.ndim
                     for t in node.output_tensors])
    return list(found.values())


# Layers whose statistics may be computed on each context's rows by choice
# (multigpu.batchnorm=local): BatchNormalization then normalises each
# replica's slice.
PER_SLICE_LAYERS = ('BatchNormalization',)


def node_describer(roots):
    """``describe(node)`` -> (name of the innermost layer whose call computes
    ``node``, or None; whether rows may meet there per slice), for the
    nodes of the layer calls ``roots`` read."""
    calls = []
    for variable in gof.graph.ancestors(roots):
        layer = _layer_of(variable)
        if layer is not None and variable.owner is not None:
            node = layer.inbound_nodes[variable._keras_history[1]]
            if not any(c[1] is node for c in calls):
                region = gof.graph.io_toposort(node.input_tensors, node.output_tensors)
                calls.append((layer, node, region))
    by_node = {}
    for layer, _, region in sorted(calls, key=lambda c: -len(c[2])):   # innermost last
        for apply_node in region:
            by_node[id(apply_node)] = (layer.name, type(layer).__name__ in PER_SLICE_LAYERS)

    def describe(apply_node):
        return by_node.get(id(apply_node), (None, False))
    return describe


def row_states(roots):
    """The states of the stateful layers (recurrent layers with
    ``stateful=True``) whose outputs ``roots`` read: shared variables with a
    row per sample of the batch."""
    found = []
    for variable in gof.graph.ancestors(roots):
        layer = _layer_of(variable)
        if getattr(layer, 'stateful', False):
            found += [s for s in getattr(layer, 'states', []) or []
                      if s is not None and all(s is not f for f in found)]
    return found


def trainable_weights(roots):
    """The trainable weights of the Keras layers whose outputs ``roots``
    read: what a training function may update, known before any optimizer
    exists (a model's ``predict`` compiled before its ``fit``).  A layer
    or model frozen with ``trainable = False`` has none; a model used as a
    layer has those of its layers, each as frozen as it says."""
    found, seen = [], set()
    for variable in gof.graph.ancestors(roots):
        layer = _layer_of(variable)
        if layer is not None and id(layer) not in seen:
            seen.add(id(layer))
            found += [w for w in _trainable_of(layer) if all(w is not f for f in found)]
    return found


def _trainable_of(layer):
    if not getattr(layer, 'trainable', True):
        return []
    inner = getattr(layer, 'layers', None)
    if inner:   # a model: Keras 1.0 does not ask its layers whether they are frozen
        return [w for sub in inner for w in _trainable_of(sub)]
    return list(getattr(layer, 'trainable_weights', None) or [])


def mark_as_weight(variable, shape):
    """What Keras's ``K.variable`` sets on the variables it returns."""
    variable._keras_shape = shape
    variable._uses_learning_phase = False
    return variable
