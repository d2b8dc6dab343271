"""Child: scans that Keras's layers do not make (while loops, several taps,
outputs kept only in part, truncated and second-order gradients, updates
inside the loop), each run with Scan's compiled loop, the shim's Python
loop and Theano 1.0.5's own ``Scan.execute`` as installed (no edits, read
from Theano's source); prints one JSON line naming the cases whose results
differ.  CPU only (Theano's own loop fails on OpenCL contexts).

    python scan_cases.py
"""
import ast
import inspect
import json
import textwrap

import numpy as np
import theano
import theano.tensor as T
from theano.sandbox.rng_mrg import MRG_RandomStreams
from theano.scan_module import scan_op, until

from scan_calls import count_compiled_calls


def theanos_own_execute():
    """Scan.execute as Theano's source file has it."""
    source = inspect.getsource(scan_op)
    tree = ast.parse(source)
    scan = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == 'Scan')
    execute = next(n for n in scan.body if isinstance(n, ast.FunctionDef) and n.name == 'execute')
    namespace = {}
    exec(textwrap.dedent(ast.get_source_segment(source, execute)), scan_op.__dict__, namespace)
    return namespace['execute']


def cases(random_streams):
    x, v = T.fmatrix('x'), T.fvector('v')
    W = theano.shared(np.random.RandomState(0).rand(3, 3).astype('float32'), name='W')
    sums, _ = theano.scan(lambda row, total: total + row, sequences=x,
                          outputs_info=T.zeros_like(x[0]))
    mit_sot, _ = theano.scan(lambda a, b: a + 0.5 * b, n_steps=7,
                             outputs_info=dict(initial=v, taps=[-3, -1]))
    doubled, _ = theano.scan(lambda t: (t * 2, until(t * 2 > 50)), n_steps=20,
                             outputs_info=T.constant(np.float32(1.5)))
    whole, _ = theano.scan(lambda t: (t * 1.1, until(t.sum() > 1e9)), n_steps=6,
                           outputs_info=v)
    rows, _ = theano.scan(lambda row: (row.sum(), row * 2), sequences=x)
    backwards, _ = theano.scan(lambda row, total: total * 0.9 + row, sequences=x[::-1],
                               outputs_info=T.zeros_like(x[0]))
    hidden, _ = theano.scan(lambda row, h: T.tanh(T.dot(h, W) + row), sequences=x,
                            outputs_info=T.zeros_like(x[0]))
    cost = hidden.sum() + (hidden[-1] ** 2).sum()
    truncated, _ = theano.scan(lambda row, h: T.tanh(T.dot(h, W) + row), sequences=x,
                               outputs_info=T.zeros_like(x[0]), truncate_gradient=3)
    taps2, _ = theano.scan(lambda row, a, b: a * 0.3 + b * row, sequences=x,
                           outputs_info=dict(initial=T.zeros((2, 3)), taps=[-2, -1]))
    noisy, updates = theano.scan(lambda row: row + random_streams.uniform((3,)), sequences=x)
    grad_W = T.grad(cost, W)
    return {
        'kept last': ([x], sums[-1], None),
        'kept last three': ([x], sums[-3:], None),
        'taps -3 and -1': ([v], mit_sot, None),
        'taps -3 and -1, kept last two': ([v], mit_sot[-2:], None),
        'while, stops early': ([], doubled, None),
        'while, runs to the end': ([v], whole, None),
        'scalar and vector per step': ([x], list(rows), None),
        'backwards': ([x], backwards, None),
        'gradient': ([x], T.grad(cost, [W, x]), None),
        'truncated gradient': ([x], T.grad((truncated ** 2).sum(), [W, x]), None),
        'gradient of taps -2 and -1': ([x], T.grad((taps2 ** 2).sum(), x), None),
        'second-order gradient': ([x], T.grad((grad_W ** 2).sum(), x), None),
        'random updates inside': ([x], noisy, updates),
    }


def main():
    counted = count_compiled_calls()
    dispatch, own = scan_op.Scan.execute, theanos_own_execute()
    random_streams = MRG_RandomStreams(1)
    graphs = cases(random_streams)
    generator = random_streams.state_updates[0][0]
    start = generator.get_value()
    rng = np.random.RandomState(1)
    values = {'x': rng.rand(9, 3).astype('float32'), 'v': np.arange(1, 4, dtype='float32')}
    differ, compared = [], 0
    for name, (inputs, outputs, updates) in sorted(graphs.items()):
        arguments = [values[i.name] for i in inputs]
        functions = {}
        for which, execute in (('theano', own), ('shim', dispatch)):
            scan_op.Scan.execute = execute   # thunks take it when compiled
            functions[which] = theano.function(inputs, outputs, updates=updates)
        scan_op.Scan.execute = dispatch
        results = {}
        for loop, function in (('theano', 'theano'), ('compiled', 'shim'), ('python', 'shim')):
            theano.config.multigpu.scan_loop = 'python' if loop == 'python' else 'compiled'
            generator.set_value(start)
            results[loop] = [functions[function](*arguments) for _ in range(2)]
        flat = dict((loop, [np.asarray(a) for call in calls
                            for a in (call if isinstance(call, list) else [call])])
                    for loop, calls in results.items())
        same = all(len(flat[loop]) == len(flat['theano'])
                   and all(np.array_equal(a, b) for a, b in zip(flat[loop], flat['theano']))
                   for loop in ('compiled', 'python'))
        compared += 1
        if not same:
            differ.append(name)
    print('RESULT ' + json.dumps({'compared': compared, 'differ': differ,
                                  'compiled_calls': counted['calls']}))


if __name__ == '__main__':
    main()
