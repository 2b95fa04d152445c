"""What a run leaves on disk and what it says: its records, its checkpoints, its error text.

- ``records``: where every message the coordinator handles goes — the event log (``events.bin``),
  the structured run log, metrics, the live feed (``Sink``, ``RunSinks``);
- ``checkpoint``: ``CheckpointStore`` — checkpoints that are either complete or invisible;
- ``errors``: error text that stays readable and small (``describe``, ``bounded``), and the errors
  users see (``EngineError``, ``UserCodeError`` ...).
"""
