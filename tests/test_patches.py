"""Every patch of Theano or Keras checks its target, found by reading the
package's source; a wrong target makes a patch refuse, naming it.

In this process, without Theano or Keras: the source is parsed with
``ast``, and the patches run against modules built to be wrong.

A patch goes through ``patch_targets.replace`` or ``patch_targets.wrap``,
which check the expectation they are given against the attribute they set
(or its owner) before setting it.  The rule read here: no other code of the
package assigns, deletes or sets with ``setattr`` an attribute of a Theano
or Keras object (a module, a class, a function), nor writes its
``__dict__``.  What is a Theano or Keras object is followed through the
source: names imported from them, the module an import hook is given
(``importhook.after_import('keras.models', f)``: f's first parameter),
attributes, items and ``getattr`` of those, what ``Expectation.check``
returns, and the parameters of the package's functions called with them.
"""
import ast
import os
import types

import pytest

from theano_multigpu import patch_targets
from theano_multigpu.errors import PatchTargetError

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       'theano_multigpu')
ROOTS = ('theano', 'keras')
# The functions that patch, and where they live: assignments inside them
# are the patches they were given.
HELPERS = ('replace', 'wrap')
HELPER_MODULE = 'patch_targets'


def _is_foreign(dotted):
    return dotted.split('.')[0] in ROOTS


def _modules():
    """{module name (dotted, under the package): parsed source}."""
    found = {}
    for directory, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith('.py'):
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3]
                dotted = relative.replace(os.sep, '.')
                if dotted.endswith('.__init__'):
                    dotted = dotted[:-len('.__init__')]
                with open(path) as f:
                    found[dotted] = ast.parse(f.read(), path)
    return found


class _Function(object):
    """One function of the package: its node, its module, and which of its
    parameters receive a Theano or Keras object."""

    def __init__(self, module, node, parent):
        self.module = module
        self.node = node
        self.parent = parent
        self.tainted_parameters = set()

    @property
    def parameters(self):
        args = self.node.args
        return [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]


