"""Pure core of shunter: coordinator, sample buffer, dispatcher, rank table, config, RL math.

Invariant: nothing here imports Ray or vLLM (torch only in the trainer core and RL math),
so every piece can be unit-tested in plain asyncio.
"""
