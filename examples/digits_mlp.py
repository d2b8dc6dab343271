"""An unchanged Keras 1.2.2 script: an MLP on scikit-learn's 8x8 digits.

Run it on any backend; theano_multigpu needs no change here:
    KERAS_BACKEND=theano_multigpu python examples/digits_mlp.py
"""
from __future__ import print_function

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

np.random.seed(1337)

from keras.models import Sequential  # noqa: E402
from keras.layers import Dense, Dropout  # noqa: E402
from keras.utils import np_utils  # noqa: E402

digits = load_digits()
X = (digits.data / 16.0).astype('float32')
y = np_utils.to_categorical(digits.target, 10)
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)

model = Sequential()
model.add(Dense(128, input_dim=64, activation='relu'))
model.add(Dropout(0.1))
model.add(Dense(64, activation='relu'))
model.add(Dense(10, activation='softmax'))
model.compile(loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy'])
model.fit(X_train, y_train, batch_size=64, nb_epoch=30, verbose=0,
          validation_data=(X_test, y_test))
loss, accuracy = model.evaluate(X_test, y_test, verbose=0)
print('test accuracy: %.4f' % accuracy)
