"""Throughput benchmarks (issue 3): one scenario -> one JSON of ratios measured in one run.

Invariant: benchmarks are users of the ``Engine`` facade and the engine's pure objects;
they never change engine behaviour, and their figures never gate a test. bench imports
``shunter.engine``, ``shunter.actors``, ``shunter.api`` (``shunter.Engine``), ``shunter.events``
and ``shunter.policies``, never the reverse (only ``shunter.contract``, the policy check, runs
the simulator). Sub-packages, each importing only those named after it:

- ``sim/``: the simulated cluster in virtual time (cost model, replica model, ``run_sim``); the engine only.
- ``analysis/``: event-log figures, the true bound, the gap to it, the closed form; ``sim`` (cost terms).
- ``report/``: Markdown report, PNG plots, timeline, Perfetto trace, learning curves; ``analysis``.
- ``runner/``: scenario files, one runner per kind, the result JSON; ``sim``, ``analysis``, ``report``, actors.
- ``gpu/``: real engine runs on hardware, the simulator against them; ``sim``, ``analysis``, actors, the facade.
- ``__main__``: ``python -m shunter.bench run | report | trace | gpu | gpu-sim``; ``runner``, ``report``, ``gpu``.
- ``scenarios/``, ``data/``: scenario files and the length files they name; ``results/``: JSONs, plots.
"""
