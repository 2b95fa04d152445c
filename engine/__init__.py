"""The engine: everything a run does, in plain objects — no Ray, no vLLM (``actors/`` wraps these
objects in Ray shells; ``actors/vllm/`` is the one place that talks to vLLM).

One sub-package per role, each ``__init__`` a map of its modules. Each may import only the
sub-packages listed after it (``tests/unit/test_tree.py``: ``ENGINE`` and ``ENGINE_BANS``), so the
list reads bottom to top:

- ``io``: what a run leaves on disk and says — the event log and the other sinks, checkpoints,
  error text and the errors of users' code. Imports no other sub-package.
- ``tasks``: verifiable tasks (prompts with a known answer, a reward in [0, 1]) and the built-in
  rewards; the names users give (``"sort_digits"``, ``"module:attr"``) resolved. No other.
- ``data``: datasets in verl's layout and the stream a run draws, scoring with the user's reward,
  multi-turn environments and a turn's bookkeeping. Imports ``io``, ``tasks``.
- ``replica``: one rollout replica's core — its sample loop, weight loads and mode switches,
  validation, environment calls — over an inference ``Backend`` protocol. Imports ``io``,
  ``tasks``, ``data``.
- ``config``: the run's configuration, checked once at load (its checks load what it names), and
  the placement plan. Imports ``io``, ``tasks``, ``data``, ``replica``.
- ``weights``: how published weights travel — flat buffers, IPC packages, collective groups,
  copy plans. Imports ``io``.
- ``models``: model folders — the checks before anything starts, the tiny offline model, the
  tokenizer adapter. Imports ``io``, ``tasks``.
- ``trainer``: the torch trainer (its step, the RL math, the loss protocol, publishing) and the
  host that turns orders into its calls. Imports ``io``, ``tasks``, ``data``, ``config``,
  ``weights``.
- ``coordinator``: the control plane — the loop and its parts, the executor boundary and the
  in-process executor, the one run assembly. Imports ``io``, ``tasks``, ``data``, ``replica``,
  ``config``, ``trainer`` (its host only).

No sub-package imports Ray or vLLM; ``tasks``, ``data``, ``replica``, ``config`` and
``coordinator`` import neither torch nor transformers, so the control plane and everything it
needs is unit-tested in plain asyncio.
"""