class PatchSites(object):
    """The package's assignments into Theano and Keras objects (see the
    module docstring)."""

    def __init__(self, modules):
        self.modules = modules
        self.functions = {}        # (module, name) -> [_Function], nested ones too
        self.owners = {}           # ast node of a FunctionDef -> _Function
        self.hooks = []            # (module, Theano or Keras module, hook as text)
        for module, tree in modules.items():
            self._collect(module, tree, None)
        self._taint_hook_parameters()
        self.sites = []            # (module, line, text)
        self.helper_calls = []     # (module, line, expectation argument as text)
        self._fixpoint()

    # -- the package's functions

    def _collect(self, module, node, parent):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                function = _Function(module, child, parent)
                self.functions.setdefault((module, child.name), []).append(function)
                self.owners[child] = function
                self._collect(module, child, function)
            else:
                self._collect(module, child, parent)

    def _resolve(self, module, expression):
        """The package's functions that ``expression`` (in ``module``) names."""
        if isinstance(expression, ast.Name):
            return self.functions.get((module, expression.id), [])
        if isinstance(expression, ast.Attribute) and isinstance(expression.value, ast.Name):
            base = expression.value.id
            return [f for (m, name), fs in self.functions.items()
                    if name == expression.attr and m.split('.')[-1] == base for f in fs]
        return []

    def _taint_hook_parameters(self):
        """The first parameter of every import hook on a Theano or Keras
        module (of the function a hook factory returns, for a call)."""
        for module, tree in self.modules.items():
            for call in ast.walk(tree):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr in ('after_import', 'before_import')
                        and len(call.args) == 2 and isinstance(call.args[0], ast.Constant)
                        and _is_foreign(str(call.args[0].value))):
                    continue
                hook = call.args[1]
                self.hooks.append((module, call.args[0].value, ast.unparse(hook)))
                if isinstance(hook, ast.Call):
                    targets = []
                    for factory in self._resolve(module, hook.func):
                        returned = set(r.value.id for r in ast.walk(factory.node)
                                       if isinstance(r, ast.Return)
                                       and isinstance(r.value, ast.Name))
                        targets += [f for f in self.owners.values()
                                    if f.parent is factory and f.node.name in returned]
                else:
                    targets = self._resolve(module, hook)
                for function in targets:
                    if function.parameters:
                        function.tainted_parameters.add(function.parameters[0])

    # -- following Theano and Keras objects through a scope

    def _scope_nodes(self, scope):
        """The statements and expressions of ``scope`` (a module or a
        function), without those of functions nested in it."""
        stack = list(ast.iter_child_nodes(scope))
        while stack:
            node = stack.pop()
            yield node
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                     ast.ClassDef)):
                stack.extend(ast.iter_child_nodes(node))

    def _foreign(self, expression, tainted):
        """Whether ``expression`` is a Theano or Keras object."""
        if isinstance(expression, ast.Name):
            return expression.id in tainted
        if isinstance(expression, ast.Attribute):
            return self._foreign(expression.value, tainted)
        if isinstance(expression, ast.Subscript):
            if (isinstance(expression.slice, ast.Constant)
                    and isinstance(expression.slice.value, str)
                    and _is_foreign(expression.slice.value)):
                return True   # sys.modules['keras.backend']
            return self._foreign(expression.value, tainted)
        if isinstance(expression, (ast.Tuple, ast.List, ast.Set)):
            return any(self._foreign(e, tainted) for e in expression.elts)
        if isinstance(expression, ast.Call):
            func = expression.func
            if isinstance(func, ast.Attribute) and func.attr == 'check':
                return True   # Expectation.check returns its target
            if isinstance(func, ast.Name) and func.id in ('getattr', 'vars'):
                return bool(expression.args) and self._foreign(expression.args[0], tainted)
        return False

    def _names_bound(self, target):
        """The names an assignment to ``target`` binds (not ``x`` of ``x.a = ...``)."""
        if isinstance(target, ast.Name):
            return [target.id]
        if isinstance(target, (ast.Tuple, ast.List)):
            return [n for e in target.elts for n in self._names_bound(e)]
        if isinstance(target, ast.Starred):
            return self._names_bound(target.value)
        return []

    def _tainted_in(self, scope, inherited):
        """The names of ``scope`` that hold Theano or Keras objects."""
        tainted = set(inherited)
        function = self.owners.get(scope)
        if function is not None:
            tainted |= function.tainted_parameters
        changed = True
        while changed:
            changed = False
            for node in self._scope_nodes(scope):
                bound = []
                if isinstance(node, ast.Import):
                    bound = [(a.asname or a.name).split('.')[0] for a in node.names
                             if _is_foreign(a.name)]
                elif isinstance(node, ast.ImportFrom):
                    if node.module and node.level == 0 and _is_foreign(node.module):
                        bound = [a.asname or a.name for a in node.names]
                elif isinstance(node, ast.Assign) and self._foreign(node.value, tainted):
                    for target in node.targets:
                        bound += self._names_bound(target)
                elif isinstance(node, (ast.For, ast.comprehension)) and self._foreign(
                        node.iter, tainted):
                    bound = self._names_bound(node.target)
                elif isinstance(node, ast.withitem) and node.optional_vars is not None \
                        and self._foreign(node.context_expr, tainted):
                    bound = self._names_bound(node.optional_vars)
                new = set(bound) - tainted
                if new:
                    tainted |= new
                    changed = True
        return tainted

    # -- the sites

    def _fixpoint(self):
        """Taint parameters across calls until nothing changes, then list
        the sites."""
        while True:
            before = sum(len(f.tainted_parameters) for fs in self.functions.values()
                         for f in fs)
            self.sites, self.helper_calls = [], []
            for module, tree in self.modules.items():
                self._visit(module, tree, set())
            after = sum(len(f.tainted_parameters) for fs in self.functions.values()
                        for f in fs)
            if after == before:
                self.sites.sort()
                return

    def _visit(self, module, scope, inherited):
        tainted = self._tainted_in(scope, inherited)
        function = self.owners.get(scope)
        in_helper = (module.split('.')[-1] == HELPER_MODULE and function is not None
                     and function.node.name in HELPERS)
        for node in self._scope_nodes(scope):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self._visit(module, node, tainted)
            elif isinstance(node, ast.Call):
                self._call(module, node, tainted, in_helper)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete))
                           else [node.target])
                for target in targets:
                    for element in (target.elts if isinstance(target, ast.Tuple) else [target]):
                        if self._writes_foreign(element, tainted) and not in_helper:
                            self.sites.append((module, node.lineno, ast.unparse(element)))

    def _writes_foreign(self, target, tainted):
        """``X.name`` or ``X.__dict__[...]`` / ``vars(X)[...]``, X foreign."""
        if isinstance(target, ast.Attribute):
            return self._foreign(target.value, tainted)
        if isinstance(target, ast.Subscript):
            return self._dict_of_foreign(target.value, tainted)
        return False

    def _dict_of_foreign(self, expression, tainted):
        if isinstance(expression, ast.Attribute) and expression.attr == '__dict__':
            return self._foreign(expression.value, tainted)
        if (isinstance(expression, ast.Call) and isinstance(expression.func, ast.Name)
                and expression.func.id == 'vars' and expression.args):
            return self._foreign(expression.args[0], tainted)
        return False

    def _call(self, module, call, tainted, in_helper):
        func = call.func
        name = func.id if isinstance(func, ast.Name) else (
            func.attr if isinstance(func, ast.Attribute) else None)
        if (isinstance(func, ast.Name) and name in ('setattr', 'delattr') and call.args
                and self._foreign(call.args[0], tainted) and not in_helper):
            self.sites.append((module, call.lineno, ast.unparse(call)))
        if (isinstance(func, ast.Attribute)
                and func.attr in ('pop', 'update', 'setdefault', 'clear', '__setitem__',
                                  '__delitem__', 'popitem')
                and self._dict_of_foreign(func.value, tainted)):
            self.sites.append((module, call.lineno, ast.unparse(call)))
        if name in HELPERS and self._names_helper(module, func):
            self.helper_calls.append((module, call.lineno,
                                      ast.unparse(call.args[0]) if call.args else ''))
        # The package's functions given a Theano or Keras object.
        for function in self._resolve(module, func):
            for parameter, argument in zip(function.parameters, call.args):
                if self._foreign(argument, tainted):
                    function.tainted_parameters.add(parameter)

    def _names_helper(self, module, func):
        """Whether ``func`` is patch_targets.replace or .wrap."""
        if isinstance(func, ast.Attribute):
            return isinstance(func.value, ast.Name) and func.value.id == HELPER_MODULE
        for node in ast.walk(self.modules[module]):
            if (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.split('.')[-1] == HELPER_MODULE
                    and any(a.name == func.id for a in node.names)):
                return True
        return False


