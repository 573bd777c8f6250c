"""The contracts every part of wok shares: the runtime's metric names and histogram buckets
(`metrics`), the engine step-time profile format and the builtin profiles (`profile`), the trace
formats and their readers (`traces`), what the control law sees of a service (`signals`), and the
nearest-rank quantile every report quotes (`quantiles`).

The bottom layer: pure Python that imports nothing of the project and no framework, so the
runtime, the operator, the simulator and the batch client can all depend on it and on nothing of
each other.
"""
