"""From a model source string to a model on a device.

A source is `builtin:NAME` (generated and cached on first use, see builtin.py) or a local Hugging
Face directory (config.json, safetensors weights, tokenizer.json). There is no hub download: the
machines this runs on have no route to one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from wok_runtime.core.builtin import ensure_builtin
from wok_runtime.core.model import Transformer, hf_weight_map
from wok_runtime.core.model_config import ModelConfig
from wok_runtime.core.parallel import SINGLE, Parallel, check_divisible
from wok_runtime.core.weights import (
    INDEX_FILE,
    iter_safetensors,
    load_safetensors,
    save_safetensors,
)

BUILTIN_PREFIX = "builtin:"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Files of a Hugging Face model directory that the exporter carries over besides the weights.
_HF_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def resolve_source(source: str) -> Path:
    """The local directory that holds `source`'s files."""
    if source.startswith(BUILTIN_PREFIX):
        return ensure_builtin(source.removeprefix(BUILTIN_PREFIX))
    path = Path(source).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model source {source!r} is neither builtin:NAME nor a directory with config.json"
        )
    return path


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


def load_model(
    path: Path, *, dtype: torch.dtype, device: torch.device, parallel: Parallel = SINGLE
) -> Transformer:
    """Builds the model (under tensor parallelism, this rank's shard of it) from a Hugging Face
    directory straight onto `device` in `dtype`.

    Streams: each checkpoint tensor is read into a host buffer, copied (converted) into its
    rows of the parameter on the device, and dropped, so the host never holds the checkpoint
    nor fused copies of it; on a GPU it holds about the largest tensor
    (`bench/runtime/results/loader_rss.md`)."""
    config = ModelConfig.from_file(Path(path) / "config.json")
    check_divisible(config, parallel.size)
    model = Transformer(config, parallel)  # uninitialised parameters (untouched), replaced below
    targets = {
        name: torch.empty(p.shape, dtype=dtype, device=device)
        for name, p in model.named_parameters()  # a tied lm_head is embed_tokens' (one entry)
    }
    weight_map = hf_weight_map(config, parallel.size)
    seen: set[str] = set()
    for name, tensor in iter_safetensors(Path(path)):
        if name not in weight_map:
            continue  # not a parameter of this model (e.g. a tied checkpoint's lm_head)
        target, where, split = weight_map[name]
        tensor = parallel.shard(tensor, split)
        rows = targets[target][where]
        if rows.shape != tensor.shape:
            raise ValueError(
                f"tensor {name!r} has shape {tuple(tensor.shape)}, the model expects "
                f"{tuple(rows.shape)}"
            )
        rows.copy_(tensor)
        seen.add(name)
    missing = weight_map.keys() - seen
    if missing:
        raise ValueError(f"weights are missing tensor {sorted(missing)[0]!r}")
    if config.tie_word_embeddings:
        targets["lm_head.weight"] = targets["embed_tokens.weight"]
    model.load_state_dict(targets, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.rope_cos = model.rope_cos.to(device)
    model.rope_sin = model.rope_sin.to(device)
    return model.eval().requires_grad_(False)


def export_model(source: str, out: Path, *, max_shard_bytes: int | None = None) -> Path:
    """Writes `source` as a standard Hugging Face directory at `out` (which must not be a
    non-empty directory), optionally resharding the weights."""
    src = resolve_source(source)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty directory")
    out.mkdir(parents=True, exist_ok=True)
    for name in _HF_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
    if max_shard_bytes is None:
        files = [src / INDEX_FILE, *src.glob("*.safetensors")]
        for file in files:
            if file.is_file():
                shutil.copy2(file, out / file.name)
    else:
        save_safetensors(load_safetensors(src), out, max_shard_bytes=max_shard_bytes)
    return out
