"""The suite's own rules: a part the suite needs (pocl, mpirun, Keras
1.0.1, g++ with OpenBLAS, dpkg-deb) skips where it is missing, but fails
under CI=true, where tools/setup.sh installed everything."""
import ast
import os

import pytest

from conftest import REPO, missing, requires

TESTS = os.path.join(REPO, 'tests')


def test_a_missing_part_skips_here_and_fails_under_ci(monkeypatch):
    monkeypatch.delenv('CI', raising=False)
    with pytest.raises(pytest.skip.Exception, match='needs mpirun'):
        missing('needs mpirun')
    monkeypatch.setenv('CI', 'true')
    with pytest.raises(pytest.fail.Exception, match='CI=true.*needs mpirun'):
        missing('needs mpirun')


def test_the_requires_mark_carries_what_is_missing():
    mark = requires(None, 'needs dpkg-deb').mark
    assert mark.name == 'requires'
    assert mark.kwargs == {'present': False, 'reason': 'needs dpkg-deb'}


def _skips(path):
    """(line, call) of each pytest.skip / pytest.mark.skipif in ``path``."""
    with open(path) as f:
        tree = ast.parse(f.read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ('skip', 'skipif', 'importorskip'):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_every_skip_goes_through_requires_or_missing():
    """Only conftest.missing skips (and test_sweep.py, whose phases are
    skipped on purpose outside make sweep): a plain skip would pass CI
    without running."""
    plain = {}
    for name in sorted(os.listdir(TESTS)):
        if name.endswith('.py') and name not in ('conftest.py', 'test_sweep.py',
                                                  'test_suite_rules.py'):
            found = _skips(os.path.join(TESTS, name))
            if found:
                plain[name] = found
    assert not plain, ('skip with conftest.requires or conftest.missing, which fail under '
                       'CI=true: %s' % plain)
