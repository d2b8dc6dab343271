"""A long-lived child that builds models and times their training steps.

Driven over stdin/stdout by one_context.py, one JSON request per line:
``{"build": NAME}`` builds NAME (benchmarks/models.py, size 'bench') and
runs warm-up steps (compiling); ``{"time": NAME, "steps": K}`` answers the
seconds of each of K ``train_on_batch`` calls (and, with benchmarks/cl_counter.py's
library preloaded, the OpenCL programs they built); ``{"compile": NAME}`` builds
NAME afresh and answers the seconds its train function takes to compile;
``{"moved": NAME}`` (under the shim) answers the bytes the shim's transfers
moved in one step and the model's parameter bytes; ``{"placement": NAME}``
(layer-wise) answers, per context, the bytes resident for the compiled
train function and the bytes the plan counted for NAME's layers;
``{"traffic": NAME}`` answers one step's bytes each context sent to and
received from the others, each context's resident bytes and, with
multigpu.measure_peak, the most bytes each held during the step (else
None).  Each reply is one JSON line.

Under mpirun every rank runs it: rank 0 reads the requests and passes each
to the others (which wait without spinning, so a worker not being timed
leaves the cores alone), all ranks carry it out, rank 0 replies.  Then
``{"time": ...}`` also answers the seconds spent in the MPI collectives, and
``{"fused_sum": BYTES, "repeats": R}`` answers the seconds of R fused sums
of that many bytes over the ranks, of R MPI Allreduces, and of R copies of
the same bytes (every rank copying at once).
"""
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import build  # noqa: E402

WARM_UP_STEPS = 3
# Started by the harness's mpirun (Open MPI) as one of several ranks.  Told
# from the environment: importing theano_multigpu turns the shim on, and the
# stock side of one_context.py must stay stock.
UNDER_MPI = int(os.environ.get('OMPI_COMM_WORLD_SIZE', '1')) > 1
RANK = int(os.environ.get('OMPI_COMM_WORLD_RANK', '0'))


def placement_of(model):
    """{'resident': {context: bytes}, 'planned': {context: bytes}}."""
    from theano_multigpu.config import mesh
    from theano_multigpu.graph import plan, report as placement
    model = getattr(model, 'model', model)
    current = mesh.current()
    resident = placement.resident_bytes(model.train_function.function, current)
    planned = dict((name, int(sum(plan.layer_needs(layer).total for layer in model.layers
                                  if plan.layer_context(layer) == name)))
                   for name in current.names)
    return {'resident': dict((name, int(resident.get(name, 0))) for name in current.names),
            'planned': planned}


def traffic_of(case):
    """One step's bytes each context sent to and received from the other
    contexts (the host's copies of the batch left out), each context's
    resident bytes and measured peak (or None), and the parameter bytes."""
    from theano_multigpu.config import mesh
    from theano_multigpu.graph import report, transfer
    from theano_multigpu.graph.peak import peak_of
    current = mesh.current()
    name_of = dict((current.graph_name(name), name) for name in current.names)
    before = dict(transfer.bytes_moved())
    case.model.train_on_batch(case.x, case.y)
    sent, received = dict.fromkeys(current.names, 0), dict.fromkeys(current.names, 0)
    for (source, destination), n in transfer.bytes_moved().items():
        n -= before.get((source, destination), 0)
        if source in name_of and destination in name_of:
            sent[name_of[source]] += n
            received[name_of[destination]] += n
    model = getattr(case.model, 'model', case.model)
    resident = report.resident_bytes(model.train_function.function, current)
    return {'sent': sent, 'received': received,
            'resident': dict((name, int(resident.get(name, 0))) for name in current.names),
            'peak': peak_of(model.train_function.function),
            'parameter_bytes': sum(w.nbytes for w in case.model.get_weights())}


def capacity_probe(name, dims, batch):
    """One train step of NAME at ``dims`` and ``batch`` (compiled afresh,
    the model before it freed): {'fits': False, 'why': the plan's refusal}
    or {'fits': True, 'parameters', and per context 'resident', 'planned'
    peak and measured 'peak' (with multigpu.measure_peak)}; {'error': what
    went wrong} for any other error."""
    import gc
    from theano_multigpu.config import mesh
    from theano_multigpu.errors import PlanError
    from theano_multigpu.graph import peak_plan, report
    from theano_multigpu.graph.peak import peak_of
    gc.collect()   # the model before this one, and its weights
    case = build(name, size='bench', batch=batch, dims=dims)
    try:
        case.model.train_on_batch(case.x, case.y)
    except PlanError as error:
        return {'fits': False, 'why': str(error).splitlines()[0]}
    except Exception as error:   # the driver stops with it
        return {'error': '%s: %s' % (type(error).__name__, str(error)[-2000:])}
    model = getattr(case.model, 'model', case.model)
    function = model.train_function.function
    current = mesh.current()
    inputs = [case.x, case.y, np.ones(len(case.x), 'float32')]
    return {'fits': True, 'parameters': int(case.model.count_params()),
            'resident': dict((name, int(n)) for name, n in
                             report.resident_bytes(function, current).items()
                             if name in current.names),
            'planned': peak_plan.planned_peak(function, inputs, current.names_by_graph_name()),
            'peak': peak_of(function)}


