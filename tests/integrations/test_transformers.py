"""transformers models on onlinesoftmax's attention and loss: small random-weight configs built with from_config (no
download), on the CPU (the torch backend) and on the GPU (the Triton kernels, bf16)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from onlinesoftmax.integrations import transformers as osst  # noqa: E402

osst.register()
DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(rtol=2e-4, atol=2e-4) if DEV == "cpu" else dict(rtol=3e-3, atol=3e-3)     # TF32 matmuls on the GPU


def _configs():
    common = dict(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, attention_dropout=0.0, head_dim=16)
    return {
        "llama": transformers.LlamaConfig(**common),
        "mistral": transformers.MistralConfig(**common, sliding_window=5),
        "gemma2": transformers.Gemma2Config(**common, sliding_window=5, attn_logit_softcapping=20.0,
                                            final_logit_softcapping=15.0, query_pre_attn_scalar=16),
    }


def _model(name, impl, dtype=torch.float32):
    torch.manual_seed(0)
    cfg = _configs()[name]
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, torch_dtype=dtype)
    return m.to(DEV).eval()


def _batch(padded: bool, low: int = 0):
    """Three rows of 13 token ids in [low, 211), rows 0 and 2 left-padded by 4 and 1 (``padded``), and the mask."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(low, 211, (3, 13), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :4] = 0                     # left padding
        mask[2, :1] = 0
    return ids.to(DEV), mask.to(DEV)


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2"])
@pytest.mark.parametrize("padded", [False, True])
def test_logits_match_eager_and_sdpa(name, padded):
    ids, mask = _batch(padded)
    ours = _model(name, "onlinesoftmax")
    with torch.no_grad():
        got = ours(ids, attention_mask=mask).logits
        for impl in ("eager",) + (("sdpa",) if name != "gemma2" else ()):        # SDPA has no softcap
            want = _model(name, impl)(ids, attention_mask=mask).logits
            keep = mask.bool()                                                # padded positions are not compared
            torch.testing.assert_close(got[keep], want[keep], **TOL)


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2"])
def test_generate_greedy_is_identical(name):
    ids, mask = _batch(True)
    out = {}
    for impl in ("onlinesoftmax", "eager"):
        m = _model(name, impl)
        out[impl] = m.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, pad_token_id=0)
    torch.testing.assert_close(out["onlinesoftmax"], out["eager"])


@pytest.mark.parametrize("name", ["llama", "gemma2"])
@pytest.mark.parametrize("padded", [False, True])
def test_causal_lm_loss_and_gradients(name, padded):
    ids, mask = _batch(padded)
    # a left-padded row's first real token is predicted from a padding position, whose hidden state depends on
    # what each implementation does with a query row that attends nothing: that label is left out
    first = mask.argmax(-1)
    labels = ids.masked_fill(mask == 0, -100).scatter(-1, first[:, None], -100)
    ref = _model(name, "eager").train()
    mine = _model(name, "onlinesoftmax").train()
    want = ref(ids, attention_mask=mask, labels=labels).loss
    got = osst.causal_lm_loss(mine, ids, labels, attention_mask=mask)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    want.backward()
    got.backward()
    for (n, a), (_, b) in zip(mine.named_parameters(), ref.named_parameters()):
        if DEV == "cpu":
            torch.testing.assert_close(a.grad, b.grad, rtol=2e-3, atol=2e-5, msg=n)
        else:       # TF32 tensor cores in our fp32 attention and loss kernels: a bound on the whole gradient
            err = (a.grad - b.grad).norm() / b.grad.norm().clamp_min(1e-12)
            assert err < 1e-2, (n, err.item())


def test_causal_lm_loss_knobs(monkeypatch):
    """The loss runs with LOSS_KNOBS (the "tokens" scheme's 1 GiB tile) unless told otherwise; every choice gives
    the same loss."""
    ids, mask = _batch(False)
    m = _model("llama", "onlinesoftmax")
    seen = []
    inner = osst._linear_cross_entropy
    monkeypatch.setattr(osst, "_linear_cross_entropy", lambda *a, **kw: seen.append(kw["knobs"]) or inner(*a, **kw))
    with torch.no_grad():
        losses = [osst.causal_lm_loss(m, ids, ids, attention_mask=mask),
                  osst.causal_lm_loss(m, ids, ids, attention_mask=mask, knobs=None)]
    assert seen == [osst.LOSS_KNOBS, None] and osst.LOSS_KNOBS.scheme == "tokens"
    torch.testing.assert_close(losses[0], losses[1])


