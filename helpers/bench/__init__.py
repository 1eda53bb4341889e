"""The book's benchmark: ``python -m helpers.bench`` (appendix: Measured results).

- :mod:`helpers.bench.core`: figures, the workload registry and the machine record
- :mod:`helpers.bench.schema`: what a result file must contain
- :mod:`helpers.bench.report`: the appendix's tables and plots of every result file
- ``helpers/bench/<workload>.py``: one module per measured chapter, found by the runner
- :mod:`helpers.bench.__main__`: the runner itself

Importing this package imports nothing heavy; the runner imports the workload modules.
"""