def requests():
    """The driver's requests; under MPI, on every rank."""
    if not UNDER_MPI:
        for line in sys.stdin:
            yield json.loads(line)
        return
    from theano_multigpu.mpi.world import world
    comm, rank, size = world()
    while True:
        line = sys.stdin.readline() if rank == 0 else None
        waiting = comm.Ibarrier()
        while not waiting.Test():
            time.sleep(0.001)
        line = comm.bcast(line, root=0)
        comm.Barrier()   # all awake: the timing starts together
        if not line:
            return
        yield json.loads(line)


def programs_built():
    """OpenCL programs this process built so far; None unless
    cl_counter's library is preloaded."""
    if 'libclcounter' not in os.environ.get('LD_PRELOAD', ''):
        return None
    import cl_counter
    return cl_counter.programs()


def timed_steps(case, steps):
    """{'times': seconds of each step} (and the collectives' under MPI,
    the programs built where counted)."""
    if UNDER_MPI:
        from theano_multigpu.mpi import ops as mpi
        before = dict(mpi.collective_seconds)
    programs = programs_built()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        case.model.train_on_batch(case.x, case.y)
        times.append(time.perf_counter() - started)
    answer = {'times': times}
    if programs is not None:
        answer['programs'] = programs_built() - programs
    if UNDER_MPI:
        answer['collectives'] = dict((k, v - before[k]) for k, v in mpi.collective_seconds.items())
    return answer


def fused_sum_seconds(nbytes, repeats):
    """Seconds of ``repeats`` fused sums of ``nbytes`` (four float32
    arrays) over the ranks, of MPI Allreduces and of copies of as many bytes
    (into memory in use, and into new memory, as the sums' results are)."""
    from mpi4py import MPI
    from theano_multigpu.mpi import transport as mpi
    comm = mpi.world()[0]
    count = nbytes // 4
    arrays = [np.random.rand(count // 4).astype('float32') for _ in range(3)]
    arrays.append(np.random.rand(count - 3 * (count // 4)).astype('float32'))
    whole, target = np.concatenate(arrays), np.empty(count, 'float32')
    seconds = {'fused_sum': [], 'mpi_allreduce': [], 'memcpy': [], 'memcpy_new': []}
    for _ in range(repeats + 1):   # the first of each is a warm-up
        for what, work in (('fused_sum', lambda: mpi.fused_sum().sum(arrays)),
                           ('mpi_allreduce', lambda: comm.Allreduce(whole, target, op=MPI.SUM)),
                           ('memcpy', lambda: np.copyto(target, whole)),
                           ('memcpy_new', lambda: whole.copy())):
            comm.Barrier()
            started = time.perf_counter()
            work()
            seconds[what].append(time.perf_counter() - started)
    return dict((what, times[1:]) for what, times in seconds.items())


def main():
    cases = {}
    reply = sys.stdout
    sys.stdout = sys.stderr   # Keras's prints must not reach the driver
    for request in requests():
        if 'build' in request:
            name = request['build']
            started = time.perf_counter()
            case = cases[name] = build(name, size='bench', batch=request.get('batch'))
            for _ in range(WARM_UP_STEPS):
                case.model.train_on_batch(case.x, case.y)
            answer = {'built': name, 'seconds': time.perf_counter() - started}
        elif 'compile' in request:
            model = build(request['compile'], size='bench').model
            model = getattr(model, 'model', model)   # Sequential wraps a Model
            started = time.perf_counter()
            model._make_train_function()
            answer = {'seconds': time.perf_counter() - started}
        elif 'moved' in request:
            from theano_multigpu.graph import transfer
            case = cases[request['moved']]

            def between_contexts():   # (the host's copies of the batch left out)
                return sum(n for (source, _), n in transfer.bytes_moved().items()
                           if source != transfer.HOST)
            before = between_contexts()
            case.model.train_on_batch(case.x, case.y)
            answer = {'bytes': between_contexts() - before,
                      'parameter_bytes': sum(w.nbytes for w in case.model.get_weights())}
        elif 'capacity' in request:
            answer = capacity_probe(request['capacity'], request['dims'], request['batch'])
        elif 'traffic' in request:
            answer = traffic_of(cases[request['traffic']])
        elif 'placement' in request:
            answer = placement_of(cases[request['placement']].model)
        elif 'fused_sum' in request:
            answer = fused_sum_seconds(request['fused_sum'], request['repeats'])
        else:
            answer = timed_steps(cases[request['time']], request['steps'])
        if RANK == 0:
            reply.write(json.dumps(answer) + '\n')
            reply.flush()


if __name__ == '__main__':
    main()
