"""Under MPI, rank 0 alone prints progress and writes files.

Every rank runs the same script and, the loss and metrics being global,
each would print the same progress bar and write the same files at the same
paths.  On every other rank, Keras's progress bar, ``save_weights``,
``model.save`` (and so ModelCheckpoint) and CSVLogger do nothing.
"""
from .. import importhook
from ..patch_targets import Attributes

__all__ = ['install']

PROGRESS_BAR = Attributes('keras.callbacks.ProgbarLogger', ('on_train_begin',),
                          'wrapped: quiet on ranks other than 0')
WEIGHT_FILES = Attributes('keras.engine.topology.Container', ('save_weights',),
                          'replaced: writes nothing on ranks other than 0')


def _quiet_progbar_logger(callbacks):
    logger = PROGRESS_BAR.check(callbacks.ProgbarLogger)
    train_begin = logger.on_train_begin

    def on_train_begin(self, logs={}):
        train_begin(self, logs)
        self.verbose = 0
    logger.on_train_begin = on_train_begin
    csv_logger = getattr(callbacks, 'CSVLogger', None)   # Keras >= 1.1
    if csv_logger is not None:
        for name in ('on_train_begin', 'on_epoch_end', 'on_train_end'):
            setattr(csv_logger, name, _nothing)


def _no_weight_files(topology):
    WEIGHT_FILES.check(topology.Container).save_weights = _nothing


def _no_model_files(models):
    if hasattr(models, 'save_model'):   # Keras >= 1.0.3
        models.save_model = _nothing


def _nothing(*args, **kwargs):
    """What a rank other than 0 does instead of printing or writing."""
    return None


def install():
    """On this rank, silence Keras's progress output and file writes."""
    importhook.after_import('keras.callbacks', _quiet_progbar_logger)
    importhook.after_import('keras.engine.topology', _no_weight_files)
    importhook.after_import('keras.models', _no_model_files)
