"""attn_implementation="onlinesoftmax" and causal_lm_loss across decoder-only architectures: tiny random-weight
configs built with from_config (no download), each against its own eager (and SDPA) implementation. The layers
that run our kernels must not fall back; those that cannot (a value head dim unlike the query's, ALiBi's float
mask, chunked attention, a sliding window the layer does not pass) must warn."""

import functools
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_transformers import _batch as transformers_batch  # noqa: E402

from onlinesoftmax.integrations import transformers as osst  # noqa: E402

osst.register()
T = transformers
DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(rtol=2e-4, atol=2e-4) if DEV == "cpu" else dict(rtol=3e-3, atol=3e-3)     # TF32 matmuls on the GPU
C = dict(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, max_position_embeddings=256, attention_dropout=0.0)
SW = dict(sliding_window=5, layer_types=["sliding_attention", "full_attention"])
GPT = dict(vocab_size=211, n_embd=64, n_layer=2, n_head=4, n_positions=256, attn_pdrop=0.0, resid_pdrop=0.0,
           embd_pdrop=0.0)
# name -> a fresh config (from_config records the implementation in the config it is given)
CONFIGS = {
    "qwen2_sliding": lambda: T.Qwen2Config(**C, use_sliding_window=True, sliding_window=5, max_window_layers=1),
    "qwen3": lambda: T.Qwen3Config(**C, head_dim=16),
    "qwen3_moe": lambda: T.Qwen3MoeConfig(**C, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=32),
    "mixtral": lambda: T.MixtralConfig(**C, num_local_experts=4, num_experts_per_tok=2, sliding_window=5),
    "phi3": lambda: T.Phi3Config(**C, pad_token_id=0),
    "gemma3": lambda: T.Gemma3TextConfig(**C, **SW, head_dim=16, query_pre_attn_scalar=12,
                                         final_logit_softcapping=15.0),
    "olmo2": lambda: T.Olmo2Config(**C),
    "cohere2": lambda: T.Cohere2Config(**C, **SW, logit_scale=0.25),
    "starcoder2": lambda: T.Starcoder2Config(**C, sliding_window=5, residual_dropout=0.0, embedding_dropout=0.0),
    "granite": lambda: T.GraniteConfig(**C, attention_multiplier=0.1, logits_scaling=4.0, embedding_multiplier=2.0,
                                       residual_multiplier=0.5),
    "gpt_neox": lambda: T.GPTNeoXConfig(**{**C, "num_key_value_heads": None}, rotary_pct=0.25, hidden_dropout=0.0),
    "gpt2": lambda: T.GPT2Config(**GPT),
    "gpt_bigcode": lambda: T.GPTBigCodeConfig(**GPT, multi_query=True),
    "falcon": lambda: T.FalconConfig(vocab_size=211, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_kv_heads=2, new_decoder_architecture=True, attention_dropout=0.0,
                                     hidden_dropout=0.0),
    "falcon_alibi": lambda: T.FalconConfig(vocab_size=211, hidden_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, alibi=True, attention_dropout=0.0,
                                           hidden_dropout=0.0),
    "stablelm": lambda: T.StableLmConfig(**C, partial_rotary_factor=0.25, use_qkv_bias=True, qk_layernorm=True),
    "smollm3": lambda: T.SmolLM3Config(**C, no_rope_layer_interval=2, pad_token_id=0),
    "glm4": lambda: T.Glm4Config(**C, head_dim=16, partial_rotary_factor=0.5, pad_token_id=0),
    "exaone4": lambda: T.Exaone4Config(**C, head_dim=16, sliding_window=5, sliding_window_pattern=2),
    "olmo3": lambda: T.Olmo3Config(**C, **SW),
    "minimax": lambda: T.MiniMaxConfig(**C, head_dim=16, num_local_experts=4, num_experts_per_tok=2, block_size=4,
                                       layer_types=["linear_attention", "full_attention"]),
    "deepseek_v3": lambda: T.DeepseekV3Config(**{**C, "num_key_value_heads": 4}, moe_intermediate_size=32,
                                              n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                                              first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24,
                                              qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12),
    "llama4_text": lambda: T.Llama4TextConfig(**C, head_dim=16, intermediate_size_mlp=96, num_local_experts=2,
                                              num_experts_per_tok=1, attention_chunk_size=6, no_rope_layers=[1, 0],
                                              interleave_moe_layer_step=1),
    "phimoe": lambda: T.PhimoeConfig(**C, num_local_experts=4, num_experts_per_tok=2, sliding_window=5),
}
# the layers these run fall back, with this warning (13 tokens: past llama4_text's chunk of 6; PhiMoE's layers do
# not pass their sliding window, so its mask is not one the kernels are told of)
FALLBACK = {"deepseek_v3": "value head dim", "falcon_alibi": "boolean", "llama4_text": "not causal",
            "phimoe": "not causal"}
NAMES = sorted(CONFIGS)


def _model(name, impl, **overrides):
    torch.manual_seed(0)
    cfg = CONFIGS[name]()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    try:
        m = T.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)
    except KeyError as e:
        # an architecture this transformers version does not route through its AttentionInterface: its layers look
        # the implementation up in their own table (transformers 5.17's Falcon: KeyError 'onlinesoftmax')
        if impl != osst.NAME or e.args != (osst.NAME,):
            raise
        pytest.skip(f"transformers {T.__version__}'s {name} does not dispatch through AttentionInterface")
    assert m.config._attn_implementation == impl
    return m.to(DEV).eval()


