"""Start-up: turning the shim on in a process (``turn_on``), and the
``info`` command.

``turn_on.activate`` wires every layer in through import hooks: the
compatibility patches, the settings (inside ``import theano``), the
contexts (inside ``import theano.gpuarray``) and the Keras adapter (inside
``import keras.backend``), so that user code runs unchanged.

May import: every other layer.
"""
