"""Several processes: `mpirun -np 2` against one process at the same global
batch, on the CPU and on pocl contexts; rank 0 alone prints and writes;
faults end every rank; mpi4py stays out of plain runs.

Open MPI from Debian runs the ranks on this machine (loopback, shared
memory); the children are tests/children/train_models.py and short scripts.
"""
import os
import re
import time

import numpy as np
import pytest

from conftest import ONE, TWO, needs_mpirun, needs_pocl, run_python, train_models

pytestmark = needs_mpirun

STEPS, BATCH = 5, 10
RTOL, ATOL = 1e-4, 1e-6
# mlp: class weights; deep_mlp: an l2 regulariser (read by every rank);
# @9: 4 and 5 rows per rank; @1: rank 0 gets no row at all; vae_symbolic:
# each rank takes its rows of one draw; stateful_lstm: each rank carries
# its rows of the states; cnn_bn: statistics of the whole batch;
# rows_meet@3: ops where the rows meet, over the ranks' 1 and 2 rows;
# mlp_l2: an l2 regulariser 1000 times the data term.
CPU_MODELS = ['mlp', 'mlp@9', 'mlp@1', 'deep_mlp', 'mlp_l2', 'cnn', 'cnn_bn', 'vae_symbolic',
              'stateful_lstm', 'rows_meet@3']
# Every rank its own leader: gradients summed by MPI Allreduce alone.
ALLREDUCE_ONLY, ALLREDUCE_ONLY_MODELS = 'multigpu.mpi_shared_memory=False', ['mlp@9', 'cnn']
# Blocks of two ranks as machines of their own: each sums in shared memory,
# its leader with the other machines' by MPI Allreduce.
MACHINES_OF_TWO = 'multigpu.mpi_ranks_per_machine=2'
MACHINES_MODELS = ['mlp@9', 'mlp_l2', 'cnn_bn']


def assert_same_training(one, many, name):
    keys = sorted(k for k in one if k.startswith(name + '/') and one[k].dtype.kind == 'f')
    assert any('/w' in k for k in keys)
    for key in keys:
        np.testing.assert_allclose(many[key], one[key], rtol=RTOL, atol=ATOL, err_msg=key)


@pytest.fixture(scope='module')
def cpu_runs(tmp_path_factory):
    """One process, and two ranks, on the CPU (and two ranks summing with
    MPI Allreduce alone, and four ranks as two machines of two)."""
    return train_models(tmp_path_factory.mktemp('mpi_cpu'),
                        {1: '', 2: '', 'mpi': ALLREDUCE_ONLY, 'machines': MACHINES_OF_TWO},
                        {1: CPU_MODELS, 2: CPU_MODELS, 'mpi': ALLREDUCE_ONLY_MODELS,
                         'machines': MACHINES_MODELS},
                        STEPS, BATCH, ranks={2: 2, 'mpi': 2, 'machines': 4})


@pytest.mark.parametrize('name', CPU_MODELS)
def test_two_ranks_train_as_one_process(cpu_runs, name):
    assert_same_training(cpu_runs[1], cpu_runs[2], name)


@pytest.mark.parametrize('name', ALLREDUCE_ONLY_MODELS)
def test_two_ranks_summing_with_mpi_allreduce_alone_train_as_one_process(cpu_runs, name):
    assert_same_training(cpu_runs[1], cpu_runs['mpi'], name)


@pytest.mark.parametrize('name', MACHINES_MODELS)
def test_four_ranks_as_two_machines_of_two_train_as_one_process(cpu_runs, name):
    """Each machine sums its two ranks' gradients in shared memory, its
    leader sums the machines' by MPI Allreduce: weights, losses and
    predictions of one process, the same on every rank."""
    assert_same_training(cpu_runs[1], cpu_runs['machines'], name)
    rank0 = cpu_runs['machines']
    for rank in (1, 2, 3):
        other = cpu_runs[('machines', rank)]
        for key in sorted(k for k in rank0 if k.startswith(name + '/')
                          and rank0[k].dtype.kind == 'f'):
            np.testing.assert_array_equal(other[key], rank0[key], err_msg=(rank, key))


