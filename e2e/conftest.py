"""Fixtures of the emulated cluster (see wok_cluster.pytest_plugin for what each one gives)."""

from wok_cluster.pytest_plugin import *  # noqa: F403
