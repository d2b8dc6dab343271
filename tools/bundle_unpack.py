"""Unpack a GPU bundle (tools/gpu_bundle.sh) under one folder, never over /.

    python3 tools/bundle_unpack.py BUNDLE ROOT

Each .deb of BUNDLE/debs is unpacked under ROOT as dpkg-deb -x would (an ar
archive holding data.tar.xz, .gz or .zst), and each wheel of BUNDLE/wheels
into ROOT's site folder for Debian's python3.11
(ROOT/usr/lib/python3/dist-packages, beside pygpu), where Python reads the
project's start-up hook (a .pth file).  Any Python 3 runs it: the target's
own is enough.  ROOT/.unpacked marks a finished unpack.
"""
import glob
import io
import os
import sys
import tarfile
import zipfile

SITE = os.path.join('usr', 'lib', 'python3', 'dist-packages')


def ar_members(path):
    """{name: bytes} of the ar archive at ``path`` (a .deb)."""
    members = {}
    with open(path, 'rb') as archive:
        if archive.read(8) != b'!<arch>\n':
            raise ValueError('%s is not a Debian package (no ar header)' % path)
        while True:
            header = archive.read(60)
            if len(header) < 60:
                return members
            name = header[:16].decode().strip().rstrip('/')
            size = int(header[48:58].decode().strip())
            members[name] = archive.read(size)
            if size % 2:
                archive.read(1)


def _inside(root, name):
    target = os.path.realpath(os.path.join(root, name))
    return target == root or target.startswith(root + os.sep)


def unpack_deb(path, root):
    """Unpack the files of Debian package ``path`` under ``root``."""
    members = ar_members(path)
    data = [name for name in members if name.startswith('data.tar')]
    if not data:
        raise ValueError('%s holds no data.tar.*' % path)
    payload = members[data[0]]
    if data[0].endswith('.zst'):
        raise ValueError('%s is compressed with zstd, which this Python cannot read; '
                         'unpack it with dpkg-deb -x %s %s' % (path, path, root))
    with tarfile.open(fileobj=io.BytesIO(payload), mode='r:*') as tar:
        for member in tar.getmembers():
            if not _inside(root, member.name):
                raise ValueError('%s would write outside %s: %s' % (path, root, member.name))
            if member.issym() and os.path.isabs(member.linkname):
                # Absolute links point into the unpacked tree, not at /.
                member.linkname = os.path.relpath(
                    os.path.join(root, member.linkname.lstrip('/')),
                    os.path.dirname(os.path.join(root, member.name)))
            if member.issym() and not _inside(
                    root, os.path.join(os.path.dirname(member.name), member.linkname)):
                raise ValueError('%s links outside %s: %s -> %s'
                                 % (path, root, member.name, member.linkname))
            if member.islnk() and not _inside(root, member.linkname.lstrip('/')):
                raise ValueError('%s links outside %s: %s' % (path, root, member.linkname))
        if hasattr(tarfile, 'fully_trusted_filter'):   # Python 3.12 and later
            tar.extractall(root, filter='fully_trusted')   # checked above
        else:
            tar.extractall(root)


def unpack_wheel(path, site):
    """Unpack wheel ``path`` into the site folder ``site``."""
    with zipfile.ZipFile(path) as wheel:
        for name in wheel.namelist():
            if not _inside(site, name):
                raise ValueError('%s would write outside %s: %s' % (path, site, name))
        wheel.extractall(site)
        for info in wheel.infolist():   # keep the executable bits of shared libraries
            mode = info.external_attr >> 16
            if mode:
                os.chmod(os.path.join(site, info.filename), mode & 0o777)


def unpack(bundle, root):
    root = os.path.realpath(root)
    debs = sorted(glob.glob(os.path.join(bundle, 'debs', '*.deb')))
    wheels = sorted(glob.glob(os.path.join(bundle, 'wheels', '*.whl')))
    if not debs or not wheels:
        raise SystemExit('%s holds no debs/*.deb or wheels/*.whl: build it with make gpu-bundle'
                         % bundle)
    os.makedirs(root, exist_ok=True)
    for path in debs:
        unpack_deb(path, root)
    site = os.path.join(root, SITE)
    os.makedirs(site, exist_ok=True)
    for path in wheels:
        unpack_wheel(path, site)
    with open(os.path.join(root, '.unpacked'), 'w') as mark:
        mark.write('\n'.join(os.path.basename(p) for p in debs + wheels) + '\n')
    print('unpacked %d Debian packages and %d wheels under %s' % (len(debs), len(wheels), root))


if __name__ == '__main__':
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    unpack(sys.argv[1], sys.argv[2])
