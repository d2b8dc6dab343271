"""Device discovery and a device's free memory, in this process, on this
machine's drivers (pocl for OpenCL; CUDA where the machine has it): a
driver that cannot count its devices is shown by its message, not taken
for a driver without devices."""
import ctypes.util

import pytest

from conftest import needs_pocl
from theano_multigpu.config import devices
from theano_multigpu.errors import ConfigurationError


@needs_pocl
def test_the_survey_finds_the_pocl_devices_and_shows_what_a_driver_said():
    found, problems = devices.survey_devices()
    assert [d for d in found if d.startswith('opencl0:')] == ['opencl0:0', 'opencl0:1']
    assert devices.available_devices() == found
    assert all(p.startswith(('cuda: ', 'opencl: ')) and len(p) > len('cuda: ') for p in problems)
    if ctypes.util.find_library('cuda') is None:   # no CUDA driver here: libgpuarray says so
        assert any(p.startswith('cuda: ') and 'libcuda' in p for p in problems), problems


@needs_pocl
def test_a_missing_device_is_reported_with_the_devices_found_and_its_drivers_message():
    found, problems = devices.survey_devices()
    with pytest.raises(ConfigurationError) as raised:
        devices.check_devices_exist([('dev0', 'opencl0:0'), ('dev1', 'opencl7:0')], [],
                                    found, problems)
    message = str(raised.value)
    assert "maps 'dev1' to device 'opencl7:0', which does not exist here" in message
    assert 'devices found: %s' % ', '.join(found) in message
    assert all(p in message for p in problems if p.startswith('opencl: '))
    assert not any(p in message for p in problems if p.startswith('cuda: '))
    if not any(d.startswith('cuda') for d in found):
        with pytest.raises(ConfigurationError) as raised:
            devices.check_devices_exist([], [('device', 'cuda0')], found, problems)
        message = str(raised.value)
        assert 'THEANO_FLAGS device=cuda0 names a device that does not exist here' in message
        assert all(p in message for p in problems if p.startswith('cuda: '))
        if ctypes.util.find_library('cuda') is None:
            assert '(the driver said: cuda: ' in message and 'libcuda' in message, message
    devices.check_devices_exist([('dev0', 'opencl0:0')], [('device', 'opencl0:1')],
                                found, problems)


@needs_pocl
def test_the_free_memory_of_a_pocl_context_is_its_drivers_figure():
    """pocl reports a figure: the plans' budgets on pocl need no setting."""
    import pygpu
    context = pygpu.init('opencl0:0')
    free = devices.free_memory(context)
    assert isinstance(free, int) and 0 < free <= context.total_gmem
