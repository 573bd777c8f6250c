"""The runtime's tokenizer: a `tokenizers.Tokenizer` plus the few facts from tokenizer_config.json
the server needs (special tokens, the chat template), without importing transformers.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Tokenizer:
    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        eos_token_id: int | None,
        bos_token_id: int | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.backend = backend
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id
        self.chat_template = chat_template

    @classmethod
    def from_dir(cls, path: Path) -> Tokenizer:
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(
                f"{file} not found (only tokenizer.json tokenizers are supported)"
            )
        backend = tokenizers.Tokenizer.from_file(str(file))
        settings: dict[str, Any] = {}
        if (path / "tokenizer_config.json").is_file():
            settings = json.loads((path / "tokenizer_config.json").read_text())
        template = settings.get("chat_template")
        if template is None and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        return cls(
            backend,
            eos_token_id=_token_id(backend, settings.get("eos_token")),
            bos_token_id=_token_id(backend, settings.get("bos_token")),
            chat_template=template if isinstance(template, str) else None,
        )

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def max_chars_per_token(self) -> int:
        """The most characters of text one token can stand for: the longest vocabulary entry
        (a byte-level entry has one character per byte, and a character is at least a byte), or
        a WordPiece model's longest word that it maps to one unknown token. A prompt longer
        than this times the context cannot fit, whatever its tokens (tokenizers whose
        normalizer deletes characters aside)."""
        longest = max(map(len, self.backend.get_vocab(with_added_tokens=True)), default=1)
        return max(longest, getattr(self.backend.model, "max_input_chars_per_word", 1))

    def encode(self, text: str) -> list[int]:
        # The batch call releases the GIL while it works (encode() holds it: a long prompt
        # would stall the server's event loop even from a worker thread), and the fast variant
        # skips the character offsets, which nothing here reads.
        return self.backend.encode_batch_fast([text])[0].ids

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> str:
        """Renders messages with the model's Jinja chat template (the same sandbox as HF)."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self._token_text(self.bos_token_id),
            eos_token=self._token_text(self.eos_token_id),
        )

    def _token_text(self, token_id: int | None) -> str:
        if token_id is None:
            return ""
        return self.backend.id_to_token(token_id) or ""


def _token_id(backend: tokenizers.Tokenizer, token: Any) -> int | None:
    # tokenizer_config.json writes special tokens as a string or as an AddedToken dict.
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str):
        return None
    return backend.token_to_id(token)
