"""Running a scenario file to one result JSON (``python -m shunter.bench run``).

- ``scenario_file``: a scenario file's Structs (``Scenario``, ``Meta``, ``Cluster``, ``Variant``, ``Acceptance``),
  ``load``.
- ``figure_names``: the figures a result of each kind may hold (``known``) and the retired names.
- ``acceptance``: ``judge``, a scenario's acceptance criteria on a result, and each verdict's ``line``.
- ``kinds``: ``run_file``, which hands a scenario to the runner of its kind and writes the JSON.
- ``simulated``: ``run_scenario``, a ``sim`` scenario's variants on the simulated cluster, bounds, gaps.
- ``overhead``: ``run_overhead``, the engine's overhead next to raw Ray calls (``overhead`` kind).
- ``real``: ``run_real``, the real engine on this machine (``real`` kind).
- ``minimal_loop``: ``run_minimal``, a hand-written GRPO loop, the yardstick of the engine's overhead.
- ``results``: a run's derived figures, ``aggregate`` over seeds, ``result_json``, ``write``.
"""