@pytest.fixture(scope='module')
def patch_sites():
    return PatchSites(_modules())


def test_every_patch_goes_through_a_checked_helper(patch_sites):
    """No assignment into a Theano or Keras module or class outside
    patch_targets.replace and .wrap, which check an expectation first."""
    unchecked = ['%s:%d %s' % site for site in patch_sites.sites]
    assert unchecked == [], (
        'these assign into Theano or Keras without an expectation checked first; '
        'patch through patch_targets.replace or patch_targets.wrap with an '
        'Expectation of the target instead:\n  ' + '\n  '.join(unchecked))


def test_the_reading_finds_patches(patch_sites):
    """The reading above is not blind: it follows the patches the package
    makes through the helpers, from every module that patches."""
    patching = set(module.split('.')[-1] for module, _, _ in patch_sites.helper_calls)
    assert {'keras_fixes', 'rank_zero', 'gpu_kernels', 'theano_fixes', 'gpuarray_fixes',
            'opencl_contexts', 'shared_views', 'keras_adapter'} <= patching, patching
    # Each is given an expectation: a name, not something made on the spot.
    for module, line, expectation in patch_sites.helper_calls:
        assert expectation and '(' not in expectation, (module, line, expectation)


def test_the_reading_sees_a_patch_without_a_check():
    """A patch written as the package's patches were before (assigned
    straight into the module an import hook is given, or into a class
    found through an import) is found."""
    source = ast.parse('''
from theano.gof import op as gof_op
import keras.models

def _fix(models):
    container = models.Container
    container.save = wrapped(container.save)
    for name in ('a', 'b'):
        setattr(container, name, None)
    models.__dict__['flag'] = True

def _fix_op():
    gof_op.Op.make_thunk = None
    keras.models.load_model = None

def install():
    importhook.after_import('keras.models', _fix)
''')
    sites = PatchSites({'theano_multigpu.compat.example': source}).sites
    assert [(line, text) for _, line, text in sites] == [
        (7, 'container.save'), (9, 'setattr(container, name, None)'),
        (10, "models.__dict__['flag']"), (13, 'gof_op.Op.make_thunk'),
        (14, 'keras.models.load_model')]