def test_dropout_in_training_is_refused():
    m = _model("llama", "onlinesoftmax").train()
    for layer in m.model.layers:
        layer.self_attn.attention_dropout = 0.1
    ids, mask = _batch(False)
    with pytest.raises(ValueError, match="dropout"):
        m(ids, attention_mask=mask)


def test_unexpressible_mask_falls_back_to_sdpa_with_a_warning():
    m = _model("llama", "onlinesoftmax")
    ids, _ = _batch(False)
    mask4 = torch.ones(3, 1, 13, 13, dtype=torch.bool, device=DEV)        # bidirectional: not causal
    mask4[:, :, :, 5] = False
    q = torch.randn(3, 4, 13, 16, device=DEV)
    k = torch.randn(3, 2, 13, 16, device=DEV)
    attn = m.model.layers[0].self_attn
    osst._warned.clear()
    with pytest.warns(UserWarning, match="SDPA instead"):
        o, _ = osst.attention_forward(attn, q, k, k, mask4, scaling=0.25)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), k.repeat_interleave(2, 1),
                                                           attn_mask=mask4, scale=0.25)
    torch.testing.assert_close(o, ref.transpose(1, 2))


def test_static_cache_prefill_and_decode_match_eager():
    """An empty static cache's prefill arrives with no mask (transformers' skip for SDPA's top-left is_causal) and
    keys past the prompt that are unwritten slots: they are left out, not attended bottom-right; the decode steps'
    masks (those slots unattended) run our kernels too, with no fallback."""
    cfg = _configs()["llama"]
    ids, mask = _batch(False)
    out = {}
    for impl in ("onlinesoftmax", "eager"):
        m = _model("llama", impl)
        with torch.no_grad():
            cache = transformers.StaticCache(config=cfg, max_cache_len=24)
            out[impl, "prefill"] = m(ids, past_key_values=cache, use_cache=True).logits
        osst._warned.clear()
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out[impl, "gen"] = m.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=8,
                                          cache_implementation="static", pad_token_id=0)
        assert not [x for x in w if "onlinesoftmax" in str(x.message)]
    torch.testing.assert_close(out["onlinesoftmax", "prefill"], out["eager", "prefill"], **TOL)
    torch.testing.assert_close(out["onlinesoftmax", "gen"], out["eager", "gen"])


@pytest.mark.parametrize("name", ["llama", "gemma2"])
@pytest.mark.parametrize("every_row", [False, True])
def test_right_padding_runs_our_kernels(name, every_row):
    """Right padding (training collators): each sequence's keys [0, len), run as varlen; the real positions'
    logits as eager's, no fallback (Gemma 2's softcap has none in SDPA). Padding in every row (a collator's
    pad_to_multiple_of) leaves the last keys unattended by any query: they stay, not cut as a static cache's
    unwritten slots."""
    ids, _ = _batch(False)
    mask = torch.ones_like(ids)
    mask[0, 9:] = 0
    mask[1, 12:] = 0
    if every_row:
        mask[2, 11:] = 0
    ours = _model(name, "onlinesoftmax")
    osst._warned.clear()
    with torch.no_grad():
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = ours(ids, attention_mask=mask).logits
        want = _model(name, "eager")(ids, attention_mask=mask).logits
    assert not [x for x in w if "onlinesoftmax" in str(x.message)]
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], **TOL)


def test_softcap_fallback_is_explicit_attention():
    """A mask the kernels do not express (a hole in the keys) on a softcapped layer: SDPA has no softcap, so the
    fallback is the explicit fp32 attention, with one warning; as eager."""
    ids, _ = _batch(False)
    mask = torch.ones_like(ids)
    mask[0, 4] = 0                                                         # a hole
    ours = _model("gemma2", "onlinesoftmax")
    osst._warned.clear()
    with torch.no_grad(), pytest.warns(UserWarning, match="explicit fp32 attention"):
        got = ours(ids, attention_mask=mask).logits
    want = _model("gemma2", "eager")(ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], **TOL)


