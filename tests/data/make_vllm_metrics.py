"""Writes vLLM's own /metrics exposition (tests/data/vllm_0.32_metrics.txt): vLLM's
PrometheusStatLogger on the engine config that the operator's rendered arguments give, with no
server and no request (every value 0). Runs with the vLLM venv's python, not the project's:

    ~/.cache/wok/vllm-venv-0.32.0/bin/python tests/data/make_vllm_metrics.py ARGS.json MODEL_DIR \
        tests/data/vllm_0.32_metrics.txt

ARGS.json: the vLLM container's `args` (a JSON list, the model first); MODEL_DIR: the model
(`wok model export builtin:tiny DIR`). vLLM logs to stdout, so the exposition goes to a file."""

import json
import sys
from pathlib import Path

from prometheus_client import REGISTRY, generate_latest
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.metrics.loggers import PrometheusStatLogger

args = json.loads(Path(sys.argv[1]).read_text())
parsed = make_arg_parser(FlexibleArgumentParser()).parse_args([f"--model={sys.argv[2]}", *args[1:]])
PrometheusStatLogger(AsyncEngineArgs.from_cli_args(parsed).create_engine_config(), [0])
Path(sys.argv[3]).write_bytes(generate_latest(REGISTRY))
