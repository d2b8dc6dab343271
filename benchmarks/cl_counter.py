"""Counts of the OpenCL programs a process builds and the kernels it makes,
and the time the OpenCL compiler took.

libgpuarray opens libOpenCL with dlopen and takes each entry point with
dlsym, so a library preloaded to wrap ``clBuildProgram`` is never called.
The library built here wraps ``dlsym`` itself: asked for one of the
counted entry points, it hands back a wrapper that counts each call, then
calls the real one.

    path = cl_counter.build(directory)     # once; then, in a child with
    env['LD_PRELOAD'] = path               # this in its environment:
    cl_counter.counts()                    # {'programs_built': 3, ...}
    cl_counter.compiler_seconds()          # in clBuildProgram, clCompileProgram
                                           # and clLinkProgram, all threads

A ``dlsym(RTLD_NEXT, name)`` that another library makes resolves after this
library, not after its caller: only libraries that look up OpenCL this way
should run under it (libgpuarray and pygpu do not use RTLD_NEXT).
"""
import ctypes
import os
import subprocess

__all__ = ['COUNTED', 'build', 'counts', 'programs', 'compiler_seconds']

# What is counted: an entry point, and the name of its count.  libgpuarray
# builds a program with clCompileProgram and clLinkProgram (its header and
# the kernel's source, two sources per program) or with clBuildProgram.
COUNTED = (('clBuildProgram', 'programs_built'), ('clCompileProgram', 'programs_compiled'),
           ('clLinkProgram', 'programs_linked'),
           ('clCreateProgramWithSource', 'sources_created'),
           ('clCreateProgramWithBinary', 'binaries_loaded'),
           ('clCreateKernel', 'kernels_created'))

_SOURCE = r'''
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

long cl_counter_programs_built, cl_counter_programs_compiled, cl_counter_programs_linked,
     cl_counter_sources_created, cl_counter_binaries_loaded, cl_counter_kernels_created;
/* Nanoseconds inside the compiler's entry points, summed over threads. */
long cl_counter_compiler_ns;
static void *real_build, *real_compile, *real_link, *real_source, *real_binary, *real_kernel;

typedef int32_t (*build_fn)(void *, uint32_t, const void *, const char *, void *, void *);
typedef int32_t (*compile_fn)(void *, uint32_t, const void *, const char *, uint32_t,
                              const void *, const char **, void *, void *);
typedef void *(*link_fn)(void *, uint32_t, const void *, const char *, uint32_t,
                         const void *, void *, void *, int32_t *);
typedef void *(*source_fn)(void *, uint32_t, const char **, const size_t *, int32_t *);
typedef void *(*binary_fn)(void *, uint32_t, const void *, const size_t *,
                           const unsigned char **, int32_t *, int32_t *);
typedef void *(*kernel_fn)(void *, const char *, int32_t *);

static void count(long *counter) { __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED); }
static void *real(void **entry) { return __atomic_load_n(entry, __ATOMIC_ACQUIRE); }
static void *keep(void **entry, void *found, void *wrapper) {
  __atomic_store_n(entry, found, __ATOMIC_RELEASE);
  return wrapper;
}
static long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}
static void add_since(long start) {
  __atomic_add_fetch(&cl_counter_compiler_ns, now_ns() - start, __ATOMIC_RELAXED);
}

static int32_t counting_build(void *p, uint32_t n, const void *d, const char *o, void *f,
                              void *u) {
  long start = now_ns();
  count(&cl_counter_programs_built);
  int32_t result = ((build_fn)real(&real_build))(p, n, d, o, f, u);
  add_since(start);
  return result;
}
static int32_t counting_compile(void *p, uint32_t n, const void *d, const char *o,
                                uint32_t nh, const void *h, const char **hn, void *f, void *u) {
  long start = now_ns();
  count(&cl_counter_programs_compiled);
  int32_t result = ((compile_fn)real(&real_compile))(p, n, d, o, nh, h, hn, f, u);
  add_since(start);
  return result;
}
static void *counting_link(void *c, uint32_t n, const void *d, const char *o, uint32_t np,
                           const void *ps, void *f, void *u, int32_t *e) {
  long start = now_ns();
  count(&cl_counter_programs_linked);
  void *result = ((link_fn)real(&real_link))(c, n, d, o, np, ps, f, u, e);
  add_since(start);
  return result;
}
static void *counting_source(void *c, uint32_t n, const char **s, const size_t *l,
                             int32_t *e) {
  count(&cl_counter_sources_created);
  return ((source_fn)real(&real_source))(c, n, s, l, e);
}
static void *counting_binary(void *c, uint32_t n, const void *d, const size_t *l,
                             const unsigned char **b, int32_t *st, int32_t *e) {
  count(&cl_counter_binaries_loaded);
  return ((binary_fn)real(&real_binary))(c, n, d, l, b, st, e);
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
  if (!strcmp(name, "clCompileProgram"))
    return keep(&real_compile, found, (void *)counting_compile);
  if (!strcmp(name, "clLinkProgram")) return keep(&real_link, found, (void *)counting_link);
  if (!strcmp(name, "clCreateProgramWithSource"))
    return keep(&real_source, found, (void *)counting_source);
  if (!strcmp(name, "clCreateProgramWithBinary"))
    return keep(&real_binary, found, (void *)counting_binary);
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


def compiler_seconds():
    """Seconds this process spent in the OpenCL compiler (clBuildProgram,
    clCompileProgram, clLinkProgram), summed over threads; RuntimeError as
    ``counts``."""
    counts()
    return ctypes.c_long.in_dll(ctypes.CDLL(None), 'cl_counter_compiler_ns').value / 1e9
