"""`wok runtime serve`: reads the flags, builds the model runner (PyTorch, or the simulated
accelerator for `--device sim`) and the engine, and serves the app with uvicorn until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path
from typing import Any

import uvicorn

from wok_runtime.http.app import create_app
from wok_runtime.http.drain import _DrainingServer
from wok_runtime.http.http_limits import protocol_with_header_timeout
from wok_runtime.http.metrics import RuntimeMetrics
from wok_runtime.http.server_config import ServerConfig, parse_priority_classes

log = logging.getLogger("wok.runtime.server")


def read_admin_token(path: str | None) -> str | None:
    if path:
        token = Path(path).read_text().strip()
        if not token:
            raise ValueError(f"--admin-token-file {path} is empty")
        return token
    return os.environ.get("WOK_ADMIN_TOKEN", "").strip() or None


def listen_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound before anything loads: a port in use is one line of error at
    once, not a traceback after the model has loaded and the log has said it is ready."""
    try:
        family, kind, proto, _, _ = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )[0]
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
        # and with Nagle on, a response written in two parts waits for a delayed ACK (40 ms).
        sock = socket.socket(family, kind, proto)
    except OSError as error:
        raise ValueError(f"cannot listen on {host}:{port}: {error}") from error
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {error.strerror or error}") from error
    sock.set_inheritable(True)
    return sock


def _default_dtype(device: str | None) -> str:
    import torch

    on_cuda = device == "cuda" or (device is None and torch.cuda.is_available())
    return "bfloat16" if on_cuda else "float32"


def _build_runner(args: argparse.Namespace) -> Any:
    """The PyTorch model runner, or the simulated accelerator for `--device sim`."""
    if args.device == "sim":
        from wok_runtime.core.sim_runner import SimModelRunner

        if args.profile is None:
            raise ValueError("--device sim needs --profile NAME|PATH (e.g. sim:llama-3-8b-80g)")
        if args.kv_cache_bytes is not None:
            raise ValueError(
                "--kv-cache-bytes does not apply to --device sim (the profile sizes it)"
            )
        return SimModelRunner.from_profile(args.profile)
    if args.profile is not None or args.sim_load_seconds is not None:
        raise ValueError("--profile and --sim-load-seconds need --device sim")
    from wok_runtime.core.model_runner import ModelRunner

    if args.compile:  # its builds kept in the cache volume, one set per CPU
        from wok_runtime.core.builtin import cache_root
        from wok_runtime.kernels.compile_cache import configure

        configure(cache_root())
    return ModelRunner.from_source(
        args.model,
        dtype=args.dtype or _default_dtype(args.device),
        device=args.device,
        block_size=args.block_size,
        kv_cache_bytes=args.kv_cache_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        tensor_parallel_size=args.tensor_parallel_size,
        compile=args.compile,
        attention=args.attention,
        cuda_graph_max_batch=args.max_batch_size if args.cuda_graphs else 0,
    )


def serve_from_args(args: argparse.Namespace) -> int:
    """`wok runtime serve`: loads the model, builds the engine, serves until SIGTERM."""
    from wok_runtime.core.engine import EngineConfig, LLMEngine

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    classes = parse_priority_classes(args.priority_classes)
    admin_token = read_admin_token(args.admin_token_file)
    sock = listen_socket(args.host, args.port)
    try:  # a model that fails to load must not leave the port bound
        runner = _build_runner(args)
        load_seconds = 0.0
        if args.device == "sim":
            load_seconds = runner.profile.load_seconds
            if args.sim_load_seconds is not None:
                load_seconds = args.sim_load_seconds
        config = ServerConfig(
            served_model_name=args.served_model_name or runner.model_name,
            admin_token=admin_token,
            priority_classes=classes,
            default_priority=classes.get("standard", min(classes.values())),
            drain_seconds=args.drain_seconds,
            unready_seconds=args.unready_seconds,
            load_seconds=load_seconds,
            max_request_bytes=args.max_request_bytes,
            header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout,
            as_vllm=args.as_vllm,
        )
        engine_config = EngineConfig(
            mode=args.mode,
            max_batch_size=args.max_batch_size,
            max_wait_ms=args.max_wait_ms,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_queue=args.max_queue,
            queue_timeout_s=args.queue_timeout,
            aging_s=args.aging_seconds,
            tenant_kv_share=args.tenant_kv_share,
            max_model_len=args.max_model_len,
            stream_interval=args.stream_interval,
            batch_max_queue=args.batch_queue_size,
            batch_queue_timeout_s=args.batch_queue_timeout,
            batch_lane_max_batch_size=args.batch_lane_max_batch_size,
            enable_prefix_caching=args.prefix_caching,
        )
        priorities = tuple(sorted(set(classes.values())))
        # The collector reads the engine at scrape time; the engine reports steps to the collector.
        metrics = RuntimeMetrics(
            config.served_model_name,
            lambda: engine.stats(),
            priorities=priorities,
            kv_memory=getattr(runner, "kv_memory", None),
            vllm_series_only=args.as_vllm,
        )
        engine = LLMEngine(runner, engine_config, on_step=metrics.observe_step)
        app = create_app(engine, config, metrics=metrics)
        if args.as_vllm and config.admin_token is not None:
            raise ValueError("--as-vllm: vLLM has no admin API (its batch is fixed at start)")
        if config.admin_token is None:
            log.warning(
                "admin API disabled: no --admin-token-file and no WOK_ADMIN_TOKEN "
                "(/admin/* answers 403)"
            )
        uv_config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=5,
            access_log=False,
            http=protocol_with_header_timeout(config.header_timeout_s),
        )
        uv = _DrainingServer(uv_config, app.state.server)
        uv.run(sockets=[sock])
    finally:
        sock.close()
    return 0
