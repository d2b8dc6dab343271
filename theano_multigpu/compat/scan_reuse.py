"""A recurrent layer's backward loop reads the products its forward loop
computed, instead of computing them again (``multigpu.scan_reuse``; off
by default, and for one context per process: with several, Theano's
ScanMerge merged two replicas' backward loops onto one context).

Theano's scan gradient (``Scan.L_op``) feeds the backward loop each output
of the forward loop, step by step, and computes again inside the backward
loop whatever else of a forward step the gradient needs: for Keras's LSTM,
the four products h(t-1) . U of its gates, for its GRU three.  Rule: when
the gradient of a scan is taken, the scan is first given, as extra per-step
outputs, each matrix product of its step that depends on its recurrent
states; L_op reads them from the forward loop as it reads the loop's own
outputs, and the backward loop computes none of them.  The scan with the
extra outputs computes the forward's values too: the graph pass
``multigpu_scan_forward_once`` makes what read the forward read them there,
so the forward runs once.  The numbers are the forward's own, to float
rounding.  Memory: each product, one per step (steps x batch x units), is
kept from the forward to the backward; the compiled graph's peak plan
counts the forward's outputs.

Left as Theano makes them: loops with a stop condition, a truncated
gradient or gradients of gradients (``mit_mot`` states), and loops whose
products depend on no state.
"""
from .. import importhook
from ..patch_targets import Parameters, wrap
from .optimizers import register_optimizer

__all__ = ['install', 'state_products']

L_OP = Parameters('theano.scan_module.scan_op.Scan.L_op',
                  ('self', 'inputs', 'outs', 'dC_douts'),
                  "wrapped: the loop's products are made outputs of the forward "
                  "before its gradient is taken")
# The op of the scan that computes a forward once more with its products:
# its attribute naming the forward's op and how many products it adds.
FORWARD_OF = 'multigpu_forward_of'


def state_products(op):
    """The matrix products of the loop ``op``'s step that depend on its
    recurrent states and are not its outputs already, in graph order."""
    from theano import gof
    from theano.tensor.basic import Dot
    depends = set(op.inner_mitsot(op.inputs) + op.inner_sitsot(op.inputs))
    outputs, found = set(op.outputs), []
    for node in gof.graph.io_toposort(op.inputs, op.outputs):
        if not any(v in depends for v in node.inputs):
            continue
        depends.update(node.outputs)
        product = node.outputs[0]
        if (isinstance(node.op, Dot) and product not in outputs and product not in found
                and product.dtype.startswith('float')):
            found.append(product)
    return found


def _eligible(op):
    return not (op.as_while or op.truncate_gradient != -1 or op.n_mit_mot
                or op.info.get('gpua'))


def _ends(op):
    """(outer outputs before the shared ones, outer inputs before the
    non-sequences): where a scan's per-step outputs and their sizes end."""
    outputs = op.n_mit_mot + op.n_mit_sot + op.n_sit_sot + op.n_nit_sot
    inputs = (1 + op.n_seqs + op.n_mit_mot + op.n_mit_sot + op.n_sit_sot + op.n_shared_outs
              + op.n_nit_sot)
    return outputs, inputs


def with_products(op, outer_inputs, products):
    """(the scan op that also outputs ``products`` per step, its outer
    inputs): the products come after the per-step outputs of ``op``, each
    with the loop's length as its size."""
    from theano.scan_module.scan_op import Scan
    info = dict(op.info)
    info['n_nit_sot'] = op.n_nit_sot + len(products)
    inner_end = op.n_mit_mot_outs + op.n_mit_sot + op.n_sit_sot + op.n_nit_sot
    extended = Scan(op.inputs, op.outputs[:inner_end] + products + op.outputs[inner_end:], info)
    setattr(extended, FORWARD_OF, (op, len(products)))
    _, sizes_end = _ends(op)
    steps = outer_inputs[0]
    return extended, (list(outer_inputs[:sizes_end]) + [steps] * len(products)
                      + list(outer_inputs[sizes_end:]))


def _reading_products(L_op):
    def L_op_reading_products(self, inputs, outs, dC_douts):
        import theano
        products = (state_products(self)
                    if theano.config.multigpu.scan_reuse and _eligible(self) else [])
        if not products:
            return L_op(self, inputs, outs, dC_douts)
        from theano.gradient import DisconnectedType
        extended, extended_inputs = with_products(self, inputs, products)
        extended_outs = extended(*extended_inputs, return_list=True)
        outputs_end, sizes_end = _ends(self)
        douts = (list(dC_douts[:outputs_end]) + [DisconnectedType()() for _ in products]
                 + list(dC_douts[outputs_end:]))
        grads = L_op(extended, extended_inputs, extended_outs, douts)
        return list(grads[:sizes_end]) + list(grads[sizes_end + len(products):])
    return L_op_reading_products


def _local_forward_once():
    from theano import gof
    from theano.scan_module.scan_op import Scan

    @gof.local_optimizer([Scan])
    def local_forward_once(node):
        """What reads the forward scan reads the scan that also outputs
        its products (same inputs, the same step): one forward."""
        forward_of = getattr(node.op, FORWARD_OF, None)
        fgraph = getattr(node, 'fgraph', None)
        if forward_of is None or fgraph is None:
            return False
        op, added = forward_of
        outputs_end, sizes_end = _ends(op)
        inputs = node.inputs[:sizes_end] + node.inputs[sizes_end + added:]
        for client, _ in fgraph.clients(node.inputs[0]):
            if (client == 'output' or client is node or not isinstance(client.op, Scan)
                    or client.inputs != inputs or client.op != op):
                continue
            extended = node.outputs[:outputs_end] + node.outputs[outputs_end + added:]
            return dict(zip(client.outputs, extended))
        return False
    return local_forward_once


def _register_forward_once(scan_opt):
    register_optimizer('scan_forward_once', _local_forward_once(), 'scan_eqopt1', -0.02)


def _read_products_in_gradients(scan_op):
    wrap(L_OP, scan_op.Scan, 'L_op', _reading_products)


def install():
    importhook.after_import('theano.scan_module.scan_op', _read_products_in_gradients)
    importhook.after_import('theano.scan_module.scan_opt', _register_forward_once)
