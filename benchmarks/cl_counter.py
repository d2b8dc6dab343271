"""Counts of the OpenCL programs a process builds and the kernels it makes.

libgpuarray opens libOpenCL with dlopen and takes each entry point with
dlsym, so a library preloaded to wrap ``clBuildProgram`` is never called.
The library built here wraps ``dlsym`` itself: asked for one of the
counted entry points, it hands back a wrapper that counts each call, then
calls the real one.

    path = cl_counter.build(directory)     # once; then, in a child with
    env['LD_PRELOAD'] = path               # this in its environment:
    cl_counter.counts()                    # {'programs_built': 3, ...}
"""
import ctypes
import os
import subprocess

__all__ = ['COUNTED', 'build', 'counts']

# What is counted: an entry point, and the name of its count.  libgpuarray
# builds a program with clCompileProgram and clLinkProgram (its header and
# the kernel's source, two sources per program) or with clBuildProgram.
COUNTED = (('clBuildProgram', 'programs_built'), ('clLinkProgram', 'programs_linked'),
           ('clCreateProgramWithSource', 'sources_created'),
           ('clCreateKernel', 'kernels_created'))

_SOURCE = r'''
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

long programs_built, programs_linked, sources_created, kernels_created;
static void *real_build, *real_link, *real_source, *real_kernel;

typedef int32_t (*build_fn)(void *, uint32_t, const void *, const char *, void *, void *);
typedef void *(*link_fn)(void *, uint32_t, const void *, const char *, uint32_t,
                         const void *, void *, void *, int32_t *);
typedef void *(*source_fn)(void *, uint32_t, const char **, const size_t *, int32_t *);
typedef void *(*kernel_fn)(void *, const char *, int32_t *);

static void count(long *counter) { __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED); }

static int32_t counting_build(void *p, uint32_t n, const void *d, const char *o, void *f,
                              void *u) {
  count(&programs_built);
  return ((build_fn)real_build)(p, n, d, o, f, u);
}
static void *counting_link(void *c, uint32_t n, const void *d, const char *o, uint32_t np,
                           const void *ps, void *f, void *u, int32_t *e) {
  count(&programs_linked);
  return ((link_fn)real_link)(c, n, d, o, np, ps, f, u, e);
}
static void *counting_source(void *c, uint32_t n, const char **s, const size_t *l,
                             int32_t *e) {
  count(&sources_created);
  return ((source_fn)real_source)(c, n, s, l, e);
}
static void *counting_kernel(void *p, const char *name, int32_t *e) {
  count(&kernels_created);
  return ((kernel_fn)real_kernel)(p, name, e);
}

void *dlsym(void *handle, const char *name) {
  static void *(*real_dlsym)(void *, const char *);
  if (!real_dlsym)
    real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!real_dlsym)
    real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  void *found = real_dlsym(handle, name);
  if (!found || !name) return found;
  if (!strcmp(name, "clBuildProgram")) { real_build = found; return (void *)counting_build; }
  if (!strcmp(name, "clLinkProgram")) { real_link = found; return (void *)counting_link; }
  if (!strcmp(name, "clCreateProgramWithSource")) {
    real_source = found; return (void *)counting_source;
  }
  if (!strcmp(name, "clCreateKernel")) { real_kernel = found; return (void *)counting_kernel; }
  return found;
}
'''


def build(directory):
    """The path of the counting library, compiled into ``directory`` (with
    the C compiler Theano uses, ``cc``) unless it is there already."""
    path = os.path.join(directory, 'libclcounter.so')
    if not os.path.exists(path):
        source = os.path.join(directory, 'cl_counter.c')
        with open(source, 'w') as f:
            f.write(_SOURCE)
        subprocess.run(['cc', '-shared', '-fPIC', '-O2', '-o', path, source, '-ldl'],
                       check=True, capture_output=True, timeout=120)
    return path


def counts():
    """Each count so far in this process, by name; RuntimeError when the
    library is not preloaded (LD_PRELOAD)."""
    process = ctypes.CDLL(None)
    try:
        return dict((name, ctypes.c_long.in_dll(process, name).value) for _, name in COUNTED)
    except ValueError:
        raise RuntimeError('cl_counter.counts() needs the counting library preloaded: run the '
                           'process with LD_PRELOAD=<cl_counter.build(directory)>; LD_PRELOAD '
                           'is %r' % os.environ.get('LD_PRELOAD'))
