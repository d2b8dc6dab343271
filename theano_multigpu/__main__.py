"""Command line: ``python -m theano_multigpu {info,run,report,settings}``.

    python -m theano_multigpu info             versions, contexts, settings
    python -m theano_multigpu run train.py ... run a script on the shim
    python -m theano_multigpu report train.py ...  the same, printing the
                                               placement report of each function
    python -m theano_multigpu settings         every setting, its default and help
        --rst / --theanorc                     README's table / theanorc.example
        --write [ROOT]                         rewrite both in the repository ROOT
"""
import argparse
import os
import runpy
import sys

__all__ = ['main']


def _activate():
    """The shim, also where THEANO_MULTIGPU_COMPAT=1 kept the import from
    turning it on; KERAS_BACKEND is set for child processes too."""
    os.environ['KERAS_BACKEND'] = 'theano_multigpu'
    from .startup import turn_on
    turn_on.activate()


def _run(args):
    """Run ``args.script`` as ``__main__`` with the shim on (children too),
    as ``python script.py args`` would: same argv and sys.path[0]."""
    if not os.path.isfile(args.script):
        print('python -m theano_multigpu run: expected a Python script, but '
              'received %r, which is not a file' % args.script, file=sys.stderr)
        return 2
    _activate()
    sys.argv = [args.script] + args.args
    sys.path[0] = os.path.dirname(os.path.abspath(args.script))
    runpy.run_path(args.script, run_name='__main__')
    return 0


def _report(args):
    """``run`` with multigpu.report on (set before Theano reads its flags)."""
    flags = os.environ.get('THEANO_FLAGS', '')
    os.environ['THEANO_FLAGS'] = ','.join(f for f in (flags, 'multigpu.report=True') if f)
    return _run(args)


def _info(args):
    _activate()
    from .startup import info
    return info.main()


def _settings(args):
    """The settings table, as text, README's table or theanorc.example
    (no Theano imported)."""
    from .config import settings_text
    if args.write is not None:
        for path in settings_text.write(args.write):
            print('wrote %s' % path)
        return 0
    if args.rst:
        sys.stdout.write(settings_text.rst_table())
    elif args.theanorc:
        sys.stdout.write(settings_text.theanorc())
    else:
        sys.stdout.write(settings_text.listing())
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog='python -m theano_multigpu',
        description='Multi-GPU training for Keras 1.x on Theano.')
    commands = parser.add_subparsers(dest='command', required=True)
    run = commands.add_parser('run', help='run a Keras script on the shim')
    run.add_argument('script')
    run.add_argument('args', nargs=argparse.REMAINDER)
    run.set_defaults(handler=_run)
    report = commands.add_parser(
        'report', help='run a Keras script, printing where each function runs')
    report.add_argument('script')
    report.add_argument('args', nargs=argparse.REMAINDER)
    report.set_defaults(handler=_report)
    info = commands.add_parser('info', help='versions, contexts and settings')
    info.set_defaults(handler=_info)
    settings = commands.add_parser(
        'settings', help="the package's settings, their defaults and help")
    form = settings.add_mutually_exclusive_group()
    form.add_argument('--rst', action='store_true', help="README.rst's settings table")
    form.add_argument('--theanorc', action='store_true', help='theanorc.example')
    form.add_argument('--write', nargs='?', const='.', metavar='ROOT',
                      help="rewrite README.rst's table and theanorc.example in the "
                           "repository ROOT (default: the current folder)")
    settings.set_defaults(handler=_settings)
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == '__main__':
    sys.exit(main())
