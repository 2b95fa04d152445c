"""What a reader sees: reports, plots and traces built from result JSONs, event logs and run folders.

- ``markdown``: ``write_report`` (``python -m shunter.bench report``) and its scenario tables.
- ``gpu_sections``: the report's GPU sections (one GPU, two GPUs, the simulator against them).
- ``plots``: the report's PNG plots (speedup, idle, gap split, reward curves).
- ``timeline``: ``plot_timeline``, which replica generated and when the trainer trained.
- ``trace``: ``to_trace`` / ``write_trace``, an event log as a Perfetto trace (``bench trace``).
- ``learning_curve``: finished runs' learning curves from their ``metrics.jsonl``.
"""
