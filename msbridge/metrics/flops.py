"""Training FLOPs per token of a transformer, from its config: the standard dense count ``6·N + 12·L·h·s``.

``N`` is the parameters a token goes through in matrix multiplies: per layer the attention projections
(``h·h`` for Q and the output, ``h·kv_dim`` each for K and V, ``kv_dim = h / heads · kv_heads``) and the
feed-forward (``3·h·ffn`` gated, as SwiGLU, ``2·h·ffn`` otherwise; for a mixture of experts the active ones:
``top-k + shared`` experts of ``moe_ffn`` each, plus the router's ``h·experts``), and the output head
``h·vocab``. The input embedding is a lookup, not a multiply, and is left out; norms and biases are too
(under 2 % of ``N`` for any model here). A token costs ``2·N`` FLOPs forward and ``4·N`` backward: ``6·N``.
The attention scores and their product with V add ``12·L·h·s`` per token (forward and backward; the causal
mask is not subtracted), the count of the PaLM paper (Chowdhery et al. 2022, appendix B) that Megatron-LM
and torchtitan also use. Activation recomputation is not counted: this is *model* FLOPs, what MFU means.

The fields are mindformers' (``model.model_config``: ``num_layers``, ``hidden_size``, ``intermediate_size``,
``num_heads``, ``n_kv_heads``, ``vocab_size``, ``seq_length``, ``moe_config``), with the Hugging Face and
Megatron names as aliases (``num_hidden_layers``, ``ffn_hidden_size``, ``num_key_value_heads`` ...).
Without such a config, ``network_matmul_params`` counts ``N`` once from the network's trained 2-D weights
(embedding tables left out), and the count is ``6·N`` alone: the attention term needs ``L``, ``h`` and ``s``.

Example:
    >>> shape = TransformerShape.from_config({"num_layers": 2, "hidden_size": 64, "num_heads": 4,
    ...                                       "vocab_size": 64, "seq_length": 32})
    >>> shape.matmul_params(), flops_per_token(shape)
    (102400, 663552)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from ..config.keys import dig

#: Each field and the config keys that may hold it, the first found wins.
ALIASES = {
    "num_layers": ("num_layers", "num_hidden_layers", "n_layer", "n_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "ffn": ("intermediate_size", "ffn_hidden_size"),
    "num_heads": ("num_heads", "num_attention_heads", "n_head"),
    "kv_heads": ("n_kv_heads", "num_key_value_heads", "num_query_groups"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "seq_length": ("seq_length", "seq_len"),
    "experts": ("expert_num", "num_experts", "n_routed_experts", "num_local_experts"),
    "top_k": ("num_experts_chosen", "num_experts_per_tok", "moe_router_topk"),
    "shared": ("shared_expert_num", "n_shared_experts"),
    "moe_ffn": ("moe_intermediate_size", "moe_ffn_hidden_size"),
}
#: The fields without which there is no count.
REQUIRED = ("num_layers", "hidden_size", "num_heads", "vocab_size")
#: Activations whose feed-forward has a gate (three matrices, not two).
GATED = ("silu", "swiglu", "swish", "geglu", "fusedswiglu")


def _first(config: Mapping[str, Any], field: str) -> Optional[int]:
    for key in ALIASES[field]:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _llama_ffn(config: Mapping[str, Any], hidden: int) -> int:
    """mindformers' ``LlamaFeedForward`` width when ``intermediate_size`` is unset (llama_layer.py)."""
    multiple_of = int(config.get("multiple_of") or 256)
    width = 4 * hidden
    if config.get("ffn_dim_multiplier") is not None:
        width = int((float(config["ffn_dim_multiplier"]) + 0.01) * width)
    width = int(2 * width / 3)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class TransformerShape:
    """The sizes the count needs; ``experts`` 0 for a dense model.

    Example:
        >>> TransformerShape(num_layers=2, hidden_size=64, num_heads=4, kv_heads=4, vocab_size=64,
        ...                  ffn=256, gated=False).attention_params()
        16384
    """

    num_layers: int
    hidden_size: int
    num_heads: int
    kv_heads: int
    vocab_size: int
    ffn: int
    gated: bool
    seq_length: Optional[int] = None
    experts: int = 0
    top_k: int = 0
    shared: int = 0
    moe_ffn: int = 0

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Optional["TransformerShape"]:
        """The shape a model config gives (its ``moe_config`` merged in), or None when a required field is missing."""
        moe = config.get("moe_config")
        merged = {**config, **(moe if isinstance(moe, Mapping) else {})}
        found = {field: _first(merged, field) for field in ALIASES}
        if any(found[field] is None for field in REQUIRED):
            return None
        hidden = found["hidden_size"]
        act = str(merged.get("hidden_act") or "").lower()
        llama = "llama" in str(merged.get("type") or merged.get("model_type") or "").lower()
        gated = act in GATED or (not act and llama)
        ffn = found["ffn"] or (_llama_ffn(merged, hidden) if llama else 4 * hidden)
        experts = found["experts"] or 0
        return cls(num_layers=found["num_layers"], hidden_size=hidden, num_heads=found["num_heads"],
                   kv_heads=found["kv_heads"] or found["num_heads"], vocab_size=found["vocab_size"], ffn=ffn,
                   gated=gated, seq_length=found["seq_length"], experts=experts if experts > 1 else 0,
                   top_k=found["top_k"] or (1 if experts > 1 else 0), shared=found["shared"] or 0,
                   moe_ffn=found["moe_ffn"] or ffn)

    def attention_params(self) -> int:
        """One layer's Q, K, V and output projections."""
        kv_dim = self.hidden_size // self.num_heads * self.kv_heads
        return 2 * self.hidden_size * self.hidden_size + 2 * self.hidden_size * kv_dim

    def ffn_params(self) -> int:
        """One layer's feed-forward as a token sees it: the active experts and the router for a MoE."""
        matrices = 3 if self.gated else 2
        if not self.experts:
            return matrices * self.hidden_size * self.ffn
        active = (self.top_k + self.shared) * matrices * self.hidden_size * self.moe_ffn
        return active + self.hidden_size * self.experts

    def matmul_params(self) -> int:
        """``N``: every layer's attention and feed-forward, and the output head."""
        per_layer = self.attention_params() + self.ffn_params()
        return self.num_layers * per_layer + self.hidden_size * self.vocab_size


