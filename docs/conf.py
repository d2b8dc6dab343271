# Sphinx configuration of theano_multigpu's documentation: `make docs`
# (sphinx-build -W: a warning fails the build, as tests/test_docs.py does).
project = 'theano_multigpu'
author = 'theano_multigpu contributors'
extensions = []
master_doc = 'index'
exclude_patterns = ['_build']
html_theme = 'alabaster'
# The pages are read from the repository; none is fetched.
html_static_path = []
