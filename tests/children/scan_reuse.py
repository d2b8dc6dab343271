"""Child: scan_loops.py's model (every kind of recurrent layer, masks,
dropout inside the step, stateful layers) trained from the same start with
the backward loops reading the forward's products
(``multigpu.scan_reuse=True``) and with Theano's own scan gradient
(False); prints one JSON line: the losses and weights of both, the scans of
each train function and the matrix products in their forward and backward
loops.

    python scan_reuse.py        (under the parent's THEANO_FLAGS)
"""
import json

import numpy as np
import theano
from theano.scan_module.scan_op import Scan

from scan_loops import build_model, data, shared_variables

STEPS = 3
PRODUCTS = ('Dot', 'Dot22', 'Dot22Scalar', 'Gemm', 'Gemv', 'Ger')


def scans_and_products(function):
    """(the scans of ``function``'s graph, the matrix products of its
    forward loops' compiled steps, and of its backward loops')."""
    scans = [node for node in function.maker.fgraph.toposort() if isinstance(node.op, Scan)]

    def products(backward):
        return sum(type(inner.op).__name__ in PRODUCTS
                   for node in scans if node.op.name.startswith('grad_of') == backward
                   for inner in node.op.fn.maker.fgraph.toposort())
    return len(scans), products(False), products(True)


def main():
    model = build_model()
    x, y = data()
    model.train_on_batch(x, y)  # creates the optimizer's state
    variables = shared_variables()
    start = [v.get_value() for v in variables]
    runs = {}
    for reuse in (True, False):
        theano.config.multigpu.scan_reuse = reuse
        model.train_function = None   # compiled again, its gradient taken again
        for variable, value in zip(variables, start):
            variable.set_value(value)
        losses = [float(model.train_on_batch(x, y)) for _ in range(STEPS)]
        scans, forward, backward = scans_and_products(model.train_function.function)
        runs[reuse] = {'losses': losses, 'weights': model.get_weights(), 'scans': scans,
                       'forward_products': forward, 'backward_products': backward}
    pairs = list(zip(runs[True]['weights'], runs[False]['weights']))
    print('RESULT ' + json.dumps({
        'losses': [runs[True]['losses'], runs[False]['losses']],
        'scans': [runs[True]['scans'], runs[False]['scans']],
        'forward_products': [runs[True]['forward_products'], runs[False]['forward_products']],
        'backward_products': [runs[True]['backward_products'],
                              runs[False]['backward_products']],
        'arrays': len(pairs),
        'not_close': sum(not np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in pairs),
        'largest_difference': max(float(np.max(np.abs(a - b))) for a, b in pairs),
    }))


if __name__ == '__main__':
    main()