def _batch(padded: bool):
    return transformers_batch(padded, low=3)


def _ours(fn):
    """fn() with every warning recorded and the one-warning-per-reason memory cleared: (result, our warnings)."""
    osst._warned.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(x.message) for x in w if "onlinesoftmax" in str(x.message)]


def _check_fallback(name, seen):
    if name in FALLBACK:
        assert any(FALLBACK[name] in s for s in seen), seen
    else:
        assert not seen, seen


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_zoo_logits_match_eager_and_sdpa(name, padded):
    ids, mask = _batch(padded)
    with torch.no_grad():
        got, seen = _ours(lambda: _model(name, "onlinesoftmax")(ids, attention_mask=mask).logits)
        keep = mask.bool()                                                # padded positions are not compared
        for impl in ("eager", "sdpa"):
            want = _model(name, impl)(ids, attention_mask=mask).logits
            torch.testing.assert_close(got[keep], want[keep], **TOL, msg=impl)
    _check_fallback(name, seen)


@pytest.mark.parametrize("name", NAMES)
def test_zoo_generate_greedy_is_identical(name):
    ids, mask = _batch(True)
    out = {impl: _model(name, impl).generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=10,
                                             pad_token_id=0) for impl in ("onlinesoftmax", "eager")}
    torch.testing.assert_close(out["onlinesoftmax"], out["eager"])


def _loss_and_grads(name, padded, **overrides):
    ids, mask = _batch(padded)
    # a left-padded row's first real token is predicted from a padding position: left out (docs/integrations.md)
    labels = ids.masked_fill(mask == 0, -100).scatter(-1, mask.argmax(-1)[:, None], -100)
    ref = _model(name, "eager", **overrides).train()
    mine = _model(name, "onlinesoftmax", **overrides).train()
    torch.manual_seed(5)                    # PhiMoE's router samples in training
    want = ref(ids, attention_mask=mask, labels=labels).loss
    torch.manual_seed(5)
    got = osst.causal_lm_loss(mine, ids, labels, attention_mask=mask)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    want.backward()
    got.backward()
    for (n, a), (_, b) in zip(mine.named_parameters(), ref.named_parameters()):
        if a.grad is None or b.grad is None:
            assert a.grad is None and b.grad is None, n
        elif DEV == "cpu":
            torch.testing.assert_close(a.grad, b.grad, rtol=2e-3, atol=2e-5, msg=n)
        else:       # TF32 tensor cores in our fp32 attention and loss kernels: a bound on the whole gradient
            assert (a.grad - b.grad).norm() / b.grad.norm().clamp_min(1e-12) < 1e-2, n


@pytest.mark.parametrize("name", NAMES)
def test_zoo_causal_lm_loss_and_gradients(name):
    """Llama 4's get_decoder() answers the causal LM itself (its base_model_prefix names no attribute): the loss
    reads model.model's hidden states, not the logits."""
    _loss_and_grads(name, padded=True)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "phimoe"])
def test_zoo_causal_lm_loss_adds_the_router_loss(name):
    """With output_router_logits the model's loss adds router_aux_loss_coef x its load-balancing loss: so does
    causal_lm_loss (gradients into the routers included)."""
    _loss_and_grads(name, padded=True, output_router_logits=True, router_aux_loss_coef=0.5)


def test_zoo_causal_lm_loss_refuses_another_router_loss():
    """JetMoE weights its load-balancing loss by aux_loss_coef: not reproduced, so a NotImplementedError rather than
    a loss without it."""
    cfg = T.JetMoeConfig(vocab_size=211, hidden_size=32, num_hidden_layers=1, num_key_value_heads=2, kv_channels=8,
                         intermediate_size=32, num_local_experts=2, num_experts_per_tok=1, output_router_logits=True)
    m = T.AutoModelForCausalLM.from_config(cfg).to(DEV)
    ids, mask = _batch(False)
    with pytest.raises(NotImplementedError, match="causal_lm_loss: JetMoeForCausalLM adds a router"):
        osst.causal_lm_loss(m, ids, ids, attention_mask=mask)


@pytest.mark.interpreter
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("name", ["gemma3", "gpt_bigcode", "granite"])
def test_zoo_triton_kernels_match_eager(name, padded, monkeypatch):
    """The Triton kernels (the interpreter on the CPU) under the integration: attention unpadded, attention_varlen
    padded; sliding window + final softcap, MQA, attention_multiplier as the scale."""
    monkeypatch.setattr(osst, "_attention", functools.partial(osst._attention, backend="triton"))
    monkeypatch.setattr(osst, "_attention_varlen", functools.partial(osst._attention_varlen, backend="triton"))
    ids, mask = _batch(padded)
    with torch.no_grad():
        got, seen = _ours(lambda: _model(name, "onlinesoftmax")(ids, attention_mask=mask).logits)
        want = _model(name, "eager")(ids, attention_mask=mask).logits
    assert not seen, seen
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], **TOL)
