"""The book's benchmark: ``python -m bench`` (appendix: Measured results).

It measures every chapter's workload on this machine and writes ``results/<machine>.json``,
which the chapters and the appendix show through :mod:`helpers.results`. It imports the
reader's library (``helpers``) and is never imported by it; it is not part of the package a
reader installs.

- :mod:`bench.core`: figures, the workload registry and the machine record
- :mod:`bench.schema`: what a result file must contain (the version is
  :data:`helpers.results.SCHEMA_VERSION`)
- ``bench/<workload>.py``: one module per measured workload, registered with ``@workload``
- :mod:`bench.__main__`: the runner itself
"""