@pytest.mark.parametrize('name', CPU_MODELS)
def test_ranks_hold_the_same_weights(cpu_runs, name):
    """Rank 1 ends where rank 0 does, batch normalisation included (its
    running statistics come from the whole batch)."""
    rank0, rank1 = cpu_runs[2], cpu_runs[(2, 1)]
    for key in sorted(k for k in rank0 if k.startswith(name + '/') and rank0[k].dtype.kind == 'f'):
        np.testing.assert_array_equal(rank1[key], rank0[key], err_msg=key)


def test_one_gather_and_one_fused_allreduce_per_step(cpu_runs):
    """All gradients go through one Allreduce (never one per tensor), after
    the one Allgatherv of the layer outputs the loss reads."""
    for name in ('mlp', 'deep_mlp', 'cnn'):
        assert list(cpu_runs[2][name + '/collectives']) == ['AllGatherRows', 'AllReduceSum']


@needs_pocl
def test_two_ranks_with_two_contexts_each_train_as_one_context(tmp_path_factory):
    """Ranks compose with contexts: each rank computes its share of the
    batch batch-wise over its two pocl contexts, or layer-wise on them
    (the plan alike on every rank), and the ranks join their rows and sum
    their gradients: one model list both ways, equal to one context.  At 1
    row rank 0 has none; BatchNormalization and the ops where the rows meet
    see the whole batch (at 9 rows, over each rank's two contexts).  With
    shares of 1 and 2 rows (rows_meet@3, batch-wise) each rank computes on
    one context: the ranks' graphs, and so their collectives, alike."""
    models = ['mlp@9', 'mlp@1', 'cnn_bn1', 'rows_meet@9']
    # Batch-wise, every weight with a row per context is split (shard_split=0).
    flags = {1: ONE, 'batch': TWO + ',multigpu.shard_split=0',
             'layer': TWO + ',multigpu.mode=layer'}
    runs = train_models(tmp_path_factory.mktemp('mpi_pocl'), flags,
                        {1: models + ['rows_meet@3'], 'batch': models + ['rows_meet@3'],
                         'layer': models}, STEPS, BATCH, ranks={'batch': 2, 'layer': 2})
    assert_same_training(runs[1], runs['batch'], 'rows_meet@3')
    for mode in ('batch', 'layer'):
        for name in models:
            assert_same_training(runs[1], runs[mode], name)
            # The master, dev0, is Theano's default context: None in the graph.
            assert {'None', 'dev1'} <= set(runs[mode][name + '/contexts']), (mode, name)
            assert len(runs[mode][name + '/misplaced']) == 0, (mode, name)
    assert list(runs['layer']['mlp@9/collectives']) == ['AllGatherRows', 'AllReduceSum']


FUSED_SUM_SCRIPT = """
import numpy as np
from theano_multigpu.mpi import transport as mpi
comm, rank, size = mpi.world()
rng = np.random.RandomState(rank)
# Whole numbers: their sums are exact in any order.  Each call's sums are
# known before the calls, which then run back to back, twice over.
calls = [[np.asarray(rng.randint(-100, 100, shape), dtype) for shape in shapes]
         for shapes, dtype in [([(3, 5), (7,), ()], 'float32'), ([(1000, 300)], 'float32'),
                               ([(11, 2)], 'float64'), ([(2,)], 'float32')] * 2]
expected = [[np.stack(comm.allgather(a)).sum(axis=0) for a in arrays] for arrays in calls]
for k, (arrays, want) in enumerate(zip(calls, expected)):
    sums = mpi.fused_sum().sum(arrays)
    for total, w in zip(sums, want):
        assert total.shape == w.shape and total.dtype == w.dtype, (total, w)
        assert np.array_equal(total, w), (
            'rank %d, call %d: the sums differ from the true sums by up to %g'
            % (rank, k, abs(total - w).max()))
finished = comm.gather(rank)   # one line, from rank 0: ranks' prints interleave
if rank == 0:
    print('ranks ok', finished, 'machines', mpi.fused_sum().machines, flush=True)
"""


