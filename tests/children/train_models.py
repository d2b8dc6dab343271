"""Child script: build named models with fixed weights and data, train each
for a few steps, and save what the tests compare.

    python train_models.py OUT.npz STEPS BATCH MODEL[@BATCH] [MODEL ...]
    mpirun -np 2 python train_models.py OUT_{rank}.npz ...

For each MODEL (trained at BATCH rows, or at the rows after its '@') it
stores under its name: ``w<i>`` (weights after training), ``first/w<i>``
(after the first step), ``loss`` (the per-step outputs), ``pred`` and
``eval`` (at the same batch), ``contexts`` (the contexts the compiled train
function's heavy ops run on) and, under the shim, ``misplaced`` (heavy ops
the placement check flags in the train, test and predict functions); in
layer-wise mode also ``layer_contexts`` and ``placement_errors``; in
layer-wise and sharded batch-wise mode ``memory`` (resident and planned
bytes per context, see ``resident_and_planned``); under the shim ``split``
and ``theano_copies`` (see ``split_weights``); under
MPI ``collectives`` (the MPI ops of the train function).  Runs unchanged on
any backend.
"""
import os
import sys

import numpy as np

# The weights every backend starts from: benchmarks/models.py, shared with the benchmarks.
sys.path.insert(1, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'benchmarks'))
from models import set_random_weights  # noqa: E402


