"""``make bench``: every benchmark, each writing its figures to
benchmarks/results.json and benchmarks/results.md."""
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accumulate  # noqa: E402
import batchnorm  # noqa: E402
import deep_models  # noqa: E402
import batchwise  # noqa: E402
import c_compile  # noqa: E402
import capacity  # noqa: E402
import compile as compile_times  # noqa: E402
import layerwise  # noqa: E402
import mpi  # noqa: E402
import one_context  # noqa: E402
import opencl  # noqa: E402
import scan_cost  # noqa: E402
import sharding  # noqa: E402
import startup  # noqa: E402
import whole_batch  # noqa: E402
import window_sync  # noqa: E402


def main():
    print('machine: %s, %d CPUs, Python %s' % (platform.machine(), os.cpu_count(),
                                               platform.python_version()), flush=True)
    startup.main([])
    c_compile.main([])
    scan_cost.main([])
    one_context.main([])
    opencl.main([])
    batchwise.main([])
    sharding.main([])
    accumulate.main([])
    capacity.main([])
    batchnorm.main([])
    whole_batch.main([])
    deep_models.main([])
    compile_times.main([])
    layerwise.main([])
    mpi.main([])
    window_sync.main([])
    print('figures written to benchmarks/results.json and benchmarks/results.md')


if __name__ == '__main__':
    main()
