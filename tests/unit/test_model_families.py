"""The Llama family's variations are computed as `transformers` computes them, and the rest is
refused.

Each family's reference is `transformers` itself: a small model it builds from that family's
config class with random weights, saved to a temporary directory (no weights ship with the
tests). Query and key weights get a large std so attention is sharp (position matters), biases
and q/k norms are far from their init (a missed one shows), and the prompts are longer than
Llama 3.1's original context, so its RoPE scaling changes the tokens.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from test_model_runner import check_against_hf, generate_paged, prompts, runner_for

from wok_operator.budget import architecture_from_hf_config, parameter_count
from wok_runtime.core.builtin import ensure_builtin_tokenizer
from wok_runtime.core.model_config import Llama3RopeScaling, ModelConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHAPE = dict(
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=256,
    bos_token_id=0,
    eos_token_id=0,
)
ORIGINAL_CONTEXT = 32  # Llama 3.1's original_max_position_embeddings, scaled down
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": ORIGINAL_CONTEXT,
}
FAMILIES = {
    "llama3.1": lambda: transformers.LlamaConfig(**SHAPE, rope_parameters=dict(LLAMA3_ROPE)),
    "qwen2.5": lambda: transformers.Qwen2Config(**SHAPE, tie_word_embeddings=True),
    # head_dim 32 with 4 heads: q is wider than the hidden state, as in Qwen3.
    "qwen3": lambda: transformers.Qwen3Config(**SHAPE, head_dim=32),
    "mistral-v0.3": lambda: transformers.MistralConfig(**SHAPE, sliding_window=None),
}
LENGTHS = [80, 3, 45]  # the longest two pass ORIGINAL_CONTEXT before they decode
SHARP_STD = 0.5


def build_hf_dir(config: transformers.PretrainedConfig, path: Path, *, seed: int = 0) -> Path:
    """A Hugging Face directory of a random-weight model that transformers builds from
    `config`, with a tokenizer (the runtime loads one; these tests do not use it)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.copy_(SHARP_STD * torch.randn(param.shape, generator=gen))
            elif name.endswith("bias") or "norm" in name:
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
    model.save_pretrained(path)
    for file in ensure_builtin_tokenizer("tiny").glob("*.json"):
        if file.name.startswith("tokenizer") or file.name == "special_tokens_map.json":
            shutil.copy2(file, path / file.name)
    return path


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: build_hf_dir(make(), root / name) for name, make in FAMILIES.items()}


def as_transformers_4(path: Path, out: Path) -> Path:
    """The same model with Llama 3.1's config as transformers 4 wrote it: `rope_theta` at the
    top, the scaling under `rope_scaling`."""
    shutil.copytree(path, out)
    raw = json.loads((path / "config.json").read_text())
    rope = raw.pop("rope_parameters")
    raw["rope_theta"] = rope.pop("rope_theta")
    raw["rope_scaling"] = rope
    (out / "config.json").write_text(json.dumps(raw))
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_is_greedy_equal_to_transformers(
    family: str, family_dirs: dict[str, Path]
) -> None:
    check_against_hf(family_dirs[family], LENGTHS, steps=16, chunk=16, tol=1e-3)


def test_llama3_scaling_reads_the_same_from_either_key(
    family_dirs: dict[str, Path], tmp_path: Path
) -> None:
    new = family_dirs["llama3.1"]
    old = as_transformers_4(new, tmp_path / "llama3.1-v4")
    config = ModelConfig.from_file(new / "config.json")
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, ORIGINAL_CONTEXT)
    assert ModelConfig.from_file(old / "config.json") == config
    check_against_hf(old, LENGTHS[:1], steps=8, chunk=16, tol=1e-3)