@pytest.mark.parametrize('flags,ranks,machines', [
    ('', 3, 1), (ALLREDUCE_ONLY, 3, 3), (MACHINES_OF_TWO, 4, 2), (MACHINES_OF_TWO, 3, 2)])
def test_fused_sum_gives_every_rank_the_sum(home, flags, ranks, machines):
    """Arrays of several shapes and dtypes in one buffer (which grows),
    summed in shared memory, by MPI Allreduce, or both (ranks as machines
    of two, the last of one): every rank gets the sums, call after call
    (every rank of a machine passes the same barriers, leader or not)."""
    result = run_python(home, FUSED_SUM_SCRIPT, flags=flags, ranks=ranks, timeout=120)
    assert 'ranks ok %s machines %d' % (list(range(ranks)), machines) \
        in result.stdout.splitlines(), result.stdout


def test_gradients_through_gathers_of_which_one_reads_another(home):
    """The loss reads a gather's output (a statistic's, which each rank
    uses for its own rows) both directly and through another gather (the
    loss's): its gradient from the loss is added to what comes down through
    the other gather, not fixed by it, and counted once, not once per rank.
    Two ranks, each with its rows of the batch: the gradients equal those of
    the graph without gathers over the whole batch."""
    result = run_python(home, """
        import numpy as np
        import theano
        from theano import tensor as T
        from theano_multigpu.graph.gradients import gradient_stand_ins
        from theano_multigpu.graph.rows import slice_bounds
        from theano_multigpu.mpi import data_parallel
        from theano_multigpu.mpi.world import world
        _, rank, size = world()
        x = T.matrix('x')
        W = theano.shared(np.random.RandomState(0).randn(4, 3).astype('float32'))
        V = theano.shared(np.random.RandomState(1).randn(3, 3).astype('float32'))

        def loss(x, gather, own):
            statistic = gather(T.tanh(T.dot(x, W)), False, 0)   # the whole batch's rows
            mine = own(statistic)   # each rank computes for its own rows of it
            joined = gather(T.tanh(T.dot(mine, V)) + mine, True, 1)
            return (joined ** 2).sum() + (3 * statistic).sum() + 0.1 * (W ** 2).sum()

        batch = np.random.RandomState(2).rand(5, 4).astype('float32')
        bounds = slice_bounds(len(batch), size)

        def gather(v, replicated, index):
            return data_parallel.all_gather_rows([v], [b - a for a, b in bounds], replicated,
                                                 index=index)[0]
        start, stop = bounds[rank]
        stand_ins = gradient_stand_ins(loss(x, gather, lambda v: v[start:stop]), [W, V])
        grads = data_parallel.data_parallel_gradients(stand_ins, {})
        got_w, got_v = theano.function([x], [grads[s] for s in stand_ins])(batch[start:stop])
        whole = T.matrix('whole')
        unchanged = loss(whole, lambda v, replicated, index: v, lambda v: v)
        want_w, want_v = theano.function([whole], theano.grad(unchanged, [W, V]))(batch)
        same = (np.allclose(got_w, want_w, rtol=1e-5, atol=1e-6),
                np.allclose(got_v, want_v, rtol=1e-5, atol=1e-6))
        print('rank', rank, 'same', *same, flush=True)
    """, ranks=2, timeout=300)
    lines = result.stdout.splitlines()
    assert 'rank 0 same True True' in lines and 'rank 1 same True True' in lines, \
        result.stdout[-2000:]


