"""Built-in models are standard Hugging Face directories, generated deterministically and safely.

`transformers` and wok must read the same files the same way: the exported directory loads with
`LlamaForCausalLM` / `AutoTokenizer`, tokenizers agree, sharded checkpoints load, and two
generations of one spec are byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest
import torch
import transformers

from wok.cli import main as wok_main
from wok_runtime.core.builtin import BuiltinSpec, ensure_builtin, ensure_generated, write_model_dir
from wok_runtime.core.loader import export_model, load_model
from wok_runtime.core.model_config import ModelConfig
from wok_runtime.core.model_runner import ModelRunner, StepInput
from wok_runtime.core.tokenizer import Tokenizer
from wok_runtime.core.weights import (
    INDEX_FILE,
    iter_safetensors,
    load_safetensors,
    save_safetensors,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


SMALL = BuiltinSpec(
    name="small",
    seed=3,
    config=ModelConfig(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=1024,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=0,
    ),
)
TEXTS = ["Hello, wok! Fry every order at once.", "  spaces\tand\nnewlines ", "ünïcødé 漢字 🥡", ""]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "tiny"
    assert wok_main(["model", "export", "builtin:tiny", str(out)]) == 0
    return out


def test_export_loads_in_transformers(exported: Path) -> None:
    model = transformers.LlamaForCausalLM.from_pretrained(str(exported), dtype=torch.float32)
    config = ModelConfig.from_file(exported / "config.json")
    assert model.config.num_hidden_layers == config.num_hidden_layers == 4
    assert model.config.num_key_value_heads == 4 and model.config.num_attention_heads == 8
    assert model.config.tie_word_embeddings is False
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    # Generated weights are the ones the file says: spot-check one tensor against safetensors.
    tensors = load_safetensors(exported)
    torch.testing.assert_close(
        model.model.layers[2].mlp.up_proj.weight, tensors["model.layers.2.mlp.up_proj.weight"]
    )


def test_tokenizer_round_trips_and_agrees_with_transformers(exported: Path) -> None:
    ours = Tokenizer.from_dir(exported)
    theirs = transformers.AutoTokenizer.from_pretrained(str(exported))
    assert ours.vocab_size == len(theirs) == 8192
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False)
        assert ours.decode(ids) == text
        assert all(0 <= i < 8192 for i in ids)
    assert ours.eos_token_id == theirs.eos_token_id == 0
    # The byte-level vocabulary fills the model's: any generated id decodes to something.
    assert all(ours.decode([i], skip_special_tokens=False) for i in range(0, 8192, 97))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    want = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(messages, add_generation_prompt=True) == want
    assert want.endswith("<|im_start|>assistant\n")


def test_sharded_checkpoint_loads_like_the_single_file(exported: Path, tmp_path: Path) -> None:
    sharded = export_model(str(exported), tmp_path / "sharded", max_shard_bytes=4 << 20)
    index = json.loads((sharded / INDEX_FILE).read_text())
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) >= 3 and not (sharded / "model.safetensors").exists()
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    a = load_safetensors(exported)
    b = load_safetensors(sharded)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)

    ids = [5, 17, 99, 1000, 4]
    outs = []
    for path in (exported, sharded):
        runner = ModelRunner.from_source(str(path), kv_cache_bytes=1 << 20, block_size=8)
        outs.append(runner.forward([StepInput(ids, 0, [0])])[0])
    assert torch.equal(outs[0], outs[1])
    hf = transformers.LlamaForCausalLM.from_pretrained(
        str(sharded), attn_implementation="eager", dtype=torch.float32
    )
    with torch.inference_mode():
        want = hf(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(outs[1], want, rtol=0, atol=1e-4)


def test_an_index_naming_a_missing_tensor_is_an_error(tmp_path: Path) -> None:
    save_safetensors({"a": torch.zeros(4), "b": torch.ones(4)}, tmp_path, max_shard_bytes=16)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    index["weight_map"]["c"] = index["weight_map"]["a"]
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(ValueError, match="'c' is in the index"):
        load_safetensors(tmp_path)


def test_generation_is_deterministic(tmp_path: Path) -> None:
    write_model_dir(SMALL, tmp_path / "a")
    write_model_dir(SMALL, tmp_path / "b")
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert digest(tmp_path / "a" / name) == digest(tmp_path / "b" / name)
    other = BuiltinSpec(name="small", seed=4, config=SMALL.config)
    write_model_dir(other, tmp_path / "c")
    assert digest(tmp_path / "a" / "model.safetensors") != digest(
        tmp_path / "c" / "model.safetensors"
    )


def test_the_cached_tiny_model_is_the_seeded_one(tmp_path: Path) -> None:
    cached = ensure_builtin("tiny")
    fresh = ensure_builtin("tiny", root=tmp_path)
    assert fresh == tmp_path / "models" / "tiny"
    assert digest(cached / "model.safetensors") == digest(fresh / "model.safetensors")


def test_concurrent_first_use_yields_one_complete_directory(tmp_path: Path) -> None:
    results: list[Path] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            results.append(ensure_generated(SMALL, tmp_path))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == [tmp_path / "small"] * 3
    assert [p.name for p in tmp_path.iterdir()] == ["small"]  # no temporary leftovers
    model = load_model(tmp_path / "small", dtype=torch.float32, device=torch.device("cpu"))
    assert model.config == SMALL.config


def test_a_stale_cache_is_regenerated(tmp_path: Path) -> None:
    path = ensure_generated(SMALL, tmp_path)
    marker = path / "wok_builtin.json"
    marker.write_text(json.dumps({"fingerprint": "old"}))
    (path / "model.safetensors").write_bytes(b"broken")
    assert ensure_generated(SMALL, tmp_path) == path
    assert load_safetensors(path)  # readable again
    assert [p.name for p in tmp_path.iterdir()] == ["small"]


def test_export_cli_refuses_a_non_empty_target(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("x")
    assert wok_main(["model", "export", "builtin:tiny", str(tmp_path)]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert wok_main(["model", "export", "builtin:nope", str(tmp_path / "x")]) == 2


def test_config_validates_itself() -> None:
    with pytest.raises(ValueError, match="multiple of"):
        ModelConfig(
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=3,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=300,
        )
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        ModelConfig.from_hf_dict({"model_type": "gpt2"})
    raw = SMALL.config.to_hf_dict()
    assert ModelConfig.from_hf_dict(raw) == SMALL.config
    # transformers 5 writes rope_theta under rope_parameters.
    del raw["rope_theta"]
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    assert ModelConfig.from_hf_dict(raw).rope_theta == 5e5


def test_the_streaming_reader_agrees_with_the_safetensors_library(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    tensors = {
        "a": torch.randn(3, 4).to(torch.bfloat16),
        "b": torch.arange(5),
        "c": torch.tensor(1.5),
        "d": torch.zeros(0, 2),
        "e": torch.randn(7, 2, dtype=torch.float16),
    }
    save_safetensors(tensors, tmp_path, max_shard_bytes=40)
    assert (tmp_path / INDEX_FILE).is_file()
    reference: dict[str, torch.Tensor] = {}
    for file in tmp_path.glob("*.safetensors"):
        reference.update(load_file(str(file)))
    got = dict(iter_safetensors(tmp_path))
    assert got.keys() == reference.keys() == tensors.keys()
    for name, tensor in reference.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_a_tensor_of_the_wrong_shape_is_a_clear_error(tmp_path: Path) -> None:
    path = ensure_generated(SMALL, tmp_path)
    tensors = load_safetensors(path)
    tensors["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(3, 64)
    for file in path.glob("*.safetensors"):
        file.unlink()
    save_safetensors(tensors, path)
    with pytest.raises(ValueError, match=r"k_proj.weight' has shape \(3, 64\)"):
        load_model(path, dtype=torch.float32, device=torch.device("cpu"))
