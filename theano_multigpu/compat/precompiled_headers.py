"""Precompiled headers for the C modules Theano compiles.

Every C module Theano builds starts with a block of ``#include`` lines
(Python.h, numpy, libgpuarray, the C++ library), the same for most of
them, and g++ spends most of a module's compile reading it: 0.29 s of a
0.34 s compile for an elementwise module at -O0.  Where a block recurs,
g++ reads it from a precompiled header (a ``.gch``) instead.

The rules this module keeps:

- A module's source compiles as Theano wrote it, except that its leading
  block of ``#include`` lines becomes one ``#include`` of a header holding
  exactly those lines (blank lines keep the line numbers): the module sees
  the same declarations in the same order.
- A header is precompiled with the flags of the module's compile, and its
  directory is keyed by the block, the compiler and those flags.  g++ uses
  a ``.gch`` only where the flags it was built with match; elsewhere it
  reads the header's text.
- A ``.gch`` is used only while every file it read is unchanged (size and
  time, recorded when it was built): g++ itself does not check.
- A block is precompiled at its ``BUILD_AFTER``-th module (a ``.gch`` of
  40 to 50 MB costs about three modules' compile), once; a failed build
  is recorded and not tried again.
- Files appear whole: each is written under a temporary name and renamed.
- A module that fails to compile with its header compiles again as Theano
  wrote it, so an error shows the original source; the header is then
  not used again.  Where the headers' folder cannot be written (read-only,
  full), modules compile as Theano wrote them.

``multigpu.precompiled_headers=False`` compiles every module as Theano
wrote it.
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile

from .. import importhook
from ..patch_targets import SourceDigest, wrap

__all__ = ['install', 'COMPILE_STR', 'PrecompiledHeaders', 'leading_includes']

COMPILE_STR = SourceDigest(
    'theano.gof.cmodule.GCC_compiler.compile_str', '25b7d51e8ade396e',
    'wrapped: a recurring block of #include lines is read from a precompiled header')

# The module of a block at which it is precompiled.
BUILD_AFTER = 4
# The folder, inside Theano's compiledir, of the precompiled headers.
FOLDER = 'theano_multigpu_pch'
HEADER = 'theano_multigpu_pch.h'


def leading_includes(src_code):
    """(the leading ``#include`` lines of ``src_code``, the rest): the
    lines as a list, the rest as text."""
    lines = src_code.split('\n')
    count = 0
    while count < len(lines) and lines[count].startswith('#include'):
        count += 1
    return lines[:count], '\n'.join(lines[count:])


def _write_whole(path, data):
    """Write ``data`` (bytes) to ``path`` under a temporary name, then rename."""
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix='.tmp-')
    with os.fdopen(handle, 'wb') as stream:
        stream.write(data)
    os.replace(temporary, path)


def _remove(*paths):
    for path in paths:
        try:
            os.remove(path)
        except OSError:
            pass


def _file_stamp(path):
    status = os.stat(path)
    return [status.st_size, status.st_mtime_ns]


def _dependencies(make_rule):
    """The files a ``-MD`` rule (``target: dep dep \\``) names; a space
    inside a path is written ``\\ ``."""
    text = make_rule.replace('\\\n', ' ').split(': ', 1)[1]
    return [path.replace('\\ ', ' ') for path in re.split(r'(?<!\\)\s+', text) if path]


class PrecompiledHeaders(object):
    """The precompiled headers of one process's compiles, under
    ``root`` (a folder of Theano's compiledir).  ``cxx`` is the compiler;
    ``enabled()`` says whether to use them now."""

    def __init__(self, root, cxx, enabled=lambda: True):
        self.root = root
        self.cxx = cxx
        self.enabled = enabled
        self._compiler_identity = None
        self._checked = set()    # folders whose .gch was found current
        self._failed = set()     # folders whose header failed in this process

    def compiler_identity(self):
        """The compiler's resolved path, size and time: a new compiler
        gets new folders."""
        if self._compiler_identity is None:
            path = shutil.which(self.cxx) or self.cxx
            real = os.path.realpath(path)
            try:
                self._compiler_identity = [real] + _file_stamp(real)
            except OSError:
                self._compiler_identity = [real]
        return self._compiler_identity

    def folder(self, block, flags):
        """The folder of the header of ``block`` compiled with ``flags``."""
        key = json.dumps([block, self.compiler_identity(), flags])
        return os.path.join(self.root, hashlib.sha256(key.encode('utf8')).hexdigest()[:24])

    def header_for(self, block, flags):
        """The path of a current precompiled header of ``block`` for
        ``flags``, or None (the block has not recurred enough, or its
        header cannot be built).  Counts this module of the block."""
        folder = self.folder(block, flags)
        header = os.path.join(folder, HEADER)
        if folder in self._checked:
            return header
        if folder in self._failed:
            return None
        os.makedirs(folder, exist_ok=True)
        if os.path.exists(os.path.join(folder, 'failed')):
            self._failed.add(folder)
            return None
        if self._current(folder):
            self._checked.add(folder)
            return header
        # One byte per module of the block: O_APPEND writes add up across
        # processes.
        with open(os.path.join(folder, 'modules'), 'ab') as stream:
            stream.write(b'.')
        if os.path.getsize(os.path.join(folder, 'modules')) < BUILD_AFTER:
            return None
        if self._build(folder, block, flags):
            self._checked.add(folder)
            return header
        return None

    def _current(self, folder):
        """Whether ``folder`` has a .gch whose files are all unchanged."""
        try:
            with open(os.path.join(folder, 'files.json')) as stream:
                files = json.load(stream)
            if not os.path.exists(os.path.join(folder, HEADER + '.gch')):
                return False
            return all(_file_stamp(path) == stamp for path, stamp in files)
        except (OSError, ValueError):
            return False

    def _build(self, folder, block, flags):
        """Precompile ``block`` with ``flags`` in ``folder``; False (and a
        ``failed`` file that says why) when g++ refuses it."""
        header = os.path.join(folder, HEADER)
        text = ('\n'.join(block) + '\n').encode('utf8')
        try:
            with open(header, 'rb') as stream:
                written = stream.read() == text
        except OSError:
            written = False
        if not written:   # a new time would make the .gch look stale
            _write_whole(header, text)
        handle, built = tempfile.mkstemp(dir=folder, prefix='.tmp-', suffix='.gch')
        os.close(handle)
        rule = built + '.d'
        command = [self.cxx] + flags + ['-x', 'c++-header', header, '-o', built,
                                        '-MD', '-MF', rule]
        try:
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise OSError('g++ exited %d: %s' % (done.returncode, done.stderr))
            with open(rule) as stream:
                files = [[os.path.abspath(path), _file_stamp(path)]
                         for path in _dependencies(stream.read())]
            # The .gch first: with the files of an older one, a new .gch
            # looks stale (built again), never the reverse.
            os.replace(built, header + '.gch')
            _write_whole(os.path.join(folder, 'files.json'), json.dumps(files).encode('utf8'))
            return True
        except OSError as error:
            _remove(built, rule)   # first: a full disk has room for the note then
            self.mark_failed(header, '%s\n%s' % (' '.join(command), error))
            return False
        finally:
            _remove(built, rule)

    def mark_failed(self, header, why):
        """Use ``header`` no more (a module compiled without it only); in
        this process even where the note cannot be written."""
        folder = os.path.dirname(header)
        self._checked.discard(folder)
        self._failed.add(folder)
        try:
            _write_whole(os.path.join(folder, 'failed'), why.encode('utf8'))
        except OSError:
            pass


def _header_flags(cmodule, config, include_dirs, preargs, hide_symbols):
    """The flags of GCC_compiler.compile_str's g++ command that shape the
    code (its -g, preargs, include folders and visibility), without its
    output, input, library and shared-library arguments."""
    include_dirs = [folder for folder in (include_dirs or []) if folder]
    include_dirs = include_dirs + cmodule.std_include_dirs()
    preargs = list(preargs or [])
    if config.cmodule.remove_gxx_opt:
        preargs = [flag for flag in preargs if not flag.startswith('-O')]
    flags = ['-g'] + preargs + ['-I%s' % folder for folder in include_dirs]
    if hide_symbols:
        flags.append('-fvisibility=hidden')
    return flags


def _with_precompiled_headers(cmodule, config, headers):
    """A wrapper of GCC_compiler.compile_str that reads a recurring
    leading block of #include lines from ``headers``."""
    def wrapper(compile_str):
        def compile_str_with_header(module_name, src_code, location=None, include_dirs=None,
                                    lib_dirs=None, libs=None, preargs=None, py_module=True,
                                    hide_symbols=True):
            def compile_source(source):
                return compile_str(module_name, source, location=location,
                                   include_dirs=include_dirs, lib_dirs=lib_dirs, libs=libs,
                                   preargs=preargs, py_module=py_module,
                                   hide_symbols=hide_symbols)
            block, rest = leading_includes(src_code)
            header = None
            if block and headers.enabled():
                flags = _header_flags(cmodule, config, include_dirs, preargs, hide_symbols)
                try:
                    header = headers.header_for(block, flags)
                except OSError:   # the headers' folder: a module compiles without
                    header = None
            if header is None:
                return compile_source(src_code)
            source = '\n'.join(['#include "%s"' % header] + [''] * (len(block) - 1) + [rest])
            try:
                return compile_source(source)
            except Exception as error:
                module = compile_source(src_code)
                headers.mark_failed(header, 'a module compiled without this header only: %s'
                                    % error)
                return module
        compile_str_with_header.__wrapped__ = compile_str
        return staticmethod(compile_str_with_header)
    return wrapper


def _enabled():
    import theano
    try:
        return bool(theano.config.multigpu.precompiled_headers)
    except AttributeError:  # the fixes installed after Theano was imported
        return True


def install():
    """Wrap Theano's GCC_compiler.compile_str once theano.gof.cmodule is
    imported."""
    importhook.after_import('theano.gof.cmodule', _wrap_compile_str)


def _wrap_compile_str(cmodule):
    """Wrap ``cmodule.GCC_compiler.compile_str`` (Theano 1.0.5's)."""
    def with_headers(compile_str):
        config = cmodule.config
        headers = PrecompiledHeaders(os.path.join(config.compiledir, FOLDER), config.cxx,
                                     _enabled)
        return _with_precompiled_headers(cmodule, config, headers)(compile_str)
    wrap(COMPILE_STR, cmodule.GCC_compiler, 'compile_str', with_headers)
