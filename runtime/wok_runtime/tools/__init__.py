"""Measuring tools, outside the serving path: the engine and HTTP benchmarks and the step-cost
profilers (`wok bench http`, `wok bench engine`, `wok profile`, `wok profile --url`)."""
