"""The GPU check's own parts that run without a GPU: where it finds the
CUDA libraries libgpuarray opens (CUDA 12 or 13, system or pip packages)
and what it says when one is missing, and how a bundle's Debian packages
and wheels are unpacked under one folder (real .debs, built by dpkg-deb).
The check itself, from a bundle, on a pocl device: see docs/gpu_check.rst."""
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO, requires

sys.path.insert(0, os.path.join(REPO, 'tools'))
import bundle_unpack  # noqa: E402
import gpu_check  # noqa: E402


def _touch(root, *parts):
    path = root.joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'\x7fELF')
    return str(path)


def test_cuda_libraries_are_found_newest_first_in_pip_packages_and_linked(tmp_path):
    driver = _touch(tmp_path, 'usr', 'lib', 'x86_64-linux-gnu', 'libcuda.so.1')
    site = ('usr', 'local', 'lib', 'python3.12', 'dist-packages', 'nvidia')
    _touch(tmp_path, *site, 'cuda_nvrtc', 'lib', 'libnvrtc.so.12')
    nvrtc13 = _touch(tmp_path, *site, 'cu13', 'lib', 'libnvrtc.so.13')
    cublas = _touch(tmp_path, 'home', 'me', '.local', 'lib', 'python3.12', 'site-packages',
                    'nvidia', 'cublas', 'lib', 'libcublas.so.12')
    cublas13 = _touch(tmp_path, *site, 'cu13', 'lib', 'libcublas.so.13')
    folders = gpu_check.library_folders({}, roots=(str(tmp_path),), loader_cache=False)
    # A driver of unknown version (this fake one): the newest CUDA with both.
    found, version = gpu_check.find_cuda_libraries(folders)
    assert found == {'CUDA driver': driver, 'NVRTC': nvrtc13, 'cuBLAS': cublas13}
    text, missing = gpu_check.cuda_report(found, folders, version)
    assert missing == [] and 'MISSING' not in text
    beside = gpu_check.link_cuda_libraries(found, str(tmp_path / 'links'))
    for opened, target in (('libcuda.so', driver), ('libnvrtc.so', nvrtc13),
                           ('libcublas.so', cublas13)):
        assert os.path.realpath(str(tmp_path / 'links' / opened)) == target
    # NVRTC finds its builtins, cuBLAS its cublasLt, beside themselves.
    assert beside == [os.path.dirname(driver), os.path.dirname(nvrtc13)]
    # A driver that runs CUDA 12.4 at most: NVRTC and cuBLAS of CUDA 12,
    # though from two packages.
    found, _ = gpu_check.find_cuda_libraries(folders, driver_version=12040)
    assert found['NVRTC'].endswith('cuda_nvrtc/lib/libnvrtc.so.12') and found['cuBLAS'] == cublas
    # What the user's LD_LIBRARY_PATH holds comes first.
    mine = os.path.dirname(_touch(tmp_path, 'mine', 'libnvrtc.so.12'))
    _touch(tmp_path, 'mine', 'libcublas.so.12')
    folders = gpu_check.library_folders({'LD_LIBRARY_PATH': mine}, roots=(str(tmp_path),),
                                        loader_cache=False)
    found, _ = gpu_check.find_cuda_libraries(folders, [mine])
    assert found['NVRTC'] == os.path.join(mine, 'libnvrtc.so.12'), found


def test_a_missing_cuda_library_is_named_with_where_it_was_looked_for(tmp_path):
    _touch(tmp_path, 'usr', 'local', 'cuda-12.4', 'lib64', 'libnvrtc.so.12')
    _touch(tmp_path, 'usr', 'local', 'cuda-12.4', 'lib64', 'libcublas.so.12')
    folders = gpu_check.library_folders({}, roots=(str(tmp_path),), loader_cache=False)
    found, version = gpu_check.find_cuda_libraries(folders)
    text, missing = gpu_check.cuda_report(found, folders, version)
    assert missing == ['CUDA driver'], text
    assert 'CUDA driver  MISSING: none of libcuda.so.1, libcuda.so' in text
    assert str(tmp_path / 'usr' / 'local' / 'cuda-12.4' / 'lib64') in text


def _deb(tmp_path, name, files, links=()):
    """A real .deb (dpkg-deb --build) holding ``files`` {path: text} and
    ``links`` [(path, absolute target)]."""
    tree = tmp_path / ('tree_' + name)
    for path, text in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    for path, target in links:
        os.symlink(target, str(tree / path))
    (tree / 'DEBIAN').mkdir(mode=0o755)
    os.chmod(str(tree / 'DEBIAN'), 0o755)   # dpkg-deb refuses it writable by others
    (tree / 'DEBIAN' / 'control').write_text(
        'Package: %s\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\n'
        'Description: test\n' % name)
    out = tmp_path / 'bundle' / 'debs' / (name + '.deb')
    out.parent.mkdir(parents=True, exist_ok=True)
    # xz, as Debian's own (Ubuntu's dpkg-deb defaults to zstd)
    subprocess.run(['dpkg-deb', '--build', '-Zxz', '--root-owner-group', str(tree), str(out)],
                   check=True, capture_output=True)
    return out


@requires(shutil.which('dpkg-deb'), 'needs dpkg-deb')
def test_a_bundle_unpacks_under_its_root_and_never_over_it(tmp_path):
    _deb(tmp_path, 'python', {'usr/lib/x86_64-linux-gnu/libpython.so.1.0': 'library'},
         links=[('usr/lib/x86_64-linux-gnu/libpython.so',
                 '/usr/lib/x86_64-linux-gnu/libpython.so.1.0')])
    wheels = tmp_path / 'bundle' / 'wheels'
    wheels.mkdir()
    with zipfile.ZipFile(str(wheels / 'hook-1.0-py3-none-any.whl'), 'w') as wheel:
        wheel.writestr('hook.pth', 'import hook\n')
        wheel.writestr('hook/__init__.py', '')
    root = tmp_path / 'root'
    bundle_unpack.unpack(str(tmp_path / 'bundle'), str(root))
    lib = root / 'usr' / 'lib' / 'x86_64-linux-gnu'
    assert (lib / 'libpython.so').read_text() == 'library'   # the link stays inside
    assert not os.path.isabs(os.readlink(str(lib / 'libpython.so')))
    assert (root / 'usr' / 'lib' / 'python3' / 'dist-packages' / 'hook.pth').exists()
    assert (root / '.unpacked').read_text().split() == ['python.deb',
                                                        'hook-1.0-py3-none-any.whl']
    # A package whose link leads out of the root is refused.
    _deb(tmp_path, 'zz-escape', {'usr/share/f': ''}, links=[('usr/out', '../../outside')])
    with pytest.raises(ValueError, match='links outside'):
        bundle_unpack.unpack(str(tmp_path / 'bundle'), str(tmp_path / 'root1'))
    os.remove(str(tmp_path / 'bundle' / 'debs' / 'zz-escape.deb'))
    # A wheel that would write outside the root is refused.
    with zipfile.ZipFile(str(wheels / 'evil-1.0-py3-none-any.whl'), 'w') as wheel:
        wheel.writestr('../../escaped.py', '')
    with pytest.raises(ValueError, match='would write outside'):
        bundle_unpack.unpack(str(tmp_path / 'bundle'), str(tmp_path / 'root2'))
    assert not (tmp_path / 'escaped.py').exists()