def test_batch_broadcast_mask():
    """A [1, 1, Sq, Sk] boolean mask for a batch of 2 (SDPA broadcasts it): expanded, not an IndexError."""
    m = _model("llama", "onlinesoftmax")
    attn = m.model.layers[0].self_attn
    q = torch.randn(2, 4, 10, 16, device=DEV)
    k = torch.randn(2, 2, 10, 16, device=DEV)
    mask = torch.ones(10, 10, dtype=torch.bool, device=DEV).tril()
    mask[:, :3] = False                                                    # left padding, the same for both rows
    o, _ = osst.attention_forward(attn, q, k, k, mask[None, None], scaling=0.25)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), k.repeat_interleave(2, 1),
                                                           attn_mask=mask[None, None], scale=0.25).transpose(1, 2)
    torch.testing.assert_close(o[:, 3:], ref[:, 3:], **TOL)
    assert (o[:, :3] == 0).all()                                           # padded query rows: zeros


def test_attention_sinks_as_eager():
    """GPT-OSS passes per-head sinks (``s_aux``): merged into each row's normalizer, o · sigmoid(lse − s); logits
    and the sinks' gradients as eager's."""
    def cfg():          # one per model: from_config records the implementation in the config it is given
        return transformers.GptOssConfig(vocab_size=211, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                                         num_local_experts=4, num_experts_per_tok=2, sliding_window=5,
                                         max_position_embeddings=256, layer_types=["sliding_attention",
                                                                                  "full_attention"])
    ids, mask = _batch(True)
    models = {}
    for impl in ("onlinesoftmax", "eager"):
        torch.manual_seed(0)
        models[impl] = m = transformers.AutoModelForCausalLM.from_config(cfg(), attn_implementation=impl).to(DEV)
        assert m.config._attn_implementation == impl
        for layer in m.model.layers:
            torch.nn.init.normal_(layer.self_attn.sinks, std=1.0)
    got = models["onlinesoftmax"](ids, attention_mask=mask).logits
    want = models["eager"](ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], **TOL)
    got[keep].sum().backward()
    want[keep].sum().backward()
    for a, b in zip(models["onlinesoftmax"].model.layers, models["eager"].model.layers):
        ga, gb = a.self_attn.sinks.grad, b.self_attn.sinks.grad
        if DEV == "cpu":
            torch.testing.assert_close(ga, gb, rtol=2e-3, atol=2e-5)
        else:       # TF32 tensor cores in our fp32 attention kernels (H200: 2.5e-3 on one head's sink)
            assert (ga - gb).norm() / gb.norm().clamp_min(1e-12) < 1e-2, (ga, gb)