def build(name, rng, n):
    """(model, x, y, fit kwargs) for ``name``, deterministic given rng."""
    from keras.models import Sequential, Model
    from keras.layers import (Dense, Convolution2D, MaxPooling2D, Flatten, Embedding,
                              LSTM, GRU, Input, merge, Dropout, BatchNormalization,
                              Activation)
    from keras.optimizers import SGD, Adam, RMSprop
    kwargs = {}
    if name == 'mlp':
        model = Sequential([Dense(16, input_dim=8, activation='relu'),
                            Dense(3, activation='softmax')])
        model.compile(loss='categorical_crossentropy', metrics=['accuracy'],
                      optimizer=SGD(lr=0.1, momentum=0.9, nesterov=True))
        x = rng.rand(n, 8).astype('float32')
        y = np.eye(3)[rng.randint(0, 3, n)].astype('float32')
        kwargs['class_weight'] = {0: 1.0, 1: 2.0, 2: 0.5}
    elif name == 'cnn':
        model = Sequential([Convolution2D(4, 3, 3, input_shape=(1, 8, 8), activation='relu',
                                          dim_ordering='th'),
                            MaxPooling2D((2, 2), dim_ordering='th'), Dropout(0.0), Flatten(),
                            Dense(3, activation='softmax')])
        model.compile(loss='categorical_crossentropy', optimizer=Adam(lr=0.01),
                      metrics=['accuracy'])
        x = rng.rand(n, 1, 8, 8).astype('float32')
        y = np.eye(3)[rng.randint(0, 3, n)].astype('float32')
    elif name in ('cnn_bn', 'cnn_bn1'):
        # cnn_bn: four BatchNormalizations, the last two blocks residual, so
        # every later layer of every replica reads each synchronised one's
        # statistics (each replica must be built once).  cnn_bn1: the first
        # block alone.  Before BatchNormalization a bias has no true gradient, and
        # Adam would scale its float noise to full steps: the convolutions have
        # none, and SGD compares the numbers (Adam's first steps are lr x the
        # sign of each gradient, noise included).
        inputs = Input(shape=(1, 8, 8))
        h = Convolution2D(4, 3, 3, activation='relu', dim_ordering='th', bias=False)(inputs)
        h = BatchNormalization(axis=1)(h)
        for block in range(3 if name == 'cnn_bn' else 0):
            y = Convolution2D(4, 3, 3, border_mode='same', dim_ordering='th', bias=False)(h)
            y = Activation('relu')(BatchNormalization(axis=1)(y))
            h = merge([h, y], mode='sum') if block else y
        h = Flatten()(Dropout(0.0)(MaxPooling2D((2, 2), dim_ordering='th')(h)))
        model = Model(input=inputs, output=Dense(3, activation='softmax')(h))
        model.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.1, momentum=0.9),
                      metrics=['accuracy'])
        x = rng.rand(n, 1, 8, 8).astype('float32')
        y = np.eye(3)[rng.randint(0, 3, n)].astype('float32')
    elif name == 'deep_mlp':
        from keras.regularizers import l2
        layers = [Dense(24, input_dim=8, activation='relu', W_regularizer=l2(0.01))]
        layers += [Dense(24, activation='tanh' if i % 2 else 'relu') for i in range(7)]
        layers += [Dense(3, activation='softmax')]
        model = Sequential(layers)
        model.compile(loss='categorical_crossentropy', optimizer=Adam(lr=0.01),
                      metrics=['accuracy'])
        x = rng.rand(n, 8).astype('float32')
        y = np.eye(3)[rng.randint(0, 3, n)].astype('float32')
    elif name == 'mlp_l2':
        # An l2 regulariser 1000 times the data term (at the first step):
        # the gradients are the regulariser's, the data's a small part.
        from keras.regularizers import l2
        model = Sequential([Dense(16, input_dim=8, activation='tanh', W_regularizer=l2(165.)),
                            Dense(3, activation='softmax')])
        model.compile(loss='categorical_crossentropy', optimizer=SGD(lr=1e-3))
        x = rng.rand(n, 8).astype('float32')
        y = np.eye(3)[rng.randint(0, 3, n)].astype('float32')
    elif name == 'residual':
        # Skip connections, as Keras 1 functional scripts write them: each
        # block adds its input to its output (merge 'sum'), and a long skip
        # joins the first block's output to the last (merge 'concat').
        inputs = Input(shape=(8,))
        first = hidden = Dense(12, activation='relu')(inputs)
        for k in range(10):
            block = Dense(12, activation='tanh' if k % 2 else 'relu')(hidden)
            hidden = merge([hidden, block], mode='sum')
        out = Dense(3, activation='softmax')(merge([hidden, first], mode='concat'))
        model = Model(inputs, out)
        model.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.05, momentum=0.9),
                      metrics=['accuracy'])
        x = rng.rand(n, 8).astype('float32')
        y = np.eye(3)[rng.randint(0, 3, n)].astype('float32')
    elif name == 'mlp_dropout':
        model = Sequential([Dense(16, input_dim=8, activation='relu'), Dropout(0.5),
                            Dense(3, activation='softmax')])
        model.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.1))
        x = rng.rand(n, 8).astype('float32')
        y = np.eye(3)[rng.randint(0, 3, n)].astype('float32')
    elif name in ('lstm', 'gru'):
        recurrent = LSTM if name == 'lstm' else GRU
        model = Sequential([Embedding(12, 6, input_length=5, mask_zero=True),
                            recurrent(7), Dense(3, activation='softmax')])
        model.compile(loss='categorical_crossentropy', optimizer=RMSprop(lr=0.01, clipnorm=0.5))
        x = rng.randint(1, 12, (n, 5)).astype('int32')
        x[:, :2] *= rng.randint(0, 2, (n, 2))  # leading zeros: masked steps
        y = np.eye(3)[rng.randint(0, 3, n)].astype('float32')
    elif name == 'functional':
        a, b = Input(shape=(4,)), Input(shape=(3,))
        hidden = merge([Dense(5, activation='tanh')(a), Dense(5, activation='tanh')(b)],
                       mode='concat')
        out1 = Dense(2, activation='softmax', name='out1')(hidden)
        out2 = Dense(1, name='out2')(hidden)
        model = Model(input=[a, b], output=[out1, out2])
        model.compile(loss=['categorical_crossentropy', 'mse'], loss_weights=[1.0, 0.5],
                      optimizer=RMSprop(lr=0.01, clipnorm=1.0), metrics=['accuracy'])
        x = [rng.rand(n, 4).astype('float32'), rng.rand(n, 3).astype('float32')]
        y = [np.eye(2)[rng.randint(0, 2, n)].astype('float32'),
             rng.rand(n, 1).astype('float32')]
        kwargs['sample_weight'] = [rng.rand(n).astype('float32') + 0.5,
                                   rng.rand(n).astype('float32')]
    elif name == 'stateful_lstm':
        # Keras's examples/stateful_lstm.py in small: states carried from
        # batch to batch, a fixed batch_input_shape.
        model = Sequential([LSTM(5, batch_input_shape=(n, 3, 2), return_sequences=True,
                                 stateful=True),
                            LSTM(4, stateful=True), Dense(1)])
        model.compile(loss='mse', optimizer=RMSprop(lr=0.01))
        x = rng.rand(n, 3, 2).astype('float32')
        y = rng.rand(n, 1).astype('float32')
    elif name in ('vae_fixed', 'vae_symbolic'):
        # Keras's examples/variational_autoencoder.py in small: the sampling
        # Lambda draws noise of the batch's shape, written with the fixed
        # batch size or with K.shape; the loss reads z_mean and z_log_var.
        import keras.backend as K
        from keras import objectives
        from keras.layers import Lambda
        fixed = name == 'vae_fixed'
        inputs = Input(batch_shape=(n, 8)) if fixed else Input(shape=(8,))
        hidden = Dense(6, activation='relu')(inputs)
        z_mean, z_log_var = Dense(2)(hidden), Dense(2)(hidden)

        def sampling(args):
            mean, log_var = args
            shape = (n, 2) if fixed else (K.shape(mean)[0], 2)
            return mean + K.exp(log_var / 2) * K.random_normal(shape=shape, mean=0., std=1.)

        z = Lambda(sampling, output_shape=(2,))([z_mean, z_log_var])
        decoded = Dense(8, activation='sigmoid')(Dense(6, activation='relu')(z))

        def vae_loss(x_true, x_decoded):
            kl = -0.5 * K.sum(1 + z_log_var - K.square(z_mean) - K.exp(z_log_var), axis=-1)
            return 8 * objectives.binary_crossentropy(x_true, x_decoded) + kl

        model = Model(inputs, decoded)
        model.compile(optimizer=RMSprop(lr=0.01), loss=vae_loss)
        x = rng.rand(n, 8).astype('float32')
        y = x
    elif name == 'zoo':
        # Keras layers whose graphs regroup the rows and put them back:
        # UpSampling (T.repeat: an alloc), LocallyConnected (reshapes that
        # move the rows, batch_dot; a shape only the run can check),
        # TimeDistributed, Flatten, a bidirectional GRU with dropout on its
        # recurrent weights (a scan, and random masks of the batch's shape),
        # GlobalAveragePooling (T.mean divides by a float shape).
        from keras.layers import (AveragePooling1D, Bidirectional, Convolution1D,
                                  GlobalAveragePooling1D, LocallyConnected1D, Reshape,
                                  TimeDistributed, UpSampling1D)
        tokens = Input(shape=(6,), dtype='int32')
        seq = Embedding(10, 4, input_length=6)(tokens)
        seq = UpSampling1D(2)(Convolution1D(3, 3, activation='tanh')(seq))
        seq = LocallyConnected1D(4, 3, activation='tanh')(seq)
        seq = TimeDistributed(Dense(3, activation='relu'))(AveragePooling1D(2)(seq))
        recurrent = Bidirectional(GRU(3, dropout_U=0.3, dropout_W=0.2))(seq)
        pooled = GlobalAveragePooling1D()(seq)
        flat = Flatten()(Reshape((3, 1))(pooled))
        out = Dense(3, activation='softmax')(merge([recurrent, flat], mode='concat'))
        model = Model(tokens, out)
        model.compile(loss='categorical_crossentropy', optimizer=Adam(lr=0.01))
        x = rng.randint(0, 10, (n, 6)).astype('int32')
        y = np.eye(3)[rng.randint(0, 3, n)].astype('float32')
    elif name == 'siamese':
        # Keras's examples/mnist_siamese_graph.py in small: one network
        # applied to both inputs, a Lambda of their Euclidean distance
        # (K.sqrt, K.maximum, K.epsilon), the contrastive loss.
        import keras.backend as K
        from keras.layers import Lambda
        base = Sequential([Dense(8, input_dim=6, activation='relu'), Dropout(0.1),
                           Dense(8, activation='relu')])
        a, b = Input(shape=(6,)), Input(shape=(6,))

        def distance(vectors):
            u, v = vectors
            return K.sqrt(K.maximum(K.sum(K.square(u - v), axis=1, keepdims=True),
                                    K.epsilon()))

        def contrastive_loss(y_true, y_pred):
            return K.mean(y_true * K.square(y_pred)
                          + (1 - y_true) * K.square(K.maximum(1 - y_pred, 0)))

        model = Model([a, b], Lambda(distance, output_shape=lambda s: (s[0][0], 1))(
            [base(a), base(b)]))
        # (The example's RMSprop would scale a dead unit's float noise to
        # whole steps, as Adam does in cnn_bn: SGD compares the numbers.)
        model.compile(loss=contrastive_loss, optimizer=SGD(lr=0.05, momentum=0.9))
        x = [rng.rand(n, 6).astype('float32'), rng.rand(n, 6).astype('float32')]
        y = rng.randint(0, 2, (n, 1)).astype('float32')
    elif name == 'rows_meet':
        # Lambdas whose ops make the batch's rows meet, side by side: each
        # is computed over the whole batch, as one device computes it.
        import keras.backend as K
        import theano
        import theano.tensor as T
        from keras.layers import Lambda

        def centre(h):   # a reduction over the rows
            return h - K.mean(h, axis=0, keepdims=True)

        def whiten(h):   # statistics fed back to each row
            return (h - K.mean(h, axis=0)) / K.sqrt(K.var(h, axis=0) + 0.5)

        def similarity(h):   # every row scored against every other
            return K.dot(K.softmax(K.dot(h, K.transpose(h))), h)

        def counted(h):   # K.shape(x)[0] as a number
            return h * K.cast(K.shape(h)[0], 'float32') / 10

        def regrouped(h):   # each row as two, then two as one again
            return K.reshape(K.reshape(h, (-1, 3)), (-1, 6))

        def one_hot(h):   # K.one_hot of each row's argmax (no gradient)
            return K.one_hot(K.argmax(h, axis=1), 6) + h

        def looped(h):   # a loop over the rows
            return theano.scan(lambda row, total: total + row, sequences=h,
                               outputs_info=T.zeros_like(h[0]))[0]

        def rescaled(h):   # dropout rescaled by its own mask's mean (a draw of the batch)
            mask = K.random_binomial(K.shape(h), p=0.5)
            return h * mask / (K.mean(mask) + 0.1)

        lambdas = [centre, whiten, similarity, counted, regrouped, one_hot, looped, rescaled,
                   lambda h: h[::-1], lambda h: h[0:], lambda h: h * K.max(h, axis=0),
                   lambda h: T.extra_ops.fill_diagonal(h, 0.)]
        names = ['centre', 'whiten', 'similarity', 'counted', 'regrouped', 'one_hot', 'looped',
                 'rescaled', 'reversed', 'head', 'row_max', 'no_rule']
        inputs = Input(shape=(4,))
        hidden = Dense(6, activation='tanh')(inputs)
        met = [Lambda(f, output_shape=lambda s: s, name=n)(hidden)
               for f, n in zip(lambdas, names)]
        out = Dense(3, activation='softmax')(merge(met, mode='concat'))
        model = Model(inputs, out)
        model.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.1))
        x = rng.rand(n, 4).astype('float32')
        y = np.eye(3)[rng.randint(0, 3, n)].astype('float32')
    else:
        raise SystemExit('unknown model %r' % name)
    set_random_weights(model, rng, 0.3)
    return model, x, y, kwargs


