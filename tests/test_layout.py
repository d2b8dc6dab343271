"""The package's layout: imports only go downward (checked by lint-imports
in `make test`, and at run time here), and every patch of Theano or Keras
checks its target before it patches.

One child Python imports everything with two pocl contexts (so the gpuarray
fixes are installed too), runs each declared expectation against its real
target and against a wrong one, and makes the patches of MPI's rank_zero on
the real Keras.  Nothing is compiled.  tests/test_patches.py finds every
patch in the source and tries the rest against wrong targets in-process.
"""
import json

from conftest import TWO, needs_pocl, run_python


def test_planner_imports_no_theano(home):
    """The planner is arithmetic: importing it imports neither Theano nor
    anything that registers a graph rewrite."""
    result = run_python(home, code='''
        import sys
        from theano_multigpu.graph import planner
        plan = planner.balanced([planner.LayerNeeds('a', weights=10),
                                 planner.LayerNeeds('b', weights=10)], ['d0', 'd1'], {})
        print(sorted(plan.items()), 'theano' in sys.modules)
    ''')
    assert result.stdout.split('\n')[-2] == "[('a', 'd0'), ('b', 'd1')] False"


CHECK_EVERY_TARGET = r'''
import json, sys
import keras  # installs the adapter: every patch is in place
import keras.callbacks, keras.models, theano.gpuarray.elemwise
from theano_multigpu.errors import PatchTargetError
from theano_multigpu.patch_targets import (EXPECTATIONS, Attributes, CodeNames, Parameters,
                                           SourceDigest)
from theano_multigpu.compat import gpuarray_fixes, theano_fixes, keras_fixes, optimizers
from theano_multigpu.graph import placed
from theano_multigpu.keras_adapter import rank_zero

def wrong_function(a, b=None):
    return a

no_source = {}
exec('def no_source(self, node):\n    return node\n', no_source)
wrong = {SourceDigest: wrong_function, Parameters: wrong_function, CodeNames: wrong_function,
         Attributes: object()}

report = {'kinds': sorted(set(type(e).__name__ for e in EXPECTATIONS)), 'targets': []}
for expectation in EXPECTATIONS:
    row = {'target': expectation.target}
    # A patch installed checked its real target then (it may be replaced
    # now); a patch not installed here (rank_zero's) checks it now.
    row['real'] = expectation.passed or expectation.check(expectation.resolve()) is not None
    try:
        expectation.check(wrong[type(expectation)])
        row['wrong'] = 'accepted'
    except PatchTargetError as error:
        row['wrong'] = str(error)
    report['targets'].append(row)

digest = SourceDigest('theano.scan_module.scan_op.Scan.execute', 'x' * 16, 'a test')
try:
    digest.check(no_source['no_source'])
except PatchTargetError as error:
    report['no_source'] = str(error)

positions = {'gpuarray_opt': 48.5, 'specialize_device': 48.6, 'merge2': 49.0}
report['position'] = optimizers.position_after(positions, 'merge2', -0.2, 'multigpu_x')
for anchor, offset in (('gpuarray_opt', 0.3), ('no_such_pass', 0.1)):
    try:
        optimizers.position_after(positions, anchor, offset, 'multigpu_x')
    except PatchTargetError as error:
        report.setdefault('positions', []).append(str(error))

# rank_zero's patches (made under MPI) on the real Keras: each checks the
# expectation it is given is of what it sets.
rank_zero._rank_zero_prints_and_logs(1, False)(keras.callbacks)
rank_zero._rank_zero_writes_weights(False)(keras.engine.topology)
rank_zero._rank_zero_writes_models(False)(keras.models)
report['rank_zero'] = [f.__qualname__.split('.')[-1] for f in (
    keras.callbacks.CSVLogger.on_train_begin, keras.callbacks.CSVLogger.on_epoch_end,
    keras.engine.topology.Container.save_weights, keras.models.save_model)]
print(json.dumps(report))
'''


@needs_pocl
def test_every_patch_checks_its_target(home):
    """Each expectation resolves to its real target, which its patch checked
    on the way in (the child would have failed otherwise), and refuses a
    wrong target with an error naming the target, the version found and
    the fix; a target without source and a rewrite whose place in Theano's
    passes moved are refused too."""
    result = run_python(home, flags=TWO, code=CHECK_EVERY_TARGET)
    report = json.loads(result.stdout.strip().split('\n')[-1])
    assert report['kinds'] == ['Attributes', 'CodeNames', 'Parameters', 'SourceDigest']
    targets = [row['target'] for row in report['targets']]
    for patched in ('theano.scan_module.scan_op.Scan.execute',
                    'theano.gpuarray.basic_ops.infer_context_name',
                    'theano.gof.op.COp.c_code_cache_version',
                    'theano.configparser', 'keras.engine.topology.Container',
                    'keras.backend.theano_backend', 'keras.callbacks.ProgbarLogger',
                    'theano.compile.function.pfunc', 'keras.backend', 'keras.models.load_model',
                    'keras.models.save_model', 'keras.callbacks.CSVLogger.on_train_begin',
                    'keras.engine.topology.Container.load_weights_from_hdf5_group',
                    'theano.gof.graph.Variable.eval',
                    'theano.gpuarray.basic_ops.GpuKernelBase.gpu_kernels',
                    'theano.scalar.basic.Maximum.c_code_cache_version'):
        assert patched in targets
    for row in report['targets']:
        assert row['real'] is True, row
        release = 'Theano 1.0.5' if row['target'].startswith('theano') else 'Keras 1.0.1 to 1.2.2'
        assert row['wrong'].startswith('theano_multigpu patches %s (' % row['target']), row
        assert "and expects %s's" % release in row['wrong'], row
        assert ' in theano 1.0.5.' in row['wrong'] or ' in keras 1.2.2.' in row['wrong'], row
        assert 'install it (pip install' in row['wrong'], row
    assert 'its source cannot be read (OSError' in report['no_source']
    assert report['position'] == 48.8
    between, missing = report['positions']
    assert between.startswith('theano_multigpu patches theano.compile.optdb (')
    assert "the pass(es) specialize_device lie between the two" in between
    assert "has no pass of that name" in missing and "'no_such_pass'" in missing
    assert report['rank_zero'] == ['_nothing', 'save_on_rank_zero', 'save_on_rank_zero',
                                   'save_on_rank_zero']
