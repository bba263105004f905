"""FLOPs per token from a model config, against hand counts and against the real networks' weights: the demo
model (msbridge/demo.py) and a mindformers 1.9 tiny Llama (grouped KV heads, SwiGLU, the multiple_of rule)."""
from __future__ import annotations

import numpy as np
import pytest

from msbridge.demo import DEMO_DEFAULTS, build_model
from msbridge.metrics.flops import TransformerShape, flops_per_token, model_config_in

#: A mindformers 1.9 LlamaConfig small enough for CPU (its own defaults give the FFN width: 4h -> 2/3 -> x32).
TINY_LLAMA = {"type": "LlamaConfig", "batch_size": 1, "seq_length": 32, "hidden_size": 64, "num_layers": 2,
              "num_heads": 4, "n_kv_heads": 2, "vocab_size": 256, "multiple_of": 32, "use_rope_slice": True,
              "use_flash_attention": False, "fused_rms_norm": False, "compute_dtype": "float32",
              "param_init_type": "float32", "layernorm_compute_type": "float32",
              "softmax_compute_type": "float32", "rotary_dtype": "float32"}


def matmul_weights(network, skip: str) -> int:
    """Elements of the network's real 2-D weight matrices, leaving out the input embedding (``skip``)."""
    return sum(int(np.prod(p.shape)) for name, p in network.parameters_and_names()
               if len(p.shape) == 2 and skip not in name)


def within_2pct(counted: float, by_hand: float) -> bool:
    return abs(counted - by_hand) <= 0.02 * by_hand


def test_the_demo_models_count_is_the_hand_count_and_its_networks_weights():
    model = DEMO_DEFAULTS["model"]  # h 64, L 2, heads 4, vocab 64, s 32, GELU MLP of 4h
    h, layers, vocab, s = 64, 2, 64, 32
    per_layer = h * 3 * h + h * h + 2 * h * 4 * h  # qkv, proj, the two MLP matrices
    n_by_hand = layers * per_layer + h * vocab  # + the output head
    by_hand = 6 * n_by_hand + 12 * layers * h * s
    assert (n_by_hand, by_hand) == (102_400, 663_552)
    shape = TransformerShape.from_config(model)
    counted = flops_per_token(shape)
    assert within_2pct(counted, by_hand) and counted == by_hand
    net, _ = build_model(**model)
    assert matmul_weights(net, skip="embed") == shape.matmul_params()  # every Dense weight, nothing else
    every_param = sum(int(np.prod(p.shape)) for n, p in net.parameters_and_names() if "embed" not in n and n != "pos")
    assert within_2pct(every_param, n_by_hand)  # biases and norms: 1.8 % of N
    assert model_config_in({"model": model}) == (model, "params.model")


def test_a_mindformers_tiny_llamas_count_is_the_hand_count_and_its_networks_weights():
    pytest.importorskip("mindformers")
    import mindspore as ms
    from mindformers import LlamaConfig, LlamaForCausalLM

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    h, layers, heads, kv_heads, vocab, s = 64, 2, 4, 2, 256, 32
    ffn = 32 * ((int(2 * 4 * h / 3) + 31) // 32)  # LlamaFeedForward: 170 rounded up to 192
    kv_dim = h // heads * kv_heads
    per_layer = 2 * h * h + 2 * h * kv_dim + 3 * h * ffn  # wq, wo, wk, wv, and w1, w2, w3
    n_by_hand = layers * per_layer + h * vocab
    by_hand = 6 * n_by_hand + 12 * layers * h * s
    assert (ffn, n_by_hand, by_hand) == (192, 114_688, 737_280)
    yaml_like = {"model": {"model_config": TINY_LLAMA, "arch": {"type": "LlamaForCausalLM"}}}
    config, where = model_config_in(yaml_like)
    shape = TransformerShape.from_config(config)
    assert where == "params.model.model_config" and shape.gated and shape.ffn == 192
    assert within_2pct(flops_per_token(shape), by_hand)
    net = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "type"}))
    assert matmul_weights(net, skip="tok_embeddings") == shape.matmul_params() == n_by_hand


def test_a_moe_counts_the_active_experts_and_the_router():
    dense = {"num_layers": 4, "hidden_size": 128, "num_heads": 8, "vocab_size": 1000, "seq_length": 64,
             "intermediate_size": 256, "hidden_act": "silu"}
    moe = {**dense, "moe_config": {"expert_num": 8, "num_experts_chosen": 2, "shared_expert_num": 1,
                                   "moe_intermediate_size": 64}}
    d, m = TransformerShape.from_config(dense), TransformerShape.from_config(moe)
    assert d.ffn_params() == 3 * 128 * 256
    assert m.ffn_params() == (2 + 1) * 3 * 128 * 64 + 128 * 8  # three active experts and the router
    assert flops_per_token(d) - flops_per_token(m) == 6 * 4 * (d.ffn_params() - m.ffn_params())


def test_hugging_face_names_and_missing_fields():
    hf = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1,
          "vocab_size": 100, "intermediate_size": 96, "hidden_act": "silu"}
    shape = TransformerShape.from_config(hf)
    assert (shape.kv_heads, shape.ffn, shape.gated, shape.seq_length) == (1, 96, True, None)
    assert flops_per_token(shape) == 6 * shape.matmul_params()  # no sequence length: no attention term
    assert flops_per_token(shape, seq_length=10) == 6 * shape.matmul_params() + 12 * 2 * 64 * 10
    assert TransformerShape.from_config({"hidden_size": 64}) is None
    assert model_config_in({"model": {"arch": "x"}, "optimizer": {}}) == (None, "")