@pytest.mark.parametrize("family", ["cohere", "granite", "hyperclovax", "falcon_h1"])
def test_causal_lm_loss_logit_scaling(family):
    """Cohere multiplies the logits by logit_scale, Granite divides them by logits_scaling, HyperCLOVAX multiplies
    them by its logits_scaling, Falcon-H1 by lm_head_multiplier: the loss as the model's."""
    name = {"cohere": "CohereConfig", "granite": "GraniteConfig", "hyperclovax": "HyperCLOVAXConfig",
            "falcon_h1": "FalconH1Config"}[family]
    if not hasattr(transformers, name):
        pytest.skip(f"this transformers has no {name}")
    c = dict(vocab_size=211, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=12, max_position_embeddings=256)
    cfg = {"cohere": lambda: transformers.CohereConfig(**c, logit_scale=0.0625),
           "granite": lambda: transformers.GraniteConfig(**c, logits_scaling=8.0),
           "hyperclovax": lambda: transformers.HyperCLOVAXConfig(**c, logits_scaling=0.25),
           "falcon_h1": lambda: transformers.FalconH1Config(**c, lm_head_multiplier=0.25, mamba_d_ssm=48,
                                                            mamba_n_heads=4, mamba_d_head=12, mamba_d_state=8,
                                                            mamba_chunk_size=4)}[family]()
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="onlinesoftmax").to(DEV).eval()
    ids, mask = _batch(False)
    with torch.no_grad():
        want = m(ids, attention_mask=mask, labels=ids).loss
        got = osst.causal_lm_loss(m, ids, ids, attention_mask=mask)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_causal_lm_loss_recurrent_gemma_softcap():
    """RecurrentGemma caps its logits by config.logits_soft_cap (Gemma 2's final_logit_softcapping): the loss as the
    model's."""
    cfg = transformers.RecurrentGemmaConfig(num_hidden_layers=2, vocab_size=211, hidden_size=32, intermediate_size=64,
                                            num_attention_heads=2, num_key_value_heads=1, lru_width=32,
                                            attention_window_size=16, block_types=["recurrent", "attention"],
                                            conv1d_width=4, logits_soft_cap=3.0)
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(cfg).to(DEV).eval()
    ids, _ = _batch(False)
    with torch.no_grad():
        want = m(ids, labels=ids).loss
        got = osst.causal_lm_loss(m, ids, ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_causal_lm_loss_refuses_other_heads():
    """A BERT-style head (dense, activation, LayerNorm before the output layer) is not model.lm_head(hidden): a
    NotImplementedError naming the model, not a loss without the transform."""
    cfg = transformers.BertConfig(vocab_size=211, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, is_decoder=True)
    m = transformers.BertLMHeadModel(cfg).to(DEV).eval()
    ids, mask = _batch(False)
    with pytest.raises(NotImplementedError, match="causal_lm_loss: BertLMHeadModel"):
        osst.causal_lm_loss(m, ids, ids, attention_mask=mask)


@pytest.mark.parametrize("softcap", [None, 20.0])
def test_position_bias_falls_back(softcap):
    """An additive position bias (Inkling's relative positions, ``position_bias=``) is part of the scores: the layer
    falls back (SDPA adds it to its mask; with a softcap the explicit fp32 scores add it), with a warning; as eager."""
    m = _model("llama", "onlinesoftmax")
    attn = m.model.layers[0].self_attn
    q = torch.randn(2, 4, 10, 16, device=DEV)
    k = torch.randn(2, 2, 10, 16, device=DEV)
    bias = 3 * torch.randn(2, 4, 10, 10, device=DEV)
    osst._warned.clear()
    with pytest.warns(UserWarning, match="position bias"):
        o, _ = osst.attention_forward(attn, q, k, k, None, scaling=0.25, softcap=softcap, position_bias=bias)
    s = q @ k.repeat_interleave(2, 1).transpose(-1, -2) * 0.25
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s = (s + bias).masked_fill(~torch.ones(10, 10, dtype=torch.bool, device=DEV).tril(), float("-inf"))
    ref = (torch.softmax(s, -1) @ k.repeat_interleave(2, 1)).transpose(1, 2)
    torch.testing.assert_close(o, ref, **TOL)


def test_per_query_sinks_fall_back():
    """Sinks per head and query (``sinks`` [B, H, Sq, 1], Inkling 2's): the explicit fp32 attention takes them, with
    a warning."""
    attn = _model("llama", "onlinesoftmax").model.layers[0].self_attn
    q = torch.randn(2, 4, 10, 16, device=DEV)
    k = torch.randn(2, 2, 10, 16, device=DEV)
    sinks = torch.randn(2, 4, 10, 1, device=DEV)
    osst._warned.clear()
    with pytest.warns(UserWarning, match="explicit fp32 attention"):
        o, _ = osst.attention_forward(attn, q, k, k, None, scaling=0.25, sinks=sinks)
    s = (q @ k.repeat_interleave(2, 1).transpose(-1, -2) * 0.25).masked_fill(
        ~torch.ones(10, 10, dtype=torch.bool, device=DEV).tril(), float("-inf"))
    p = torch.softmax(torch.cat([s, sinks], -1), -1)[..., :-1]
    torch.testing.assert_close(o, (p @ k.repeat_interleave(2, 1)).transpose(1, 2), **TOL)


@pytest.mark.skipif(not hasattr(transformers, "Inkling2TextConfig"), reason="this transformers has no Inkling 2")
def test_inkling2_as_eager():
    """Inkling 2 computes its sinks from the hidden states, one score per head and query, and its layers pass a
    position bias: the explicit fp32 attention; logits as eager's."""
    def cfg():
        return transformers.Inkling2TextConfig(vocab_size=211, hidden_size=48, intermediate_size=64,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               head_dim=12, max_position_embeddings=256)
    ids, mask = _batch(True)
    logits = {}
    for impl in ("onlinesoftmax", "eager"):
        torch.manual_seed(0)
        m = transformers.AutoModelForCausalLM.from_config(cfg(), attn_implementation=impl).to(DEV).eval()
        with torch.no_grad():
            logits[impl] = m(ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(logits["onlinesoftmax"][keep], logits["eager"][keep], **TOL)
