"""Measuring tools, outside the serving path: the engine and HTTP benchmarks and the step-cost
profiler (`wok bench http`, `wok bench engine`, `wok profile`)."""
