"""Child script: ``fit`` an MLP on scikit-learn's 8x8 digits with the four
callbacks that read or change the model, then save, set and reload weights.

    python fit_digits.py train OUT_DIR    # writes OUT_DIR/results.npz and .h5 files
    python fit_digits.py load OUT_DIR     # plain Keras: loads them, writes loaded.npz

``train`` uses 1000 training rows at batch 32, so the last batch of each
epoch is short (8 rows).  Runs unchanged on any backend.
"""
import os
import sys

import numpy as np

BATCH = 32


def digits():
    from sklearn.datasets import load_digits
    data = load_digits()
    x = (data.data / 16.0).astype('float32')
    y = np.eye(10)[data.target].astype('float32')
    return (x[:1000], y[:1000]), (x[1000:1200], y[1000:1200]), (x[1200:], y[1200:])


def build():
    from keras.models import Sequential
    from keras.layers import Dense
    from keras.optimizers import SGD
    model = Sequential([Dense(32, input_dim=64, activation='relu'),
                        Dense(10, activation='softmax')])
    model.compile(loss='categorical_crossentropy', metrics=['accuracy'],
                  optimizer=SGD(lr=0.1, momentum=0.9))
    rng = np.random.RandomState(7)
    model.set_weights([(rng.randn(*w.shape) * 0.2).astype('float32')
                       for w in model.get_weights()])
    return model


def train(out):
    from keras import backend as K
    from keras.callbacks import (EarlyStopping, LearningRateScheduler, ModelCheckpoint,
                                 ReduceLROnPlateau)
    (x, y), (x_val, y_val), (x_test, y_test) = digits()
    model = build()
    checkpoint = os.path.join(out, 'checkpoint.h5')
    callbacks = [ModelCheckpoint(checkpoint, monitor='val_loss', save_best_only=True),
                 EarlyStopping(monitor='val_acc', patience=0, mode='max'),
                 LearningRateScheduler(lambda epoch: 0.1 / (1 + epoch)),
                 ReduceLROnPlateau(monitor='val_loss', factor=0.5, patience=0)]
    np.random.seed(3)   # Keras shuffles with numpy's generator
    history = model.fit(x, y, batch_size=BATCH, nb_epoch=6, verbose=0,
                        validation_data=(x_val, y_val), callbacks=callbacks)
    results = {'history/' + key: np.array(values) for key, values in history.history.items()}
    results['epochs'] = np.array(len(history.history['loss']))
    results['lr'] = np.array(K.get_value(model.optimizer.lr))
    results['pred'] = model.predict(x_test, batch_size=BATCH)
    results['eval'] = np.array(model.evaluate(x_test, y_test, batch_size=BATCH, verbose=0))
    hidden = K.function([model.layers[0].input], [model.layers[0].output])
    results['hidden'] = hidden([x_test])[0]
    results['kernel_eval'] = K.eval(model.layers[0].W)
    model.save(os.path.join(out, 'model.h5'))
    model.save_weights(os.path.join(out, 'weights.h5'))
    trained = model.get_weights()

    # set_weights and K.set_value reach the function at once.
    model.set_weights([w * 0.5 for w in trained])
    results['pred_half'] = model.predict(x_test, batch_size=BATCH)
    kernel = model.layers[0].W
    K.set_value(kernel, np.zeros_like(K.get_value(kernel)))
    results['pred_zero_kernel'] = model.predict(x_test, batch_size=BATCH)
    model.load_weights(checkpoint)
    results['pred_checkpoint'] = model.predict(x_test, batch_size=BATCH)
    model.load_weights(os.path.join(out, 'weights.h5'))
    results['pred_reloaded'] = model.predict(x_test, batch_size=BATCH)
    np.savez(os.path.join(out, 'results.npz'), **results)


def load(out):
    from keras.models import load_model
    (_, _), (_, _), (x_test, _) = digits()
    model = load_model(os.path.join(out, 'model.h5'))
    fresh = build()
    fresh.load_weights(os.path.join(out, 'weights.h5'))
    np.savez(os.path.join(out, 'loaded.npz'),
             pred_model=model.predict(x_test, batch_size=BATCH),
             pred_weights=fresh.predict(x_test, batch_size=BATCH))


if __name__ == '__main__':
    {'train': train, 'load': load}[sys.argv[1]](sys.argv[2])
