"""theano_multigpu: multi-GPU training for Keras 1.x on Theano."""
import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PTH = 'theano_multigpu.pth'


class build_py_with_pth(build_py):
    """Also install the start-up hook (a .pth file) into site-packages."""

    def run(self):
        super().run()
        self.copy_file(os.path.join(HERE, PTH), os.path.join(self.build_lib, PTH))


def read_version():
    with open(os.path.join(HERE, 'theano_multigpu', '__init__.py')) as f:
        for line in f:
            if line.startswith('__version__'):
                return line.split("'")[1]


setup(
    name='theano_multigpu',
    version=read_version(),
    description='A Keras 1.x backend that trains on several GPUs with Theano',
    long_description=open(os.path.join(HERE, 'README.rst')).read(),
    long_description_content_type='text/x-rst',
    packages=find_packages(include=['theano_multigpu', 'theano_multigpu.*']),
    package_data={'theano_multigpu.compat': ['scan_loop.pyx']},
    py_modules=['_theano_multigpu_startup'],
    cmdclass={'build_py': build_py_with_pth},
    python_requires='>=3.8',
    install_requires=[
        'numpy>=1.20,<1.24',
        'scipy<1.12',
        'theano==1.0.5',
        'keras>=1.0.1,<2',
        'h5py',
        'pyyaml',
        # Scan's compiled loop is built with it at first use.
        'cython>=3.0',
    ],
    extras_require={'mpi': ['mpi4py', 'xxhash']},
    entry_points={'console_scripts': ['theano-multigpu = theano_multigpu.__main__:main']},
    classifiers=[
        'Programming Language :: Python :: 3',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
)
