"""Under MPI, rank 0 alone prints progress and writes files, and every
rank returns from a save once rank 0's file is complete.

Every rank runs the same script and, the loss and metrics being global,
each would print the same progress bar and write the same files at the same
paths.  On every other rank Keras's progress bar is quiet, and
``save_weights``, ``model.save`` (and so ModelCheckpoint) and CSVLogger
write nothing (``multigpu.save_on=all``: every rank writes, for disks of
their own): they wait for rank 0 to finish writing, so that a load right
after a save reads a complete file on every rank.  A rank that waits
longer than ``multigpu.mpi_timeout`` (the others never made the call)
stops every rank with an error naming the call.
"""
import threading

from .. import importhook
from ..patch_targets import Attributes, CodeNames, Parameters, replace, wrap

__all__ = ['install']

PROGRESS_BAR = Attributes('keras.callbacks.ProgbarLogger', ('on_train_begin',),
                          'wrapped: quiet on ranks other than 0')
WEIGHT_FILES = Attributes('keras.engine.topology.Container', ('save_weights',),
                          'wrapped: written by rank 0, every rank waits for it')
# Keras >= 1.0.3.
MODEL_FILES = Parameters('keras.models.save_model', ('model', 'filepath', 'overwrite'),
                         'wrapped: written by rank 0, every rank waits for it')
# Keras >= 1.1: the log is opened when training begins, written at each
# epoch's end and closed at the end.
CSV_LOG_OPENED = CodeNames('keras.callbacks.CSVLogger.on_train_begin', ('open',),
                           'replaced where this rank does not write: it opens the log')
CSV_LOG_WRITTEN = Attributes('keras.callbacks.CSVLogger', ('on_epoch_end', 'on_train_end'),
                             'wrapped: written by rank 0, every rank waits for it')

_inside_a_save = threading.local()


def _wait_for_rank_zero(call):
    from ..mpi import world
    world.wait_for_every_rank(call, why=' (the shim writes the file once, on rank 0, and '
                              'returns on every rank once it is complete)')


def _saved_by_rank_zero(save, call, writes):
    """``save`` (or a CSVLogger method) where this rank ``writes``; every
    rank returns once every rank's has returned.  A save made inside another (none in Keras 1.x)
    waits with the outer one."""
    def save_on_rank_zero(*args, **kwargs):
        if getattr(_inside_a_save, 'call', None):
            return save(*args, **kwargs) if writes else None
        _inside_a_save.call = call
        try:
            result = save(*args, **kwargs) if writes else None
        finally:
            _inside_a_save.call = None
        _wait_for_rank_zero(call)
        return result
    save_on_rank_zero.__name__ = getattr(save, '__name__', call)
    save_on_rank_zero.__doc__ = getattr(save, '__doc__', None)
    return save_on_rank_zero


def _rank_zero_prints_and_logs(rank, writes):
    def install(callbacks):
        if rank != 0:
            wrap(PROGRESS_BAR, callbacks.ProgbarLogger, 'on_train_begin', _quiet)
        csv_logger = getattr(callbacks, 'CSVLogger', None)
        if csv_logger is not None:
            if not writes:
                replace(CSV_LOG_OPENED, csv_logger, 'on_train_begin', _nothing)
            for name in CSV_LOG_WRITTEN.names:
                wrap(CSV_LOG_WRITTEN, csv_logger, name,
                     lambda write, name=name: _saved_by_rank_zero(
                         write, 'CSVLogger.%s' % name, writes))
    return install


def _quiet(train_begin):
    """ProgbarLogger's on_train_begin, then silence."""
    def on_train_begin(self, logs={}):
        train_begin(self, logs)
        self.verbose = 0
    return on_train_begin


def _rank_zero_writes_weights(writes):
    def install(topology):
        wrap(WEIGHT_FILES, topology.Container, 'save_weights',
             lambda save: _saved_by_rank_zero(save, 'save_weights', writes))
    return install


def _rank_zero_writes_models(writes):
    def install(models):
        if hasattr(models, 'save_model'):
            wrap(MODEL_FILES, models, 'save_model',
                 lambda save: _saved_by_rank_zero(save, 'model.save', writes))
    return install


def _nothing(*args, **kwargs):
    """What a rank other than 0 does instead of opening rank 0's log."""
    return None


def install(rank):
    """On this rank (its number ``rank``): progress on rank 0 alone, files
    written by rank 0 (every rank with ``multigpu.save_on=all``), every rank
    waiting for them."""
    import theano
    writes = rank == 0 or theano.config.multigpu.save_on == 'all'
    importhook.after_import('keras.callbacks', _rank_zero_prints_and_logs(rank, writes))
    importhook.after_import('keras.engine.topology', _rank_zero_writes_weights(writes))
    importhook.after_import('keras.models', _rank_zero_writes_models(writes))