def flops_per_token(shape: TransformerShape, seq_length: Optional[int] = None) -> int:
    """Training FLOPs of one token: ``6·N + 12·L·h·s`` (``s``: ``seq_length``, else the shape's; 0 when neither)."""
    s = seq_length or shape.seq_length or 0
    return 6 * shape.matmul_params() + 12 * shape.num_layers * shape.hidden_size * s


#: Where a run's params keep the model config, the first that is a mapping wins: a mindformers run YAML's
#: ``model.model_config``, a plain ``model`` section (the demo's), ``model_config``.
MODEL_CONFIG_PATHS: Tuple[Tuple[str, ...], ...] = (("model", "model_config"), ("model",), ("model_config",))


def model_config_in(params: Mapping[str, Any]) -> Tuple[Optional[Mapping[str, Any]], str]:
    """The model config among a run's ``params`` and its dotted path (``params.model.model_config``), or None."""
    for path in MODEL_CONFIG_PATHS:
        node = dig(params, *path)
        if isinstance(node, Mapping) and TransformerShape.from_config(node) is not None:
            return node, "params." + ".".join(path)
    return None, ""


def network_matmul_params(params: Any, network: Any = None) -> int:
    """``N`` counted from a network: the elements of the trained 2-D weights (``params``: the optimizer's
    parameters, or the network's trainable ones), leaving out embedding tables (a ``nn.Embedding``'s, or a name
    with ``embed``: a lookup is not a multiply). Shapes only: nothing is read from the device."""
    tables = set()
    if network is not None:
        from mindspore import nn

        for _, cell in network.cells_and_names():
            if isinstance(cell, nn.Embedding):
                tables.add(id(cell.embedding_table))
    total = 0
    for p in params:
        if len(p.shape) == 2 and id(p) not in tables and "embed" not in p.name.lower():
            total += int(p.shape[0]) * int(p.shape[1])
    return total
