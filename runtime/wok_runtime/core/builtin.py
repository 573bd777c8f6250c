"""Built-in models, generated from a seed, because no machine of this project can download one.

`builtin:NAME` is a Llama-architecture model with random weights (std 0.02, so logits are not
degenerate) and a byte-level BPE tokenizer trained on a seeded synthetic corpus. It is written
once as a standard Hugging Face directory under `~/.cache/wok/models/NAME/` (`$WOK_CACHE_DIR`
overrides `~/.cache/wok`), so the runtime, `transformers` and the benchmarks all load the same
files. Generation is deterministic: the same spec gives the same bytes on every machine with the
same torch.

Torch is imported only to generate weights: the simulated accelerator needs the tokenizer alone
(`ensure_builtin_tokenizer`, cached apart from the weights) and runs without torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from wok_contracts.builtin_models import BUILTIN_SHAPES
from wok_runtime.core.model_config import ModelConfig

if TYPE_CHECKING:
    import torch

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_TOKEN = "<|endoftext|>"
# ChatML, as SmolLM2's instruct models use it.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MARKER = "wok_builtin.json"  # the fingerprint of what a generated directory holds
# Bump when generation changes, so stale caches are regenerated instead of silently reused.
GENERATOR_VERSION = 1


@dataclass(frozen=True)
class BuiltinSpec:
    name: str
    config: ModelConfig
    seed: int = 0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"invalid built-in model name {self.name!r}")
        if self.init_std <= 0:
            raise ValueError("init_std must be positive")
        if self.config.vocab_size < 256 + len(SPECIAL_TOKENS):
            raise ValueError("a byte-level tokenizer needs a vocabulary of at least 259")

    def fingerprint(self) -> str:
        import torch

        spec = asdict(self)
        # Config fields added after a model was first cached, at their default, leave its
        # fingerprint as it was: a Llama model stays cached across the change.
        for name in ("model_type", "rope_scaling"):
            if spec["config"][name] == getattr(ModelConfig, name):
                del spec["config"][name]
        record = {"spec": spec, "version": GENERATOR_VERSION, "torch": torch.__version__}
        return _digest(record)

    def tokenizer_fingerprint(self) -> str:
        record = {
            "vocab_size": self.config.vocab_size,
            "seed": self.seed,
            "version": GENERATOR_VERSION,
            "tokenizers": tokenizers.__version__,
        }
        return _digest(record)

    def write_tokenizer_dir(self, path: Path) -> None:
        """The tokenizer files of `write_model_dir`, and a marker, without the weights."""
        tokenizer = build_tokenizer(self.config.vocab_size, seed=self.seed)
        write_tokenizer(tokenizer, path, self.config)
        marker = {"fingerprint": self.tokenizer_fingerprint(), "spec": asdict(self)}
        (path / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


BUILTINS: dict[str, BuiltinSpec] = {
    name: BuiltinSpec(
        name=name,
        config=ModelConfig(**asdict(shape), rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0),
    )
    for name, shape in BUILTIN_SHAPES.items()
}


def cache_root() -> Path:
    return Path(os.environ.get("WOK_CACHE_DIR") or Path.home() / ".cache" / "wok")


def builtin_spec(name: str) -> BuiltinSpec:
    if name not in BUILTINS:
        raise ValueError(f"unknown built-in model {name!r}; choose one of {sorted(BUILTINS)}")
    return BUILTINS[name]


def ensure_builtin(name: str, *, root: Path | None = None) -> Path:
    """The directory of built-in model `name`, generated on first use."""
    return ensure_generated(builtin_spec(name), (root or cache_root()) / "models")


def ensure_builtin_tokenizer(name: str, *, root: Path | None = None) -> Path:
    """A directory with only the tokenizer files of built-in model `name`, generated on first use
    (the same tokenizer as `ensure_builtin(name)`'s, without torch)."""
    spec = builtin_spec(name)
    parent = (root or cache_root()) / "tokenizers"
    return _generate_once(parent / name, spec.tokenizer_fingerprint(), spec.write_tokenizer_dir)


def ensure_generated(spec: BuiltinSpec, parent: Path) -> Path:
    """Generates `spec` into `parent/NAME` unless an up-to-date copy is there."""
    return _generate_once(
        parent / spec.name, spec.fingerprint(), lambda p: write_model_dir(spec, p)
    )


def _generate_once(target: Path, fingerprint: str, write: Callable[[Path], None]) -> Path:
    """`write`s a directory at `target` unless one with `fingerprint` in its marker is there.

    Safe when several processes start at once: each writes a private temporary directory next to
    the target and renames it into place; the rename is atomic, so a reader sees either no
    directory or a complete one, and a loser of the race discards its copy.
    """
    if _is_current(target, fingerprint):
        return target
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=parent))
    try:
        write(tmp)
        # mkdtemp makes a private directory; the cache is meant to be read by every user.
        tmp.chmod(0o755)
        for file in tmp.iterdir():
            file.chmod(0o644)
        if target.exists() and not _is_current(target, fingerprint):
            # Stale generator version: move it aside (atomically) before swapping in the new one.
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale-", dir=parent))
            with contextlib.suppress(FileNotFoundError):  # another process moved it first
                target.rename(stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.rename(target)
        except OSError:
            if not _is_current(target, fingerprint):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _is_current(path: Path, fingerprint: str) -> bool:
    try:
        return json.loads((path / MARKER).read_text()).get("fingerprint") == fingerprint
    except (OSError, ValueError):
        return False


def _digest(record: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def write_model_dir(spec: BuiltinSpec, path: Path, *, max_shard_bytes: int | None = None) -> None:
    """Writes `spec` as a Hugging Face directory (config, safetensors, tokenizer files)."""
    from wok_runtime.core.weights import save_safetensors

    path.mkdir(parents=True, exist_ok=True)
    config = spec.config
    (path / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2) + "\n")
    (path / "generation_config.json").write_text(
        json.dumps(
            {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id}, indent=2
        )
        + "\n"
    )
    save_safetensors(random_weights(spec), path, max_shard_bytes=max_shard_bytes)
    write_tokenizer(build_tokenizer(config.vocab_size, seed=spec.seed), path, config)
    (path / MARKER).write_text(
        json.dumps({"fingerprint": spec.fingerprint(), "spec": asdict(spec)}, indent=2) + "\n"
    )


def random_weights(spec: BuiltinSpec) -> dict[str, torch.Tensor]:
    """Hugging Face-named fp32 tensors drawn in a fixed order from one seeded generator."""
    import torch

    c = spec.config
    gen = torch.Generator().manual_seed(spec.seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * spec.init_std

    def norm_weight() -> torch.Tensor:
        # Not all ones, so a test notices a norm weight that was loaded wrongly or not at all.
        return 1.0 + 0.1 * torch.randn(c.hidden_size, generator=gen)

    q_size = c.num_attention_heads * c.head_dim
    kv_size = c.num_key_value_heads * c.head_dim
    out = {"model.embed_tokens.weight": normal(c.vocab_size, c.hidden_size)}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm_weight()
        out[p + "self_attn.q_proj.weight"] = normal(q_size, c.hidden_size)
        out[p + "self_attn.k_proj.weight"] = normal(kv_size, c.hidden_size)
        out[p + "self_attn.v_proj.weight"] = normal(kv_size, c.hidden_size)
        out[p + "self_attn.o_proj.weight"] = normal(c.hidden_size, q_size)
        out[p + "post_attention_layernorm.weight"] = norm_weight()
        out[p + "mlp.gate_proj.weight"] = normal(c.intermediate_size, c.hidden_size)
        out[p + "mlp.up_proj.weight"] = normal(c.intermediate_size, c.hidden_size)
        out[p + "mlp.down_proj.weight"] = normal(c.hidden_size, c.intermediate_size)
    out["model.norm.weight"] = norm_weight()
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = normal(c.vocab_size, c.hidden_size)
    return out


def _synthetic_corpus(seed: int, lines: int) -> Iterator[str]:
    """Word-like text from a seeded generator: enough distinct words to fill a large vocab."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    syllables += ["th", "sh", "ch", "st", "ng", "er", "an", "in", "the", "and", "ing", "ion"]
    for _ in range(lines):
        words = [
            "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(4, 16))
        ]
        if rng.random() < 0.3:
            words[0] = words[0].capitalize()
        yield " ".join(words) + rng.choice(".,!?;:") + f" {rng.randint(0, 9999)}\n"


def build_tokenizer(vocab_size: int, *, seed: int = 0) -> Tokenizer:
    """A byte-level BPE tokenizer (any text encodes) whose vocabulary fills `vocab_size`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The corpus grows with the vocabulary: BPE can only learn as many merges as it has words.
    lines = max(2000, vocab_size * 2)
    tokenizer.train_from_iterator(_synthetic_corpus(seed, lines), trainer=trainer)
    return tokenizer


def write_tokenizer(tokenizer: Tokenizer, path: Path, config: ModelConfig) -> None:
    tokenizer.save(str(path / "tokenizer.json"))
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    special = {
        "bos_token": EOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
    }
    (path / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