def test_no_assert_guards_a_patch():
    """``python -O`` drops assert statements: none in the package."""
    found = []
    for module, tree in _modules().items():
        found += ['%s:%d' % (module, node.lineno) for node in ast.walk(tree)
                  if isinstance(node, ast.Assert)]
    assert found == []


# -- a wrong target makes a patch refuse

def _wrong_function(a, b=None):
    return a


def _expectations():
    """Every expectation of the modules that patch (importing them patches
    nothing: their hooks wait for Theano and Keras; the Keras adapter's
    package imports Theano, so its expectations are tried in
    tests/test_layout.py's child)."""
    from theano_multigpu.compat import (gpu_kernels, keras_fixes, opencl_contexts,  # noqa: F401
                                        shared_views, theano_fixes)
    return list(patch_targets.EXPECTATIONS)


def wrong_module(name):
    """Module ``name`` as a release the patches were not written for: each
    target an expectation names in it is there, and wrong (a function of
    other parameters, source and code; a class or module without the
    attributes stated)."""
    module = types.ModuleType(name)
    for expectation in _expectations():
        if not expectation.target.startswith(name + '.'):
            continue
        path = expectation.target[len(name) + 1:].split('.')
        owner = module
        for depth, part in enumerate(path):
            leaf = depth == len(path) - 1
            if part in vars(owner):
                owner = vars(owner)[part]
            elif leaf and not isinstance(expectation, patch_targets.Attributes):
                setattr(owner, part, _wrong_function)
            else:
                new = type(part, (), {'__module__': name,
                                      '__qualname__': '.'.join(path[:depth + 1])})
                setattr(owner, part, new)
                owner = new
    return module


def _contents(module):
    """{dotted name: its attributes} of ``module`` and the classes in it."""
    found = {module.__name__: dict(vars(module))}
    for value in list(vars(module).values()):
        if isinstance(value, type):
            found['%s.%s' % (module.__name__, value.__qualname__)] = dict(vars(value))
    return found


def _hook(module, name, *args):
    def hook(target):
        import importlib
        function = getattr(importlib.import_module('theano_multigpu.' + module), name)
        return (function(*args) if args else function)(target)
    hook.__name__ = '%s.%s' % (module, name)
    return hook


