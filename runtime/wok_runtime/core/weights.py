"""Reading and writing Hugging Face safetensors checkpoints, single-file or sharded with an index.

Kept apart from the model so the built-in generator, the exporter and the loader agree on one
on-disk format: the one `transformers.from_pretrained` reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

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


#: safetensors' dtype names.
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _checkpoint_files(path: Path) -> tuple[list[str], dict[str, str] | None]:
    """The shard files of a checkpoint directory (the index's, else the one file, else every
    `*.safetensors`) and the index's weight map, if there is one."""
    weight_map: dict[str, str] | None = None
    if (path / INDEX_FILE).is_file():
        weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (path / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {path}")
    return files, weight_map


def iter_safetensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of a checkpoint directory one at a time, each read into its own host buffer
    with plain reads (no mmap, so no file pages count against the process): a caller that
    copies each to the device and drops it holds one tensor on the host, never the checkpoint.
    """
    path = Path(path)
    files, weight_map = _checkpoint_files(path)
    seen: set[str] = set()
    for file_name in files:
        with open(path / file_name, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(header_len))
            header.pop("__metadata__", None)
            base = 8 + header_len
            for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                if name in seen:
                    raise ValueError(f"tensor {name!r} appears in more than one shard")
                seen.add(name)
                start, end = info["data_offsets"]
                data = bytearray(end - start)  # the tensor shares it (no numpy, no copy)
                f.seek(base + start)
                if f.readinto(data) != len(data):
                    raise ValueError(f"{file_name}: tensor {name!r} is truncated")
                empty = torch.empty(0, dtype=torch.uint8)
                raw = torch.frombuffer(data, dtype=torch.uint8) if data else empty
                yield name, raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"])
    if weight_map is not None:
        missing = weight_map.keys() - seen
        if missing:
            raise ValueError(f"tensor {sorted(missing)[0]!r} is in the index but in no shard")


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory in host memory (the exporter, tests); the loader
    streams them with `iter_safetensors` instead."""
    return dict(iter_safetensors(path))