FIT_SCRIPT = """
import os, sys
import numpy as np
from keras.models import Sequential
from keras.layers import Dense
from keras.callbacks import ModelCheckpoint, CSVLogger
rank = os.environ['OMPI_COMM_WORLD_RANK']
rng = np.random.RandomState(0)
x = rng.rand(40, 8).astype('float32')
y = np.eye(3)[rng.randint(0, 3, 40)].astype('float32')
model = Sequential([Dense(16, input_dim=8, activation='relu'), Dense(3, activation='softmax')])
model.compile(loss='categorical_crossentropy', optimizer='sgd', metrics=['accuracy'])
history = model.fit(x, y, batch_size=10, nb_epoch=2, verbose=1, callbacks=[
    ModelCheckpoint('best_%s.h5' % rank), CSVLogger('log_%s.csv' % rank)])
model.save_weights('weights_%s.h5' % rank)
model.save('model_%s.h5' % rank)
# Right after the saves, every rank reads rank 0's files.
from keras.models import load_model
same = [all(np.array_equal(a, b) for a, b in zip(load_model(name).get_weights(),
                                                 model.get_weights()))
        for name in ('model_0.h5', 'best_0.h5')]
model.load_weights('weights_0.h5')
# A file per rank (the script's own writes happen on every rank): printed
# lines of ranks can interleave.
open('loss_%s.txt' % rank, 'w').write('%.6f %s %d' % (
    history.history['loss'][-1], same, len(open('log_0.csv').read().splitlines())))
"""


@pytest.mark.parametrize('ranks,save_on', [(2, '0'), (3, 'all')])
def test_rank_zero_alone_prints_progress_and_every_rank_reads_the_files_at_once(
        home, ranks, save_on):
    """Each rank asks for files named after itself: only rank 0's exist
    (with multigpu.save_on=all, every rank's), and one progress bar is
    printed, and one set of compile progress lines; right after the saves
    every rank loads rank 0's files, which are complete (the saves return
    once they are); every rank saw the same global loss."""
    result = run_python(home, FIT_SCRIPT, ranks=ranks, timeout=900,
                        flags='multigpu.save_on=%s,multigpu.progress=0' % save_on)
    written = sorted(f for f in os.listdir(str(home)) if f.endswith(('.h5', '.csv')))
    writers = range(ranks) if save_on == 'all' else [0]
    assert written == sorted('%s_%d.%s' % (name, rank, extension) for rank in writers
                             for name, extension in [('best', 'h5'), ('log', 'csv'),
                                                     ('model', 'h5'), ('weights', 'h5')])
    assert result.stdout.count('Epoch 1/2') == 1, result.stdout
    # Rank 0's lines alone: its train functions compiled (the model's, and
    # those of the two models load_model restores with their optimizer).
    assert result.stderr.count("Compiled Keras's train function") == 3, result.stderr
    seen = [open(str(home / ('loss_%d.txt' % rank))).read() for rank in range(ranks)]
    assert seen == [seen[0]] * ranks, seen
    assert seen[0].split()[1:] == ['[True,', 'True]', '3'], seen[0]  # header and 2 epochs


FAULT_SCRIPT = """
import os, signal, sys
import numpy as np
from keras.models import Sequential
from keras.layers import BatchNormalization, Dense
from keras.optimizers import SGD, Adam
rank = int(os.environ['OMPI_COMM_WORLD_RANK'])
fault = sys.argv[1]
if fault == 'ranks per machine' and rank == 1:
    import theano
    theano.config.multigpu.mpi_ranks_per_machine = '1'
width = 17 if fault == 'layer size' and rank == 1 else 16
optimizer = Adam() if fault == 'optimizer' and rank == 1 else SGD()
model = Sequential([Dense(width, input_dim=8, activation='relu'), BatchNormalization(),
                    Dense(3, activation='softmax')])
model.compile(loss='categorical_crossentropy', optimizer=optimizer)
x = np.ones((10, 8), 'float32'); y = np.eye(3)[np.arange(10) % 3].astype('float32')
model.train_on_batch(x, y)
model.test_on_batch(x, y)
import time
with open('fault_at_%d' % rank, 'w') as f:   # compiled and stepped: the faults start
    f.write('%.3f' % time.time())
if rank == 1 and fault == 'raise':
    raise ValueError('rank 1 gave up on purpose')
if rank == 1 and fault == 'kill':
    os.kill(os.getpid(), signal.SIGKILL)
if rank == 0 and fault == 'guarded save':
    model.save_weights('weights.h5')   # the other ranks go on training
if rank == 0 and fault == 'guarded predict':
    model.predict(x)                   # alone: the ranks agree before compiling it
if fault == 'other targets':        # in the test function (its statistics
    model.test_on_batch(x, y[::-1].copy() if rank == 2 else y)   # are not gathered)
if rank == 1 and fault == 'other inputs':
    x = 2 * x
if rank == 1 and fault == 'fewer rows':
    x, y = x[:8], y[:8]
for step in range(100000):   # rank 0 waits in the collectives for rank 1
    model.train_on_batch(x, y)
"""
_compiled_faults = []
# A rank killed while the ranks sum as machines of one; three ranks as
# machines of two and one.
FAULT_FLAGS = {'fewer rows': ',multigpu.mpi_check_inputs=False',
               'kill': ',multigpu.mpi_ranks_per_machine=1',
               'guarded predict': ',' + MACHINES_OF_TWO, 'other targets': ',' + MACHINES_OF_TWO}


