"""Thin Ray actor shells around the engine's pure objects, and the one module that talks
to vLLM (``vllm_backend``).

Invariant: an actor decodes the bytes it receives at its boundary with the typed codec,
delegates to an ``engine/`` object, and returns encoded events; no RL logic lives here.
"""