def test_unscaled_rope_would_answer_differently(
    family_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """What the scaling test guards against: the same weights served with plain RoPE (what a
    config read without its rope type gave) leave transformers' greedy tokens."""
    plain = tmp_path / "plain"
    shutil.copytree(family_dirs["llama3.1"], plain)
    raw = json.loads((plain / "config.json").read_text())
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": LLAMA3_ROPE["rope_theta"]}
    (plain / "config.json").write_text(json.dumps(raw))
    ids = prompts(SHAPE["vocab_size"], LENGTHS)
    plain_tokens, _ = generate_paged(runner_for(plain), ids, 16, chunk=16)
    # The scaled runner's tokens are transformers' (test_each_family_is_greedy_equal_...).
    scaled_tokens, _ = generate_paged(runner_for(family_dirs["llama3.1"]), ids, 16, chunk=16)
    assert plain_tokens != scaled_tokens


def llama_dict(**changes: object) -> dict:
    raw = transformers.LlamaConfig(**SHAPE).to_dict()
    raw.update(changes)
    return raw


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize("rope_type", ["linear", "dynamic", "yarn", "longrope", "mrope"])
def test_a_rope_type_the_runtime_lacks_is_refused_under_either_key(
    key: str, rope_type: str
) -> None:
    raw = llama_dict()
    raw[key] = {"rope_type": rope_type, "factor": 4.0, "rope_theta": 10000.0}
    with pytest.raises(ValueError, match=f"RoPE type '{rope_type}' is not supported"):
        ModelConfig.from_hf_dict(raw)
    raw[key] = {"type": rope_type, "factor": 4.0}  # the older spelling of the key
    with pytest.raises(ValueError, match=f"RoPE type '{rope_type}' is not supported"):
        ModelConfig.from_hf_dict(raw)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": "gemma"}, "model_type 'gemma' is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding-window"),
        ({"model_type": "qwen2", "use_sliding_window": True}, "sliding-window"),
        ({"model_type": "mistral", "sliding_window": 64}, "sliding_window 64"),
        ({"rope_scaling": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "partial"),
    ],
)
def test_what_would_be_computed_wrongly_is_refused(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_dict(llama_dict(**changes))


def test_a_refused_model_never_loads(family_dirs: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "yarn"
    shutil.copytree(family_dirs["llama3.1"], path)
    raw = json.loads((path / "config.json").read_text())
    raw["rope_parameters"]["rope_type"] = "yarn"
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="RoPE type 'yarn'"):
        runner_for(path)


def test_the_families_round_trip_through_config_json(family_dirs: dict[str, Path]) -> None:
    for path in family_dirs.values():
        config = ModelConfig.from_file(path / "config.json")
        assert ModelConfig.from_hf_dict(config.to_hf_dict()) == config
    assert ModelConfig.from_file(family_dirs["qwen2.5"] / "config.json").qkv_bias
    assert ModelConfig.from_file(family_dirs["qwen3"] / "config.json").qk_norm


def test_the_budget_counts_each_familys_parameters(family_dirs: dict[str, Path]) -> None:
    """The operator sizes weights from config.json alone: Qwen2's biases and Qwen3's q/k norms
    count, as in the model transformers builds."""
    for name, path in family_dirs.items():
        arch = architecture_from_hf_config(path / "config.json")
        model = transformers.AutoModelForCausalLM.from_pretrained(path)
        assert parameter_count(arch) == sum(p.numel() for p in model.parameters()), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rms_norm_and_rotary_match_transformers_bit_for_bit(dtype: torch.dtype) -> None:
    """RMSNorm and RoPE compute exactly what Llama's modules compute, in low precision too
    (normalised in fp32, rounded, then weighted): a guard for any rewrite of them for speed."""
    from transformers.models.llama import modeling_llama as hf

    from wok_runtime.core.model import RMSNorm, apply_rope

    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 4, 96, generator=generator) * 3).to(dtype)
    ours, theirs = RMSNorm(96, 1e-5), hf.LlamaRMSNorm(96, eps=1e-5)
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(96, generator=generator))
        ours.weight.copy_(theirs.weight)
        ours, theirs = ours.to(dtype), theirs.to(dtype)
        assert torch.equal(ours(x), theirs(x))
    cos, sin = torch.randn(2, 64, 1, 96, generator=generator).to(dtype)
    expected = x * cos + hf.rotate_half(x) * torch.cat((sin[..., 48:], sin[..., 48:]), dim=-1)
    signed_sin = torch.cat((-sin[..., 48:], sin[..., 48:]), dim=-1)  # as rope_tables lays it out
    assert torch.equal(apply_rope(x, cos, signed_sin), expected)