@pytest.mark.parametrize('fault,ranks,expected', [
    ('raise', 2, 'rank 1 gave up on purpose'),
    ('kill', 2, 'signal 9'),
    ('layer size', 2, 'rank 1 differs from rank 0'),
    ('optimizer', 2, 'rank 1 differs from rank 0'),
    ('ranks per machine', 2, r"rank 1 differs from rank 0 in Keras's train function: the "
                             r"settings is .*mpi_ranks_per_machine 0.* on rank 0 and "
                             r".*mpi_ranks_per_machine 1.* there"),
    # Rank 0 waits in the save, the others in the training step.
    ('guarded save', 2, r"every MPI rank must make the same Keras calls, but rank [01] of 2 "
                        r"waited 3 s \(multigpu.mpi_timeout\) in (save_weights|Keras's train "
                        r"function) for ranks that did not call it"),
    ('guarded predict', 3, r"every MPI rank must make the same Keras calls, but rank [012] of 3 "
                           r"waited 3 s \(multigpu.mpi_timeout\) in Keras's (predict|train) "
                           r"function"),
    ('other inputs', 2, r"every MPI rank must be handed the same batch, but rank 1 of 2 was "
                        r"handed another dense_input_1 than rank 0 in Keras's train function"),
    ('other targets', 3, r"every MPI rank must be handed the same batch, but rank 2 of 3 was "
                         r"handed another dense_2_target than the other ranks in Keras's test "
                         r"function"),
    # With the inputs' check off: rank 1's parts of the gathers are smaller
    # than rank 0 expects, and their headers say why.
    ('fewer rows', 2, r"every MPI rank must (be handed the same batch, but rank 1 of 2 was "
                      r"handed a batch of another size than rank 0 in Keras's train function|"
                      r"make the same Keras calls with batches of the same size)"),
])
def test_a_failing_rank_ends_every_rank_within_a_minute(home, fault, ranks, expected):
    """Every rank exits non-zero with the fault's error: a rank that raises or
    dies, models or settings that differ, a Keras call made on one rank
    alone (the others wait multigpu.mpi_timeout), a rank handed other
    inputs, other targets (in the test function of a model with batch normalisation,
    whose statistics it does not gather) or fewer rows (with the inputs'
    check off)."""
    script = home / 'fault.py'
    script.write_text(FAULT_SCRIPT)
    timed = fault not in ('layer size', 'optimizer', 'ranks per machine')
    flags = 'multigpu.mpi_timeout=3' + FAULT_FLAGS.get(fault, '')
    # Compile first, untimed (a cold cache takes minutes): the same model
    # without a fault, once.
    if timed and not _compiled_faults:
        run_python(home, code="import sys; sys.argv = ['x', 'none']; exec(open('fault.py').read().replace('range(100000)', 'range(1)'))",
                   ranks=2, timeout=900, flags=flags)
        _compiled_faults.append(True)
    for path in home.glob('fault_at_*'):   # the compiling run's
        path.unlink()
    result = run_python(home, args=[str(script), fault], ranks=ranks, timeout=300, check=False,
                        flags=flags)
    ended = time.time()
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert re.search(expected, output), output[-3000:]
    if timed:
        # From the first rank's fault, not the start: under load the ranks
        # take long to start and compile, not to end.
        faults = [float(path.read_text()) for path in home.glob('fault_at_*')]
        assert faults, output[-3000:]
        elapsed = ended - min(faults)
        assert elapsed < 60, 'ranks ended %.0f s after the fault' % elapsed


