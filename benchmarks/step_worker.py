"""A long-lived child that builds models and times their training steps.

Driven over stdin/stdout by one_context.py, one JSON request per line:
``{"build": NAME}`` builds NAME (benchmarks/models.py, size 'bench') and
runs warm-up steps (compiling); ``{"time": NAME, "steps": K}`` answers the
seconds of each of K ``train_on_batch`` calls; ``{"compile": NAME}`` builds
NAME afresh and answers the seconds its train function takes to compile;
``{"moved": NAME}`` (under the shim) answers the bytes the shim's transfers
moved in one step and the model's parameter bytes; ``{"placement": NAME}``
(layer-wise) answers, per context, the bytes resident for the compiled
train function and the bytes the plan counted for NAME's layers.  Each reply is one JSON
line.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import build  # noqa: E402

WARM_UP_STEPS = 3


def placement_of(model):
    """{'resident': {context: bytes}, 'planned': {context: bytes}}."""
    from theano_multigpu import layerwise, mesh, placement
    model = getattr(model, 'model', model)
    current = mesh.current()
    resident = placement.resident_bytes(model.train_function.function, current)
    plan = layerwise.current_plan()
    layers = set(layer.name for layer in model.layers)
    planned = dict((name, int(sum(n.total for n in plan.needs
                                  if n.name in layers and plan.contexts[n.name] == name)))
                   for name in current.names)
    return {'resident': dict((name, int(resident.get(name, 0))) for name in current.names),
            'planned': planned}


def main():
    cases = {}
    reply = sys.stdout
    sys.stdout = sys.stderr   # Keras's prints must not reach the driver
    for line in sys.stdin:
        request = json.loads(line)
        if 'build' in request:
            name = request['build']
            started = time.perf_counter()
            case = cases[name] = build(name, size='bench')
            for _ in range(WARM_UP_STEPS):
                case.model.train_on_batch(case.x, case.y)
            answer = {'built': name, 'seconds': time.perf_counter() - started}
        elif 'compile' in request:
            model = build(request['compile'], size='bench').model
            model = getattr(model, 'model', model)   # Sequential wraps a Model
            started = time.perf_counter()
            model._make_train_function()
            answer = {'seconds': time.perf_counter() - started}
        elif 'moved' in request:
            from theano_multigpu import transfer
            case = cases[request['moved']]
            before = sum(transfer.bytes_moved.values())
            case.model.train_on_batch(case.x, case.y)
            answer = {'bytes': sum(transfer.bytes_moved.values()) - before,
                      'parameter_bytes': sum(w.nbytes for w in case.model.get_weights())}
        elif 'placement' in request:
            answer = placement_of(cases[request['placement']].model)
        else:
            case = cases[request['time']]
            times = []
            for _ in range(request['steps']):
                started = time.perf_counter()
                case.model.train_on_batch(case.x, case.y)
                times.append(time.perf_counter() - started)
            answer = {'times': times}
        reply.write(json.dumps(answer) + '\n')
        reply.flush()


if __name__ == '__main__':
    main()
