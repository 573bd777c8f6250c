"""The runtime's tokenizer under long prompts: the bound on characters per token that lets the
server refuse a prompt before tokenizing it, and an encode that lets other threads run."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from wok_runtime.core.builtin import ensure_builtin_tokenizer
from wok_runtime.core.tokenizer import Tokenizer
from wok_runtime.http.metrics import RuntimeMetrics
from wok_runtime.http.server import APIError, Server
from wok_runtime.http.server_config import ServerConfig


@pytest.fixture(scope="module")
def tiny() -> Tokenizer:
    return Tokenizer.from_dir(ensure_builtin_tokenizer("tiny"))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400) | st.text(st.sampled_from(" \n\tab.é€😀"), max_size=400))
def test_no_token_stands_for_more_characters_than_the_bound(tiny: Tokenizer, text: str):
    assert len(tiny.encode(text)) * tiny.max_chars_per_token >= len(text)


def test_the_bound_is_the_longest_entry_or_wordpieces_unknown_word():
    vocab = {"[UNK]": 0, "a": 1, "abcdefg": 2}
    wordpiece = tokenizers.Tokenizer(tokenizers.models.WordPiece(vocab, unk_token="[UNK]"))
    # An unknown word of up to max_input_chars_per_word characters is one [UNK].
    assert Tokenizer(wordpiece, eos_token_id=None).max_chars_per_token == 100
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE({"a": 0, "abcdefg": 1}, []))
    assert Tokenizer(bpe, eos_token_id=None).max_chars_per_token == 7


def test_encode_lets_other_threads_run(tiny: Tokenizer):
    """A long encode must not hold the GIL: the server runs it on a worker thread while its
    event loop answers the probes."""
    text = "hello world " * 100_000
    ticks = 0
    done = threading.Event()

    def tick() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    time.sleep(0.01)
    before = ticks
    started = time.perf_counter()
    ids = tiny.encode(text)
    took = time.perf_counter() - started
    done.set()
    ticker.join()
    assert ids[:4] == tiny.backend.encode(text[:48]).ids[:4]
    # Holding the GIL, the ticker would not run at all while encode works (~1 s here).
    assert ticks - before >= max(3, 0.1 * took / 0.001), (ticks - before, took)


def _server(tokenizer: Tokenizer, max_model_len: int) -> Server:
    engine = SimpleNamespace(
        vocab_size=tokenizer.vocab_size,
        tokenizer=tokenizer,
        max_model_len=max_model_len,
        stats=lambda: None,
    )
    return Server(engine, ServerConfig(served_model_name="m"), RuntimeMetrics("m", engine.stats))


def test_a_prompt_too_long_in_characters_is_refused_before_it_is_tokenized(tiny: Tokenizer):
    server = _server(tiny, max_model_len=256)
    most = (256 - 16) * tiny.max_chars_per_token  # characters that may still fit
    with pytest.raises(APIError) as caught:
        asyncio.run(server.tokenize("x" * 10_000_000, max_tokens=16, param="prompt"))
    assert caught.value.status == 400 and caught.value.code == "context_length_exceeded"
    assert caught.value.param == "prompt"
    assert "10000000 characters are at least 769231 tokens" in caught.value.message
    with pytest.raises(APIError, match=f"{most + 1} characters"):
        asyncio.run(server.tokenize("x" * (most + 1), max_tokens=16, param="prompt"))
    ids = asyncio.run(server.tokenize("x" * most, max_tokens=16, param="prompt"))
    assert ids == tiny.encode("x" * most)  # at the bound it is tokenized (and may still be long)
    assert asyncio.run(server.tokenize("", max_tokens=16, param="prompt")) == []