HEAVY = ('Dot22', 'Gemm', 'Corr', 'Pool', 'Softmax', 'Scan', 'Gemv', 'Dot')


def heavy_op_contexts(theano_function):
    """{context name: number of heavy ops} of a compiled Theano function."""
    counts = {}
    for node in theano_function.maker.fgraph.toposort():
        if any(h in type(node.op).__name__ for h in HEAVY):
            context = getattr(node.outputs[0].type, 'context_name', 'host')
            counts[str(context)] = counts.get(str(context), 0) + 1
    return counts


def split_weights(model):
    """(for each trainable weight, its first axis's rows and the rows of each
    of its blocks, none where it is whole: [[rows, block rows...]] padded
    with -1; the number of Theano's own copies between contexts (GpuToGpu,
    which keeps no placement) of a weight's value in the train function);
    None on another backend."""
    if os.environ.get('KERAS_BACKEND') != 'theano_multigpu':
        return None
    model = getattr(model, 'model', model)
    rows = [[w.get_value(borrow=True).shape[0]]
            + [b.stop - b.start for b in (getattr(w, 'blocks', None) or [])]
            for w in model.trainable_weights if w.ndim >= 1]
    width = max(len(r) for r in rows)
    copies = [node for node in model.train_function.function.maker.fgraph.toposort()
              if type(node.op).__name__ == 'GpuToGpu' and _shared_source(node.inputs[0])]
    return np.array([r + [-1] * (width - len(r)) for r in rows]), len(copies)


