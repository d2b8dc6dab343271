"""Deep convolutional networks with a BatchNormalization per convolution,
the shape of every modern CNN (ResNets, VGG with batch normalisation), for
the tests and benchmarks of how the rewrites grow with depth.

    from deep_bn import Block, network, cnn13, resnet
    case = network([Block(8, 'before', None)] * 5)   # after Keras is importable

A network is a list of ``Block(filters, batchnorm, merge)``: a 3x3
convolution ('same' borders) with ``filters`` filters, then
BatchNormalization over the channels before the ReLU ('before'), after it
('after') or none (None); ``merge`` joins the block's input to its output:
'sum' (a residual connection; the block keeps its input's channels), 'concat'
(along the channels) or None.  Then global pooling and a softmax.  Everything
is deterministic given ``seed``; Keras is imported only inside the builders.
"""
import collections
import contextlib

import numpy as np

from models import set_random_weights

__all__ = ['Block', 'network', 'cnn13', 'resnet', 'node_count', 'train_graph_sizes']

Block = collections.namedtuple('Block', 'filters batchnorm merge')


def network(blocks, input_shape=(3, 8, 8), classes=2, batch=8, optimizer='sgd', seed=1234):
    """A compiled model of ``blocks`` (see the module docstring), its
    inputs and its targets (models.Case)."""
    from keras.layers import (Activation, BatchNormalization, Convolution2D, Dense,
                              GlobalAveragePooling2D, Input, merge)
    from keras.models import Model
    from keras.optimizers import SGD, Adam
    from models import Case

    x = inputs = Input(shape=input_shape)
    channels = input_shape[0]
    for block in blocks:
        filters = channels if block.merge == 'sum' else block.filters
        # Before BatchNormalization a bias has no true gradient (DESIGN.md).
        y = Convolution2D(filters, 3, 3, border_mode='same', dim_ordering='th',
                          bias=block.batchnorm != 'before')(x)
        if block.batchnorm == 'before':
            y = BatchNormalization(axis=1)(y)
        y = Activation('relu')(y)
        if block.batchnorm == 'after':
            y = BatchNormalization(axis=1)(y)
        if block.merge is not None:
            y = merge([x, y], mode=block.merge, concat_axis=1)
        x, channels = y, (channels + filters if block.merge == 'concat' else filters)
    outputs = Dense(classes, activation='softmax')(GlobalAveragePooling2D(dim_ordering='th')(x))
    model = Model(input=inputs, output=outputs)
    model.compile(loss='categorical_crossentropy',
                  optimizer=Adam(lr=0.001) if optimizer == 'adam' else SGD(lr=0.05))
    rng = np.random.RandomState(seed)
    set_random_weights(model, rng, 0.3)
    x = rng.rand(batch, *input_shape).astype('float32')
    y = np.eye(classes, dtype='float32')[rng.randint(0, classes, batch)]
    return Case('%d blocks' % len(blocks), model, x, y)


def cnn13(**kwargs):
    """13 convolution + BatchNormalization blocks, 8 to 24 filters, on
    3x16x16 inputs, batch 16, Adam."""
    blocks = [Block(8 + (16 * k) // 12, 'before', None) for k in range(13)]
    options = dict(input_shape=(3, 16, 16), batch=16, optimizer='adam')
    options.update(kwargs)
    return network(blocks, **options)


def resnet(blocks=20, **kwargs):
    """A ResNet-style model: ``blocks`` convolution + BatchNormalization
    blocks of 8 filters, each after the first summed with its input."""
    layout = [Block(8, 'before', None)] + [Block(8, 'before', 'sum')] * (blocks - 1)
    return network(layout, **kwargs)


def node_count(outputs):
    """The nodes of the graph that computes ``outputs``."""
    from theano import gof
    return len(gof.graph.io_toposort(gof.graph.inputs(outputs), outputs))


class _Handed(Exception):
    """Raised where Theano would be handed a function's graph: its roots."""


@contextlib.contextmanager
def _graphs_handed_to_theano(sizes):
    """Within it, a Keras call that would compile a function raises _Handed
    instead, and ``sizes['keras']`` is set to the node count of the graph
    Keras handed K.function (its losses included)."""
    import keras.backend as K
    from theano_multigpu.graph.gradients import stand_ins_in
    from theano_multigpu.keras_adapter import stock
    compile_theano, keras_function = stock['function'], K.function

    def handed(inputs, outputs, updates=(), **kwargs):
        raise _Handed(list(outputs) + [new for _, new in updates])

    def function(inputs, outputs, updates=(), **kwargs):
        roots = list(outputs) + [new for _, new in updates]
        losses = [s.tag.multigpu_gradient.loss for s in stand_ins_in(roots)]
        sizes['keras'] = node_count(roots + losses)
        return keras_function(inputs, outputs, updates=updates, **kwargs)

    stock['function'], K.function = handed, function
    try:
        yield
    finally:
        stock['function'], K.function = compile_theano, keras_function


def train_graph_sizes(case):
    """{'keras': nodes Keras hands K.function, 'theano': nodes Theano's
    function is handed (before its optimiser)} of ``case``'s train
    function, under the shim, in the configuration THEANO_FLAGS gives.
    Nothing is compiled: the model compiles its train function at its next
    step as usual."""
    sizes = {}
    with _graphs_handed_to_theano(sizes):
        try:
            case.model.train_on_batch(case.x, case.y)
        except _Handed as handed:
            sizes['theano'] = node_count(handed.args[0])
            return sizes
    raise AssertionError('training compiled no function')
