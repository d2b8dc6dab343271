"""State that belongs to a model, not to the process: the session's owner
and its reset (in this process), and two models with the same layer names
in one process, each planned on its own, then the session reset (one child
Python, two pocl contexts, layer-wise)."""
import json

from conftest import TWO, needs_pocl, run_python
from theano_multigpu.config.session import Session, current_session


class Part(object):
    """A part an upper layer keeps in the session."""

    def __init__(self):
        self.counted = 0


def test_a_session_reset_forgets_the_mesh_the_notices_and_the_parts():
    session = Session()
    session.mesh = 'a mesh'
    session.part(Part).counted = 3
    assert session.part(Part).counted == 3
    assert session.first_notice('no pygpu') and not session.first_notice('no pygpu')
    session.reset()
    assert session.mesh is None
    assert session.part(Part).counted == 0
    assert session.first_notice('no pygpu')
    assert current_session() is current_session() and current_session() is not session


# Budgets of 800 KiB a context.  Width 16: h1 on dev0 (8.4 KiB of the
# 13 KiB), h2, h3, out on dev1.  Width 256, with SGD's moments: h1 134 KiB,
# h2 and h3 518 KiB each, out 4 KiB: on the first model's contexts dev1
# would need 1.0 MiB; planned anew, h1, h2 on dev0 and h3, out on dev1.
BUDGET = 800 * 1024
CHILD = '''
    import gc, json, sys, weakref
    import numpy as np
    from keras.layers import Dense
    from keras.models import Sequential
    from theano_multigpu.config import mesh
    from theano_multigpu.graph import plan, report, transfer

    def trained(width):
        model = Sequential([Dense(width, input_dim=64, name='h1'), Dense(width, name='h2'),
                            Dense(width, name='h3'), Dense(2, name='out')])
        model.compile(loss='mse', optimizer='sgd')
        before = sum(transfer.bytes_moved().values())
        model.train_on_batch(np.ones((4, 64), 'float32'), np.ones((4, 2), 'float32'))
        train = model.model.train_function.function
        return model, {
            'contexts': [plan.layer_context(layer) for layer in model.layers],
            'needs': [plan.layer_needs(layer).total for layer in model.layers],
            'planned': plan.planned_bytes(mesh.current(), [i.variable for i in train.maker.inputs]),
            'resident': report.resident_bytes(train, mesh.current()),
            'moved': sum(transfer.bytes_moved().values()) - before}

    small, small_result = trained(16)
    large, large_result = trained(256)
    layers = plan.plans().layers
    both = layers.bytes_on(mesh.current().names)
    small_layer = weakref.ref(small.layers[0])
    del small
    gc.collect()
    large_alone = layers.bytes_on(mesh.current().names)
    # A reset session forgets the plans and the bytes moved, and reads the
    # mesh again as start-up found it (the master Theano's default context).
    from theano_multigpu.config.session import current_session
    started = mesh.current()
    current_session().reset()
    reset = {'new mesh': mesh.current() is not started,
             'default is master': [started.default_is_master, mesh.current().default_is_master],
             'plans': plan.plans().layers.bytes_on(mesh.current().names),
             'moved': len(transfer.bytes_moved())}
    print('RESULT ' + json.dumps({'small': small_result, 'large': large_result, 'both': both,
                                  'large alone': large_alone, 'reset': reset,
                                  'small gone': small_layer() is None}))
'''


def _report_layers(stderr):
    """[{context: layers column}] of each layer-wise placement report (its
    columns: context 9 wide, device 10, layers 28)."""
    found = []
    for text in stderr.split('placement report: ')[1:]:
        rows = text.splitlines()[2:4]
        found.append(dict((row[2:11].strip().rstrip('*'), row[23:51].strip()) for row in rows))
    return found


def _report_cells(stderr, *spans):
    """[{context: (bytes in each column span)}] of each placement report."""
    found = []
    for text in stderr.split('placement report: ')[1:]:
        found.append(dict((row[2:11].strip().rstrip('*'),
                           tuple(_size(row[a:b]) for a, b in spans))
                          for row in text.splitlines()[2:4]))
    return found


def _size(cell):
    number, unit = cell.split()
    return float(number) * {'B': 1, 'KiB': 1 << 10, 'MiB': 1 << 20}[unit]


@needs_pocl
def test_two_models_with_the_same_layer_names_each_get_a_plan_and_bytes_of_their_own(home):
    result = run_python(home, code=CHILD, flags=TWO + ',multigpu.mode=layer,multigpu.report=True,'
                        'multigpu.measure_peak=True,multigpu.device_memory=%d' % BUDGET)
    line = [l for l in result.stdout.splitlines() if l.startswith('RESULT ')][0]
    out = json.loads(line[len('RESULT '):])
    small, large = out['small'], out['large']
    assert small['contexts'] == ['dev0', 'dev1', 'dev1', 'dev1']
    # The budgets the second model fits only when planned anew.
    assert sum(large['needs'][1:]) > BUDGET
    assert large['contexts'] == ['dev0', 'dev0', 'dev1', 'dev1']
    # Its own bytes: each model's weights and SGD moments where its plan put them.
    for model, width in ((small, 16), (large, 256)):
        params = [64 * width + width, width * width + width, width * width + width, 2 * width + 2]
        on = dict((name, sum(8 * p for p, c in zip(params, model['contexts']) if c == name))
                  for name in ('dev0', 'dev1'))
        assert model['planned'] == on, (model, on)
        assert dict((k, v) for k, v in model['resident'].items() if k != 'cpu') == on
    assert 0 < small['moved'] < large['moved']
    # The first model's layers charged the second's plan while alive, and
    # were dropped with it.
    alone = dict((name, sum(n for n, c in zip(large['needs'], large['contexts']) if c == name))
                 for name in ('dev0', 'dev1'))
    assert out['large alone'] == alone
    assert out['both'] == dict((name, alone[name] + sum(
        n for n, c in zip(small['needs'], small['contexts']) if c == name)) for name in alone)
    assert out['small gone']
    assert out['reset'] == {'new mesh': True, 'default is master': [True, True],
                            'plans': {'dev0': 0, 'dev1': 0}, 'moved': 0}
    assert _report_layers(result.stderr) == [{'dev0': 'h1', 'dev1': 'h2, h3, out'},
                                             {'dev0': 'h1, h2', 'dev1': 'h3, out'}]
    # Each context's peak during the step, planned before it ran, is the
    # one measured as it ran, within 10%, and holds more than the weights.
    for report in _report_cells(result.stderr, (76, 88), (88, 100)):
        for name, (plan, run) in report.items():
            assert abs(plan - run) <= 0.1 * run, (name, plan, run, result.stderr)