def _shared_source(variable):
    """Whether ``variable`` is a shared variable's value, made contiguous
    or not."""
    from theano.compile import SharedVariable
    if variable.owner is not None and type(variable.owner.op).__name__ == 'GpuContiguous':
        variable = variable.owner.inputs[0]
    return isinstance(variable, SharedVariable)


def misplaced_heavy_ops(model):
    """Heavy ops of the compiled functions that the shim's placement check
    flags, as strings; None on another backend."""
    if os.environ.get('KERAS_BACKEND') != 'theano_multigpu':
        return None
    from theano_multigpu.config import mesh
    from theano_multigpu.graph import placement
    model = getattr(model, 'model', model)
    flagged = []
    for attribute in ('train_function', 'test_function', 'predict_function'):
        function = getattr(model, attribute, None)
        if function is not None:
            flagged += ['%s: %s on %s, expected %s' % ((attribute,) + item) for item in
                        placement.misplaced(function.function.maker.fgraph, mesh.current())]
    return np.array(flagged, dtype=str)


def layer_placement(model):
    """(plan context of each layer, placement errors) under the shim's
    layer-wise mode, else None: each weight's and each optimizer state's
    copy must sit on its layer's context and be what the compiled train
    function reads."""
    if os.environ.get('KERAS_BACKEND') != 'theano_multigpu':
        return None
    from theano_multigpu.config import mesh
    from theano_multigpu.graph import plan
    if mesh.current().mode != 'layer':
        return None
    master = mesh.current().master
    model = getattr(model, 'model', model)
    read = set(id(item.variable) for item in model.train_function.function.maker.inputs)

    def where(variable):
        return variable.placed.type.context_name or master

    contexts, errors = [], []
    for layer in model.layers:
        context = plan.layer_context(layer)
        if context is None:
            continue   # an InputLayer: no ops of its own
        contexts.append(context)
        for weight in layer.trainable_weights + layer.non_trainable_weights:
            if where(weight) != context:
                errors.append('%s of %s on %s' % (weight, layer.name, where(weight)))
            if id(weight.placed) not in read:
                errors.append('%s of %s not read by the train function' % (weight, layer.name))
    params = model._collected_trainable_weights
    states = [s for s in model.optimizer.weights if s.ndim >= 1]
    for k, state in enumerate(states):   # Keras's blocks: one state per param
        if where(state) != where(params[k % len(params)]):
            errors.append('state %d on %s, its weight on %s'
                          % (k, where(state), where(params[k % len(params)])))
    return np.array(contexts, dtype=str), np.array(errors, dtype=str)


