"""The models of bench/gpu/gpu_check.py: SmolLM2-135M's shape (the `builtin:smollm2-135m`) and
Llama-3-8B's, both with random weights, so the GPU machine downloads nothing.

The 8B shape is too large for the builtins' generator (fp32 tensors drawn on the CPU: 32 GB
written): its weights are drawn on the GPU in bfloat16 and written in 4 GB shards (16 GB), its
tokenizer trained as the builtins' are (wok_runtime.core.builtin.build_tokenizer). A marker with the
spec's fingerprint makes a second run reuse the directory.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

from wok_runtime.core.builtin import (
    MARKER,
    BuiltinSpec,
    _digest,
    _generate_once,
    build_tokenizer,
    cache_root,
    random_weights,
    write_tokenizer,
)
from wok_runtime.core.model_config import ModelConfig

SHARD_BYTES = 4 << 30
GENERATOR = "gpu_models-bf16-v1"

LLAMA3_8B = BuiltinSpec(
    name="llama3-8b-shape",
    seed=8,
    config=ModelConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
    ),
)

#: The same code path at a size the CPU writes in a second (the dry run's).
SMALL_8B_LAYOUT = replace(
    LLAMA3_8B,
    name="llama3-8b-layout-small",
    config=replace(
        LLAMA3_8B.config,
        hidden_size=128,
        intermediate_size=448,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        vocab_size=512,
    ),
)


def fingerprint(spec: BuiltinSpec) -> str:
    return _digest({"spec": asdict(spec), "generator": GENERATOR})


def ensure_on_device(spec: BuiltinSpec, device: str, root: Path | None = None) -> Path:
    """`spec` as a Hugging Face directory under the cache, drawn on `device` in bfloat16."""
    parent = (root or cache_root()) / "models"
    return _generate_once(
        parent / spec.name, fingerprint(spec), lambda path: write(spec, path, device)
    )


def write(spec: BuiltinSpec, path: Path, device: str) -> None:
    import torch

    from wok_runtime.core.weights import save_safetensors

    config = spec.config
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2) + "\n")
    ids = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id}
    (path / "generation_config.json").write_text(json.dumps(ids, indent=2) + "\n")
    # The builtins' names and shapes (random_weights' order) on a meta device, then drawn here.
    with torch.device("meta"):
        shapes = {name: t.shape for name, t in random_weights(spec).items()}
    gen = torch.Generator(device=device).manual_seed(spec.seed)
    tensors = {}
    for name, shape in shapes.items():
        drawn = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
        if name.endswith("norm.weight"):
            drawn = 1.0 + 0.1 * drawn  # not all ones, as the builtins' norms
        else:
            drawn *= spec.init_std
        tensors[name] = drawn.cpu()
    save_safetensors(tensors, path, max_shard_bytes=SHARD_BYTES)
    write_tokenizer(build_tokenizer(config.vocab_size, seed=spec.seed), path, config)
    marker = {"fingerprint": fingerprint(spec), "spec": asdict(spec), "generator": GENERATOR}
    (path / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
