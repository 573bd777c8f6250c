"""A whole step of the model as one compiled graph, with attention an opaque op inside it.

Why: at decode sizes most of a step that is not GEMMs is the cost of calling small operators
(norms, RoPE, SiLU, residuals) one by one from Python. Compiling each block's two halves around
attention fused them, but made 60 compiled calls a step, whose guards and wrappers cost what the
fusion saved under 128 rows, so small steps ran eager. vLLM compiles the whole model
instead and leaves attention to a custom op; so does this: the step from token ids to the
logits of each input's last token is one graph, and each layer's attention is `wok::attention`,
which inductor calls as it is and which runs the step's attention backend (the paged KV,
model_runner.py). The graph's first dimension (the step's tokens) and the rows it returns logits
for are unbacked sizes, so one graph, compiled once, serves every step from one decode to the
largest prefill.

The op writes the step's K/V into the pool without saying so to the compiler (as vLLM's
attention op does): the pool is none of the graph's inputs, and the layers' ops keep their order
because each layer's input is the previous layer's attention output.
"""

from __future__ import annotations

import torch

from wok_runtime.core.model import AttentionBackend, Transformer

#: The attention backend of the step that is running (one step at a time: the engine's thread).
_backend: AttentionBackend | None = None


@torch.library.custom_op("wok::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """The running step's attention for `layer`: q (T, H, hd), k/v (T, KVH, hd) -> (T, H, hd)."""
    assert _backend is not None, "wok::attention runs only inside StepGraph's call"
    return _backend(layer, q, k, v)


@attention_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    return torch.empty_like(q)


def _attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The backend the compiled model sees: one `wok::attention` call per layer."""
    return attention_op(q, k, v, layer)


class StepGraph:
    """`model`'s step compiled (inductor, one graph); the first call compiles it."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        # Rounded where eager rounds (bf16 after each op, not once per fused kernel): the
        # compiled step gives the eager step's tokens, not ones that differ at near-ties.
        # Static but for the sizes __call__ marks (dynamic=False also stops a second model in
        # the process from making the first one's weight sizes dynamic): with the weights'
        # sizes dynamic, inductor's code named a size it never bound.
        options = {"emulate_precision_casts": True}
        self._compiled = torch.compile(self._step, dynamic=False, fullgraph=True, options=options)

    def _step(
        self, input_ids: torch.Tensor, positions: torch.Tensor, last_rows: torch.Tensor
    ) -> torch.Tensor:
        hidden = self.model(input_ids, positions, _attend)  # (T, hidden)
        return self.model.logits(hidden[last_rows])  # (N, vocab), fp32

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        last_rows: torch.Tensor,
        attention: AttentionBackend,
    ) -> torch.Tensor:
        """fp32 logits of the rows `last_rows` picks; `attention` does each layer's attention."""
        global _backend
        for tensor in (input_ids, positions, last_rows):
            # Sizes the graph never specialises on: no recompile for a step of 1 token or row.
            torch._dynamo.decorators.mark_unbacked(tensor, 0)
        _backend = attention
        try:
            return self._compiled(input_ids, positions, last_rows)
        finally:
            _backend = None
