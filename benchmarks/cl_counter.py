"""Counts of the OpenCL programs a process builds and the kernels it makes.

libgpuarray opens libOpenCL with dlopen and takes each entry point with
dlsym, so a library preloaded to wrap ``clBuildProgram`` is never called.
The library built here wraps ``dlsym`` itself: asked for one of the
counted entry points, it hands back a wrapper that counts each call, then
calls the real one.

    path = cl_counter.build(directory)     # once; then, in a child with
    env['LD_PRELOAD'] = path               # this in its environment:
    cl_counter.counts()                    # {'programs_built': 3, ...}

A ``dlsym(RTLD_NEXT, name)`` that another library makes resolves after this
library, not after its caller: only libraries that look up OpenCL this way
should run under it (libgpuarray and pygpu do not use RTLD_NEXT).
"""
import ctypes
import os
import subprocess

__all__ = ['COUNTED', 'build', 'counts', 'programs']

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
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

long cl_counter_programs_built, cl_counter_programs_linked, cl_counter_sources_created,
     cl_counter_kernels_created;
static void *real_build, *real_link, *real_source, *real_kernel;

typedef int32_t (*build_fn)(void *, uint32_t, const void *, const char *, void *, void *);
typedef void *(*link_fn)(void *, uint32_t, const void *, const char *, uint32_t,
                         const void *, void *, void *, int32_t *);
typedef void *(*source_fn)(void *, uint32_t, const char **, const size_t *, int32_t *);
typedef void *(*kernel_fn)(void *, const char *, int32_t *);

static void count(long *counter) { __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED); }
static void *real(void **entry) { return __atomic_load_n(entry, __ATOMIC_ACQUIRE); }
static void *keep(void **entry, void *found, void *wrapper) {
  __atomic_store_n(entry, found, __ATOMIC_RELEASE);
  return wrapper;
}

static int32_t counting_build(void *p, uint32_t n, const void *d, const char *o, void *f,
                              void *u) {
  count(&cl_counter_programs_built);
  return ((build_fn)real(&real_build))(p, n, d, o, f, u);
}
static void *counting_link(void *c, uint32_t n, const void *d, const char *o, uint32_t np,
                           const void *ps, void *f, void *u, int32_t *e) {
  count(&cl_counter_programs_linked);
  return ((link_fn)real(&real_link))(c, n, d, o, np, ps, f, u, e);
}
static void *counting_source(void *c, uint32_t n, const char **s, const size_t *l,
                             int32_t *e) {
  count(&cl_counter_sources_created);
  return ((source_fn)real(&real_source))(c, n, s, l, e);
}
static void *counting_kernel(void *p, const char *name, int32_t *e) {
  count(&cl_counter_kernels_created);
  return ((kernel_fn)real(&real_kernel))(p, name, e);
}

void *dlsym(void *handle, const char *name) {
  static void *(*real_dlsym)(void *, const char *);
  /* glibc's dlsym: its version on x86-64 (2.34, then 2.2.5), AArch64 (2.17). */
  static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", NULL};
  for (int i = 0; !real_dlsym && versions[i]; i++)
    real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", versions[i]);
  if (!real_dlsym) {
    static const char message[] = "cl_counter: glibc's dlsym not found\n";
    write(2, message, sizeof(message) - 1);
    abort();
  }
  void *found = real_dlsym(handle, name);
  if (!found || !name) return found;
  if (!strcmp(name, "clBuildProgram")) return keep(&real_build, found, (void *)counting_build);
  if (!strcmp(name, "clLinkProgram")) return keep(&real_link, found, (void *)counting_link);
  if (!strcmp(name, "clCreateProgramWithSource"))
    return keep(&real_source, found, (void *)counting_source);
  if (!strcmp(name, "clCreateKernel")) return keep(&real_kernel, found, (void *)counting_kernel);
  return found;
}
'''


def build(directory):
    """The path of the counting library, compiled into ``directory`` with
    the system's C compiler (``cc``) unless it is there already;
    RuntimeError with the compiler's words when it cannot be built."""
    path = os.path.join(directory, 'libclcounter.so')
    if not os.path.exists(path):
        source = os.path.join(directory, 'cl_counter.c')
        with open(source, 'w') as f:
            f.write(_SOURCE)
        try:
            subprocess.run(['cc', '-shared', '-fPIC', '-O2', '-o', path, source, '-ldl'],
                           check=True, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.CalledProcessError) as error:
            raise RuntimeError('cl_counter needs a C compiler, cc, to build %s from %s: %s %s'
                               % (path, source, error, getattr(error, 'stderr', '') or ''))
    return path


def counts():
    """Each count so far in this process, by name; RuntimeError when the
    library is not preloaded (LD_PRELOAD)."""
    process = ctypes.CDLL(None)
    try:
        return dict((name, ctypes.c_long.in_dll(process, 'cl_counter_' + name).value)
                    for _, name in COUNTED)
    except ValueError:
        raise RuntimeError('cl_counter.counts() needs the counting library preloaded: run the '
                           'process with LD_PRELOAD=<cl_counter.build(directory)>; LD_PRELOAD '
                           'is %r' % os.environ.get('LD_PRELOAD'))


def programs():
    """The OpenCL programs this process built so far: built whole, or
    compiled and linked (libgpuarray's way); RuntimeError as ``counts``."""
    found = counts()
    return found['programs_built'] + found['programs_linked']
