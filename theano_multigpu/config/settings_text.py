"""The settings table (``settings.SETTINGS``) written out for people: the
README's table, theanorc.example and a plain listing.

``python -m theano_multigpu settings --write`` rewrites README.rst's table
and theanorc.example from the table; tests/test_settings.py fails when they
differ from what it writes.  Pure functions: no Theano, no Keras, no device.
"""
import os
import re
import textwrap

from ..errors import ConfigurationError
from .settings import LEGACY_FLAGS, SETTINGS

__all__ = ['shown_default', 'rst_table', 'theanorc', 'listing', 'readme_table',
           'readme_with_table',
           'README_BEGIN', 'README_END', 'write']

README_BEGIN = ('.. The settings table, written by `python -m theano_multigpu settings '
                '--write` from theano_multigpu/config/settings.py: edit it there.')
README_END = '.. End of the settings table.'

_MEANING_WIDTH = 46

_THEANORC_HEAD = """\
# theano_multigpu: an example ~/.theanorc (or set THEANORC=path/to/file).
# Written by `python -m theano_multigpu settings --write` from
# theano_multigpu/config/settings.py: edit the settings there.
# Every setting here can also go in THEANO_FLAGS, which wins over this file:
#   THEANO_FLAGS='floatX=float32,contexts=dev0->cuda0;dev1->cuda1,multigpu.mode=batch'

[global]
floatX = float32
# Leave device at cpu: the contexts below say which GPUs take part.
device = cpu
# name->device pairs separated by ';'.  Several names may share one device
# (each gets a context of its own).  Devices: cuda0, cuda1, ... or, without a
# CUDA GPU, pocl's OpenCL devices opencl0:0, opencl0:1 (POCL_DEVICES="pthread pthread").
contexts = dev0->cuda0;dev1->cuda1;dev2->cuda2;dev3->cuda3

[multigpu]
"""

_THEANORC_TAIL = """
# Flags of the old CUDA backend (%s), which Theano 1.0 removed and
# rejects at import, are translated under the shim with a one-line notice:
#   device=gpu / gpuN   ->  device=cuda / cudaN   (also init_gpu_device)
#   lib.cnmem=X         ->  gpuarray.preallocate=X
# [lib]
# cnmem = 0.8
""" % ', '.join(LEGACY_FLAGS)


def _wrap(text, width, indent):
    """``text`` wrapped to ``width`` after ``indent``; a span in backquotes
    (a command) stays on one line."""
    glue = '\x00'
    kept = re.sub(r'`[^`]*`', lambda span: span.group(0).replace(' ', glue), text)
    return [line.replace(glue, ' ') for line in textwrap.wrap(
        kept, width, initial_indent=indent, subsequent_indent=indent,
        break_on_hyphens=False, break_long_words=False)]


def shown_default(setting):
    """The default as a person reads it: True/False, a value, or what an
    empty value means ('(all)')."""
    if setting.kind == 'bool':
        return str(bool(setting.default))
    return setting.shown(setting.default)


def rst_table(settings=SETTINGS):
    """README's table of the settings (reStructuredText, a simple table)."""
    rows = [('``%s``' % s.name, shown_default(s),
             textwrap.wrap(s.summary, _MEANING_WIDTH, break_on_hyphens=False))
            for s in settings]
    widths = (max(len('setting'), max(len(r[0]) for r in rows)),
              max(len('default'), max(len(r[1]) for r in rows)),
              _MEANING_WIDTH)
    rule = '  '.join('=' * w for w in widths)

    def line(*cells):
        return '  '.join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [rule, line('setting', 'default', 'meaning'), rule]
    for name, default, meaning in rows:
        out.append(line(name, default, meaning[0]))
        out.extend(line('', '', more) for more in meaning[1:])
    out.append(rule)
    return '\n'.join(out) + '\n'


def _value(setting):
    if setting.kind == 'bool':
        return str(bool(setting.default))
    return setting.default


def theanorc(settings=SETTINGS):
    """theanorc.example: the [global] flags the contexts need, then every
    setting with its help and its default."""
    out = [_THEANORC_HEAD.rstrip('\n')]
    for setting in settings:
        out.extend(_wrap(setting.help, 78, '# '))
        out.append(('%s = %s' % (setting.option, _value(setting))).rstrip())
    return '\n'.join(out) + '\n' + _THEANORC_TAIL


def listing(settings=SETTINGS):
    """``python -m theano_multigpu settings``: every setting, its default and
    its help."""
    out = []
    for setting in settings:
        out.append('%s (default: %s)' % (setting.name, shown_default(setting)))
        out.extend(_wrap(setting.help, 76, '    '))
    return '\n'.join(out) + '\n'


def _table_span(text, where):
    """(start, end) of the generated table's lines between the markers."""
    lines = text.split('\n')
    try:
        begin, end = lines.index(README_BEGIN), lines.index(README_END)
    except ValueError:
        raise ConfigurationError(
            '%s expects the settings table between the lines %r and %r, but one '
            'is missing; put them back around the table' % (where, README_BEGIN, README_END))
    return begin, end


def readme_table(text, where='README.rst'):
    """The table as README ``text`` has it (between the markers, without the
    blank lines around it)."""
    begin, end = _table_span(text, where)
    return '\n'.join(text.split('\n')[begin + 1:end]).strip('\n') + '\n'


def readme_with_table(text, where='README.rst'):
    """README ``text`` with the table between its markers written anew."""
    begin, end = _table_span(text, where)
    lines = text.split('\n')
    return '\n'.join(lines[:begin + 1] + [''] + rst_table().rstrip('\n').split('\n')
                     + [''] + lines[end:])


def write(root):
    """Rewrite ``root``/README.rst's table and ``root``/theanorc.example;
    the paths changed."""
    readme = os.path.join(root, 'README.rst')
    if not os.path.isfile(readme):
        raise ConfigurationError(
            'settings --write expects the repository root (with README.rst), but '
            '%r has no README.rst; run it from the root or pass the root' % root)
    changed = []
    with open(readme) as f:
        text = f.read()
    for path, new in ((readme, readme_with_table(text, readme)),
                      (os.path.join(root, 'theanorc.example'), theanorc())):
        old = open(path).read() if os.path.exists(path) else None
        if old != new:
            with open(path, 'w') as f:
                f.write(new)
            changed.append(path)
    return changed
