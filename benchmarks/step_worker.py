"""A long-lived child that builds models and times their training steps.

Driven over stdin/stdout by one_context.py, one JSON request per line:
``{"build": NAME}`` builds NAME (benchmarks/models.py, size 'bench') and
runs warm-up steps (compiling); ``{"time": NAME, "steps": K}`` answers the
seconds of each of K ``train_on_batch`` calls.  Each reply is one JSON line.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import build  # noqa: E402

WARM_UP_STEPS = 3


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
