"""Turns a growing list of output token ids into text, and finds OpenAI `stop` strings in it.

Why the server needs this: the engine stops on token ids, but clients stop on strings, which may
span tokens or end mid-token; and a streamed chunk must never show text that a stop string later
cuts off, nor half a UTF-8 character. So each update works on the whole text so far and releases
only what is certainly final.

The whole text is not re-decoded on every token (that is quadratic in the output length, and it
was most of a busy server's CPU): as vLLM does, only the tokens since a few tokens before the last
clean boundary (an end that is not half a character) are decoded, and the text of the tokens
before it is kept. Starting the window a little early keeps decoders that treat a leading token
specially (a sentencepiece space) consistent.
"""

from __future__ import annotations

from collections.abc import Callable

_INCOMPLETE = "\ufffd"  # what a byte-level decoder shows for a partial UTF-8 sequence


class IncrementalText:
    def __init__(self, decode: Callable[[list[int]], str], stop: list[str]) -> None:
        self._decode = decode
        self._stop = [s for s in stop if s]
        # The longest text that could still be the start of a stop string.
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.token_ids: list[int] = []
        self.text = ""  # all text released so far
        self.stopped = False  # a stop string was found; the caller should abort the sequence
        # decode(token_ids[:_read]) is _settled; decode(token_ids[_prefix:_read]) is _window_head.
        self._prefix = 0
        self._read = 0
        self._settled = ""
        self._window_head = ""

    def add(self, new_ids: list[int], *, final: bool = False) -> str:
        """Adds ids; returns the newly released text (everything left when `final`)."""
        if self.stopped:
            return ""
        self.token_ids.extend(new_ids)
        full = self._full_text()
        # A stop string cannot begin inside the released text: that would have been found then.
        found = [full.find(s, max(0, len(self.text) - len(s) + 1)) for s in self._stop]
        hits = [at for at in found if at != -1]
        if hits:
            self.stopped = True
            return self._release(full[: min(hits)])
        if final:
            return self._release(full)
        end = len(full) - self._hold
        while end > len(self.text) and full[end - 1] == _INCOMPLETE:
            end -= 1
        return self._release(full[:end])

    def _full_text(self) -> str:
        """decode(token_ids), decoding only the window since `_prefix`."""
        window = self._decode(self.token_ids[self._prefix :])
        if not window.startswith(self._window_head):  # a decoder that is not additive: start over
            self._prefix = self._read = 0
            self._settled = self._window_head = ""
            window = self._decode(self.token_ids)
        full = self._settled + window[len(self._window_head) :]
        if not window.endswith(_INCOMPLETE):
            self._prefix, self._read = self._read, len(self.token_ids)
            self._settled = full
            self._window_head = self._decode(self.token_ids[self._prefix : self._read])
        return full

    def _release(self, upto: str) -> str:
        if len(upto) <= len(self.text):
            return ""
        new = upto[len(self.text) :]
        self.text = upto
        return new