# (package module, hook, its arguments for a factory): the Theano or Keras
# module it patches, made wrong.
HOOKS = [
    ('compat.keras_fixes', '_fix_models', (), 'keras.models'),
    ('compat.keras_fixes', '_fix_topology', (), 'keras.engine.topology'),
    ('compat.keras_fixes', '_fix_recurrent', (), 'keras.layers.recurrent'),
    ('compat.gpu_kernels', '_fix_nan_in_maximum_and_minimum', (), 'theano.scalar.basic'),
    ('compat.gpu_kernels', '_fix_elemwise_handle', (), 'theano.gpuarray.elemwise'),
    ('compat.gpu_kernels', '_raise_kernel_build_errors', (), 'theano.gof.op'),
    ('compat.gpu_kernels', '_fix_pools', (), 'theano.gpuarray.pool'),
    ('compat.gpu_kernels', '_check_kernel_sources', (), 'theano.gpuarray.basic_ops'),
    ('compat.gpu_kernels', '_share_kernels_per_context', (), 'theano.gpuarray.basic_ops'),
    ('compat.theano_fixes', '_fix_cop_cache_version', (), 'theano.gof.op'),
    ('compat.theano_fixes', '_fix_scan_on_opencl', (), 'theano.scan_module.scan_op'),
    ('compat.theano_fixes', '_version_ops_without_props', (), 'theano.gof.cc'),
    ('compat.theano_fixes', '_fix_round_on_opencl', (), 'theano.scalar.basic'),
    ('compat.theano_fixes', '_set_blas_ldflags', (), 'theano.configparser'),
    ('compat.theano_fixes', '_poll_compile_lock_often', (), 'theano.gof.compilelock'),
    ('compat.theano_fixes', '_write_cache_keys_whole', (), 'theano.gof.cmodule'),
    ('compat.precompiled_headers', '_wrap_compile_str', (), 'theano.gof.cmodule'),
    ('compat.opencl_contexts', '_fill_zeros_without_memset', (), 'theano.gpuarray.basic_ops'),
    ('compat.compile_watch', '_watch_linking', (), 'theano.gof.vm'),
    ('compat.compile_watch', '_watch_ops', (), 'theano.gof.op'),
    ('compat.compile_watch', '_watch_scan_ops', (), 'theano.scan_module.scan_op'),
    ('compat.compile_watch', '_watch_ifelse_ops', (), 'theano.ifelse'),
    ('compat.compile_watch', '_watch_modules', (), 'theano.gof.cc'),
    ('compat.shared_views', 'install', (), 'theano.compile.function'),
    ('compat.scan_reuse', '_read_products_in_gradients', (), 'theano.scan_module.scan_op'),
    ('compat.shared_views', 'install_scan', (), 'theano.scan_module.scan'),
]
# Hooks whose module imports Theano or pygpu, or that patch nothing: their
# expectations are checked against wrong targets, and their patches on the
# real targets, in tests/test_layout.py's child, which has Theano and Keras.
WITH_THEANO = {
    ('keras_adapter.rank_zero', '_rank_zero_prints_and_logs'): 'the adapter imports Theano',
    ('keras_adapter.rank_zero', '_rank_zero_writes_weights'): 'the adapter imports Theano',
    ('keras_adapter.rank_zero', '_rank_zero_writes_models'): 'the adapter imports Theano',
    ('compat.theano_fixes', '_fix_reduction_on_cpu_opencl'): 'imports pygpu and theano.scalar',
    ('compat.opencl_contexts', '_register'): 'imports theano.gof',
    ('compat.scan_reuse', '_register_forward_once'): 'imports theano.gof',
    ('compat.theano_fixes', '_import_ifelse'): 'patches nothing (imports theano.ifelse)',
    ('compat.keras_fixes', 'write_theano_keras_json'): 'patches nothing (writes keras.json)',
    ('compat.theano_fixes', 'hidden.hide'): 'patches nothing (sys.modules)',
    ('compat.theano_fixes', 'hidden.show'): 'patches nothing (sys.modules)',
    ('startup.turn_on', 'settings.on_theano_configparser'): 'config.settings: CONFIGPARSER',
    ('compat', 'settings.register_settings_of_the_fixes'): 'config.settings: CONFIGPARSER',
    ('startup.turn_on', '_register_contexts'): 'gpuarray_fixes imports Theano',
    ('startup.turn_on', '_present_as_theano'): 'patches nothing (the backend name)',
    ('startup.turn_on', '_install_adapter'): 'keras_adapter.install reads sys.modules',
}


@pytest.mark.parametrize('module,name,args,target', HOOKS,
                         ids=['%s.%s%s' % (m, n, a or '') for m, n, a, _ in HOOKS])