OWN_BATCHES_SCRIPT = """
import os
import numpy as np
from keras.models import Sequential
from keras.layers import Dense
from keras.optimizers import SGD
from theano_multigpu.mpi.world import world
comm, rank, size = world()
rng = np.random.RandomState(0)
model = Sequential([Dense(16, input_dim=8, activation='tanh'), Dense(3, activation='softmax')])
model.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.5))
start = model.get_weights()
batches = [(rng.rand(10, 8).astype('float32'), np.eye(3)[rng.randint(0, 3, 10)].astype('float32'))
           for _ in range(size)]
for step in range(3):   # each rank its own batch
    model.train_on_batch(*batches[rank])
own = model.get_weights()
# One batch, the same on every rank: each rank's rows of its share, joined.
shares = [(i * 10 // size, (i + 1) * 10 // size) for i in range(size)]   # 3, 3, 4 rows
joined = [np.concatenate([batch[k][a:b] for batch, (a, b) in zip(batches, shares)])
          for k in (0, 1)]
model.set_weights(start)
for step in range(3):
    model.train_on_batch(*joined)
same = [bool(np.allclose(a, b, rtol=1e-5, atol=1e-6)) for a, b in zip(own, model.get_weights())]
moved = [not np.allclose(a, b) for a, b in zip(start, own)]
results = comm.gather((same, moved))
if rank == 0:
    print('results', results, flush=True)
"""


def test_ranks_handed_batches_of_their_own_train_on_their_shares_with_the_check_off(home):
    """multigpu.mpi_check_inputs=False, 3 ranks each handed its own batch
    of 10 rows: training equals training on one batch made of each rank's
    share of rows (3, 3 and 4) of its own batch, on every rank; the ranks
    as machines of two and one."""
    result = run_python(home, OWN_BATCHES_SCRIPT, ranks=3, timeout=900,
                        flags='multigpu.mpi_check_inputs=False,' + MACHINES_OF_TWO)
    line = [l for l in result.stdout.splitlines() if l.startswith('results')]
    assert line == ['results %s' % ([([True] * 4, [True] * 4)] * 3)], result.stdout[-2000:]


@needs_pocl
def test_layer_wise_under_mpi_refuses_a_stateful_layer_before_compiling(home):
    """Layer-wise under MPI does not split a stateful layer's states over
    the ranks: every rank stops before compiling, naming the function and
    the way out."""
    result = run_python(home, """
        import sys
        import numpy as np
        from keras.models import Sequential
        from keras.layers import LSTM
        from theano_multigpu.errors import ConfigurationError
        model = Sequential([LSTM(2, stateful=True, batch_input_shape=(4, 3, 2))])
        model.compile(loss='mse', optimizer='sgd')
        try:
            model.train_on_batch(np.zeros((4, 3, 2), 'float32'), np.zeros((4, 2), 'float32'))
        except ConfigurationError as error:   # one write: the ranks' lines must not mix
            sys.stdout.write('refused: %s\\n' % error)
            sys.stdout.flush()
    """, ranks=2, timeout=300, flags=TWO + ',multigpu.mode=layer')
    refusals = [l for l in result.stdout.splitlines() if l.startswith('refused:')]
    assert len(refusals) == 2, result.stdout[-2000:]
    assert "Keras's train function reads the states of a stateful recurrent layer" \
        in refusals[0] and 'use multigpu.mode=batch under MPI' in refusals[0], refusals


def test_plain_runs_never_import_mpi4py(home):
    result = run_python(home, """
        import sys
        import keras, theano.tensor.io
        from keras.models import Sequential
        from keras.layers import Dense
        model = Sequential([Dense(2, input_dim=3)])
        model.compile(loss='mse', optimizer='sgd')
        model.predict(__import__('numpy').ones((4, 3), 'float32'))
        print('mpi4py' in sys.modules, theano.tensor.io.mpi_enabled)
    """)
    assert result.stdout.split()[-2:] == ['False', 'False']
