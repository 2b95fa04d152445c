"""Throughput benchmarks (issue 3): one scenario -> one JSON of ratios measured in one run.

Invariant: benchmarks are users of the ``Engine`` facade and the engine's pure objects;
they never change engine behaviour, and their figures never gate a test.
"""