def test_a_wrong_target_makes_a_patch_refuse(module, name, args, target):
    """Given a module where every target is wrong, the hook raises
    PatchTargetError naming one of them, before changing anything."""
    wrong = wrong_module(target)
    before = _contents(wrong)
    with pytest.raises(PatchTargetError) as refused:
        _hook(module, name, *args)(wrong)
    message = str(refused.value)
    named = [e.target for e in _expectations() if message.startswith(
        'theano_multigpu patches %s (' % e.target)]
    assert named and named[0].startswith(target), message
    assert 'install it (pip install' in message, message
    assert _contents(wrong) == before


def test_every_hook_is_tried_on_a_wrong_target(patch_sites):
    """HOOKS and WITH_THEANO name every import hook the package sets on a
    Theano or Keras module."""
    tried = set((m, n) for m, n, _, _ in HOOKS) | set(WITH_THEANO)
    found = set()
    for module, _, hook in patch_sites.hooks:
        package, name = module[len('theano_multigpu.'):], hook.split('(')[0]
        base, _, rest = name.partition('.')
        sibling = 'theano_multigpu.%s.%s' % (package.rpartition('.')[0], base)
        if rest and sibling in patch_sites.modules:   # shared_views.install
            package, name = sibling[len('theano_multigpu.'):], rest
        found.add((package, name))
    assert found - tried == set()
    assert len(found) > 20


def test_the_helpers_refuse_an_owner_not_the_targets():
    """replace and wrap set nothing where the owner is not the target's (a
    class that moved), or where the expectation of an owner does not state
    the attribute patched."""
    from theano_multigpu.compat import keras_fixes
    from theano_multigpu.config.settings import CONFIGPARSER
    moved = type('Container', (), {'__module__': 'keras.engine.network',
                                   '__qualname__': 'Container',
                                   'load_weights': _wrong_function})
    with pytest.raises(PatchTargetError) as refused:
        patch_targets.wrap(keras_fixes.LOAD_WEIGHTS, moved, 'load_weights', lambda f: None)
    assert str(refused.value).startswith(
        'theano_multigpu patches keras.engine.topology.Container.load_weights (')
    assert 'but the patch was given keras.engine.network.Container.load_weights' in str(
        refused.value)
    assert moved.load_weights is _wrong_function
    configparser = types.ModuleType('theano.configparser')
    for name in CONFIGPARSER.names:
        setattr(configparser, name, _wrong_function)
    with pytest.raises(ValueError) as undeclared:
        patch_targets.replace(CONFIGPARSER, configparser, 'parse_config_string', None)
    assert "states nothing of 'parse_config_string'" in str(undeclared.value)
    assert not hasattr(configparser, 'parse_config_string')
    assert patch_targets.replace(CONFIGPARSER, configparser, 'config', None) is _wrong_function
    assert configparser.config is None


def test_edits_of_theanos_code_refuse_code_they_do_not_match():
    """The patches that edit Theano's code (C kernels, Scan's Python loop,
    the compile cache's key) check what they edit, with the same message:
    no assert, which ``python -O`` would drop."""
    from theano_multigpu.compat import gpu_kernels, theano_fixes
    tries = [
        ('theano.gpuarray.pool.GpuAveragePoolGrad',
         lambda: gpu_kernels.corrected_average_pool_grad('KERNEL void ave_pool2d_grad() {}')),
        ('theano.gpuarray.pool.GpuPool', lambda: gpu_kernels.corrected_pool_output_shape(
            {'support_code': '#define OUTPUT_DIMS(a, b, c, d) 0', 'support_code_struct': ''})),
        ('theano.scan_module.scan_op.Scan.execute',
         lambda: theano_fixes._edited_scan_execute(_wrong_function, {})),
        ('theano.gof.cc.CLinker.cmodule_key_', lambda: theano_fixes._edited_function(
            _wrong_function, theano_fixes._CMODULE_KEY_EDITS, {}, theano_fixes.CMODULE_KEY, {})),
    ]
    for target, attempt in tries:
        with pytest.raises(PatchTargetError) as refused:
            attempt()
        message = str(refused.value)
        assert message.startswith('theano_multigpu patches %s (' % target), message
        assert "and expects Theano 1.0.5's" in message, message
        assert 'found them [0' in message or 'found it 0 times' in message, message
        assert 'install it (pip install theano==1.0.5' in message, message
