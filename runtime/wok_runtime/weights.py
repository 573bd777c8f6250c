"""Reading and writing Hugging Face safetensors checkpoints, single-file or sharded with an index.

Kept apart from the model so the built-in generator, the exporter and the loader agree on one
on-disk format: the one `transformers.from_pretrained` reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def save_safetensors(
    tensors: dict[str, torch.Tensor], path: Path, *, max_shard_bytes: int | None = None
) -> list[Path]:
    """Writes `model.safetensors`, or shards `model-0000i-of-0000n.safetensors` plus the index
    when `max_shard_bytes` is given and the tensors do not fit one shard."""
    path = Path(path)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    metadata = {"format": "pt"}
    if len(shards) == 1:
        file = path / SINGLE_FILE
        save_file(shards[0], str(file), metadata=metadata)
        return [file]
    files: list[Path] = []
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, start=1):
        file = path / f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(file), metadata=metadata)
        files.append(file)
        weight_map.update(dict.fromkeys(shard, file.name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return files


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory: the index when there is one, else the one file,
    else every `*.safetensors` file in it."""
    path = Path(path)
    if (path / INDEX_FILE).is_file():
        weight_map: dict[str, str] = json.loads((path / INDEX_FILE).read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (path / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        shard = load_file(str(path / name))
        overlap = tensors.keys() & shard.keys()
        if overlap:
            raise ValueError(f"tensor {sorted(overlap)[0]!r} appears in more than one shard")
        tensors.update(shard)
    if (path / INDEX_FILE).is_file():
        missing = weight_map.keys() - tensors.keys()
        if missing:
            raise ValueError(f"tensor {sorted(missing)[0]!r} is in the index but in no shard")
    return tensors
