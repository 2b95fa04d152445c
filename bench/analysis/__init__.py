"""Figures of a run (real or simulated), from its event log and the machine's capacity only.

- ``summary``: ``Summary`` (a folding sink: idle fractions, first step, work per step), ``summarize``.
- ``bound``: the true bound, the least wall time any schedule could take for a run's work.
- ``gap``: ``Gaps``, the wall time above the best split's bound cut into named parts (``PARTS``).
- ``analytic``: ``colocated_run_s``, the synchronous schedule's closed form (the simulator's check).
"""
