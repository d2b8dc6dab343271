"""The documentation: docs/ builds with Sphinx with warnings as errors (as
``make docs`` does), README.rst is valid reStructuredText, and every file
README.rst and docs/ link to is in the repository.  No Theano, no device.

Sphinx is pinned in requirements.txt; where it is missing the test skips,
except under CI=true, where the set-up should have installed it: there it
fails.
"""
import pathlib
import re
import subprocess
import sys

import pytest

from conftest import missing

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / 'docs'


def _require(module):
    try:
        return __import__(module)
    except ImportError:
        missing('%s is not installed; tools/setup.sh installs it from requirements.txt '
                '(make test or make docs)' % module)


def test_docs_build_with_warnings_as_errors(tmp_path):
    _require('sphinx')
    result = subprocess.run(
        [sys.executable, '-m', 'sphinx', '-W', '--keep-going', '-q', '-b', 'html',
         '-d', str(tmp_path / 'doctrees'), str(DOCS), str(tmp_path / 'html')],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (
        'sphinx-build -W expected no warning in docs/, but it said:\n%s%s'
        % (result.stdout, result.stderr))
    pages = {p.stem for p in DOCS.glob('*.rst')}
    assert pages == {'index', 'design', 'mpi', 'compatibility', 'benchmarks',
                     'development', 'gpu_check'}
    assert {p.stem for p in (tmp_path / 'html').glob('*.html')} >= pages


def test_readme_is_valid_restructuredtext():
    _require('docutils')
    import docutils.core
    text = (ROOT / 'README.rst').read_text()
    # halt_level 2: a warning (a broken table, an unknown target) raises.
    docutils.core.publish_doctree(text, settings_overrides={
        'halt_level': 2, 'report_level': 2, 'file_insertion_enabled': False})


_LINK = re.compile(r'<([^<>`\s]+)>`_')


def _linked_files(path):
    """Relative file links (`text <path>`_) of ``path``, resolved."""
    for target in _LINK.findall(path.read_text()):
        if '://' in target:
            continue
        yield target, (path.parent / target.split('#')[0]).resolve()


@pytest.mark.parametrize('page', ['README.rst'] + ['docs/%s' % p.name for p in
                                                    sorted(DOCS.glob('*.rst'))])
def test_linked_files_exist(page):
    absent = [t for t, resolved in _linked_files(ROOT / page) if not resolved.exists()]
    assert absent == [], '%s links to files that are not in the repository: %s' % (
        page, absent)


def test_readme_points_to_every_docs_page_and_the_results():
    text = (ROOT / 'README.rst').read_text()
    for page in DOCS.glob('*.rst'):
        if page.stem != 'index':
            assert '<docs/%s>`_' % page.name in text, page.name
    assert '<benchmarks/results.md>`_' in text
