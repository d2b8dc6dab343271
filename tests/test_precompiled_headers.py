"""Precompiled headers for Theano's C modules (compat.precompiled_headers).

In-process: when a block of #include lines is precompiled, what a changed
header or a failed build does.  In two children on the CPU, each with a
fresh compile cache: a Keras model trains to the same bits with and
without the headers, and g++ reads the .gch it was given.
"""
import glob
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import requires, run_side_by_side, run_python
from theano_multigpu.compat import precompiled_headers
from theano_multigpu.compat.precompiled_headers import (BUILD_AFTER, HEADER, PrecompiledHeaders,
                                                        leading_includes)

needs_gxx = requires(shutil.which('g++') is not None, 'needs g++')


def test_the_leading_block_is_every_include_line_before_the_first_other_line():
    block, rest = leading_includes('#include <a.h>\n#include "b.h"\nint x;\n#include <c.h>\n')
    assert block == ['#include <a.h>', '#include "b.h"']
    assert rest == 'int x;\n#include <c.h>\n'
    assert leading_includes('// no includes first\n#include <a.h>\n')[0] == []


@needs_gxx
def test_a_block_is_precompiled_at_its_fourth_module_and_again_when_a_header_changes(tmp_path):
    own = tmp_path / 'own.h'
    own.write_text('#pragma once\nstatic const int own_value = 1;\n')
    block = ['#include <vector>', '#include "%s"' % own]
    headers = PrecompiledHeaders(str(tmp_path / 'pch'), 'g++')
    found = [headers.header_for(block, ['-O0']) for _ in range(BUILD_AFTER)]
    assert found[:BUILD_AFTER - 1] == [None] * (BUILD_AFTER - 1)
    header = found[-1]
    assert header is not None and os.path.exists(header + '.gch')
    assert open(header).read().splitlines() == block
    recorded = dict(json.load(open(os.path.join(os.path.dirname(header), 'files.json'))))
    assert str(own) in recorded
    # Other flags: another folder, counted from zero.
    assert headers.header_for(block, ['-O2']) is None

    # A header the .gch read has changed: a new process rebuilds it.
    built_at = os.stat(header + '.gch').st_mtime_ns
    own.write_text('#pragma once\nstatic const int own_value = 22;\n')
    again = PrecompiledHeaders(str(tmp_path / 'pch'), 'g++').header_for(block, ['-O0'])
    assert again == header
    assert os.stat(header + '.gch').st_mtime_ns != built_at
    recorded = dict(json.load(open(os.path.join(os.path.dirname(header), 'files.json'))))
    assert recorded[str(own)][0] == own.stat().st_size


@needs_gxx
def test_a_block_that_cannot_be_precompiled_is_recorded_and_not_tried_again(tmp_path):
    block = ['#include <theano_multigpu_no_such_header.h>']
    headers = PrecompiledHeaders(str(tmp_path / 'pch'), 'g++')
    assert [headers.header_for(block, []) for _ in range(BUILD_AFTER + 2)] == \
        [None] * (BUILD_AFTER + 2)
    failed = glob.glob(str(tmp_path / 'pch' / '*' / 'failed'))
    assert len(failed) == 1
    assert 'theano_multigpu_no_such_header.h' in open(failed[0]).read()
    # Counted up to the build only.
    modules = os.path.join(os.path.dirname(failed[0]), 'modules')
    assert os.path.getsize(modules) == BUILD_AFTER


# A Keras MLP on the digits, trained 3 steps; g++'s commands recorded.
TRAIN = r'''
import json, sys
import numpy as np
import theano.gof.cmodule as cmodule
commands = []
popen = cmodule.output_subprocess_Popen
def recorded(command, *args, **kwargs):
    commands.append(list(command))
    return popen(command, *args, **kwargs)
cmodule.output_subprocess_Popen = recorded
from sklearn.datasets import load_digits
from keras.models import Sequential
from keras.layers import Dense, Dropout
data = load_digits()
x = (data.data[:96] / 16.0).astype('float32')
y = np.eye(10, dtype='float32')[data.target[:96]]
np.random.seed(0)
model = Sequential([Dense(24, input_dim=64, activation='tanh'), Dense(16, activation='relu'),
                    Dense(10, activation='softmax')])
model.compile('adam', 'categorical_crossentropy')
model.fit(x, y, batch_size=32, nb_epoch=1, verbose=0, shuffle=False)
np.savez(sys.argv[1], *model.get_weights())
json.dump(commands, open(sys.argv[2], 'w'))
'''


def test_a_model_trains_to_the_same_bits_and_gxx_reads_the_header(tmp_path):
    def train(use, slot):
        home = tmp_path / ('home_%s' % use)
        home.mkdir()
        compiledir = tmp_path / ('compiledir_%s' % use)
        flags = 'base_compiledir=%s,multigpu.precompiled_headers=%s' % (compiledir, use)
        run_python(home, TRAIN, flags=flags, timeout=900,
                   args=[str(home / 'weights.npz'), str(home / 'commands.json')])
        weights = np.load(str(home / 'weights.npz'))
        return ([weights['arr_%d' % i] for i in range(len(weights.files))],
                json.load(open(str(home / 'commands.json'))),
                glob.glob(str(compiledir / '*' / precompiled_headers.FOLDER / '*' / (HEADER + '.gch'))))

    results = run_side_by_side(['True', 'False'], train)
    with_headers, commands, built = results['True']
    without, plain_commands, none_built = results['False']
    assert len(with_headers) == len(without) == 6
    for a, b in zip(with_headers, without):
        assert np.array_equal(a, b)
    assert built and not none_built

    sources = [command[command.index('-o') + 2] for command in commands]
    read_header = [source for source in sources if HEADER in open(source).readline()]
    assert len(read_header) >= len(sources) // 2, (len(read_header), len(sources))
    assert not any(HEADER in open(command[command.index('-o') + 2]).readline()
                   for command in plain_commands)
    # g++ -H marks a precompiled header it reads with '!'.
    command = next(c for c in commands if c[c.index('-o') + 2] == read_header[-1])
    command[command.index('-o') + 1] = str(tmp_path / 'again.so')
    done = subprocess.run(command + ['-H', '-Winvalid-pch'], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.startswith('! ') and '.gch' in done.stderr.splitlines()[0], \
        done.stderr[:500]


def test_with_the_fixes_alone_the_settings_they_read_are_theanos(home):
    """THEANO_MULTIGPU_COMPAT=1 registers the settings the fixes read, so
    False turns the headers off there too."""
    result = run_python(home, 'import theano; c = theano.config.multigpu; '
                              'print(c.precompiled_headers, c.scan_loop)',
                        backend='theano', extra_env={'THEANO_MULTIGPU_COMPAT': '1'},
                        flags='device=cpu,multigpu.precompiled_headers=False,'
                              'multigpu.scan_loop=python')
    assert result.stdout.split() == ['False', 'python'], result.stdout + result.stderr
    assert 'does not recognise' not in result.stderr, result.stderr