def resident_and_planned(model):
    """[[resident bytes, planned bytes] per context] of the compiled train
    function under the shim's layer-wise or sharded batch-wise mode (what
    its shared variables hold on each context, and what the plans counted
    there for them), else None."""
    if os.environ.get('KERAS_BACKEND') != 'theano_multigpu':
        return None
    from theano_multigpu.config import mesh
    from theano_multigpu.graph import plan, report
    current = mesh.current()
    if current.mode != 'layer' and not current.sharded:
        return None
    train = getattr(model, 'model', model).train_function.function
    resident = report.resident_bytes(train, current)
    planned = plan.planned_bytes(current, [item.variable for item in train.maker.inputs])
    return np.array([[resident.get(name, 0), planned[name]] for name in current.names])


def mpi_collectives(theano_function):
    """Class names of the MPI ops in a compiled function, in order."""
    return np.array([type(node.op).__name__ for node in theano_function.maker.fgraph.toposort()
                     if type(node.op).__name__ in ('AllGatherRows', 'AllReduceSum')], dtype=str)


def main():
    rank = os.environ.get('OMPI_COMM_WORLD_RANK', os.environ.get('PMI_RANK', '0'))
    out, steps = sys.argv[1].replace('{rank}', rank), int(sys.argv[2])
    results = {}
    for name in sys.argv[4:]:
        model_name, _, rows = name.partition('@')
        rng = np.random.RandomState(1234)
        np.random.seed(1234)   # Keras seeds its dropout generators from numpy's
        batch = int(rows or sys.argv[3])
        model, x, y, kwargs = build(model_name, rng, batch)
        losses = []
        for step in range(steps):
            losses.append(np.hstack(np.atleast_1d(model.train_on_batch(x, y, **kwargs))))
            if step == 0:
                for i, w in enumerate(model.get_weights()):
                    results['%s/first/w%d' % (name, i)] = w
        for i, w in enumerate(model.get_weights()):
            results['%s/w%d' % (name, i)] = w
        results[name + '/loss'] = np.array(losses)
        if model_name.startswith('stateful'):   # the states the steps carried, then none
            results[name + '/states'] = np.hstack([s.get_value() for layer in model.layers
                                                   for s in getattr(layer, 'states', [])])
            model.reset_states()
        pred = model.predict(x, batch_size=batch)
        if isinstance(pred, list):
            pred = np.hstack([p.reshape(len(p), -1) for p in pred])
        results[name + '/pred'] = pred
        results[name + '/eval'] = np.hstack(np.atleast_1d(model.evaluate(x, y, batch_size=batch, verbose=0)))
        train = getattr(model, 'model', model).train_function.function
        contexts = heavy_op_contexts(train)
        results[name + '/contexts'] = np.array(sorted(contexts))
        flagged = misplaced_heavy_ops(model)
        if flagged is not None:
            results[name + '/misplaced'] = flagged
        if 'OMPI_COMM_WORLD_RANK' in os.environ or 'PMI_RANK' in os.environ:
            results[name + '/collectives'] = mpi_collectives(train)
        placement = layer_placement(model)
        if placement is not None:
            results[name + '/layer_contexts'], results[name + '/placement_errors'] = placement
        split = split_weights(model)
        if split is not None:
            results[name + '/split'], results[name + '/theano_copies'] = split
        memory = resident_and_planned(model)
        if memory is not None:
            results[name + '/memory'] = memory
        print(name, 'heavy ops per context:', contexts, 'misplaced:', flagged, flush=True)
    np.savez(out, **results)


if __name__ == '__main__':
    main()
