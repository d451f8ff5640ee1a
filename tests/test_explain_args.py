"""Every ``explain`` checks its arguments as the call it explains does, and names itself: a bad target or knobs is
a TypeError (not an AttributeError from inside a plan), an invalid k or top_k is refused on every plan (the
torch plan was returned for any), and the plan is the one the call runs (a NumPy top_k)."""

import numpy as np
import pytest
import torch

from onlinesoftmax.attention import explain as explain_attention
from onlinesoftmax.decode.api import explain as explain_kvcache
from onlinesoftmax.decode.api import explain_merge
from onlinesoftmax.softmax import explain as explain_softmax
from onlinesoftmax.target import H200
from onlinesoftmax.topk import explain as explain_topk
from onlinesoftmax.topk import explain_sample

X = torch.randn(4, 64)


def test_softmax_explain():
    for op in ([], ("softmax",), None, "sm"):
        with pytest.raises(ValueError, match="explain: op must be one of"):
            explain_softmax(X, op=op)
    with pytest.raises(TypeError, match=r"explain\(softmax\): target must be a Target or None, got str"):
        explain_softmax(X, target="H200")
    with pytest.raises(TypeError, match=r"explain\(log_softmax\): knobs must be a Knobs or None, got dict"):
        explain_softmax(X, op="log_softmax", target=H200, knobs={"path": "coop"})
    assert explain_softmax(X, np.int64(0), target=H200) == explain_softmax(X, 0, target=H200)


@pytest.mark.parametrize("backend", [None, "torch"])
def test_topk_explain_checks_k_and_dim_on_every_plan(backend):
    """The torch plan (a CPU tensor) was returned for k = 0, k > V and dims out of range, which the call refuses."""
    for k, err in ((0, ValueError), (65, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(err, match=r"explain\(softmax_topk\): k"):
            explain_topk(X, k, backend=backend)
    for dim, err in ((2, IndexError), (-3, IndexError), (1.0, TypeError)):
        with pytest.raises(err, match=r"explain\(softmax_topk\): dim"):
            explain_topk(X, 5, dim, backend=backend)
    with pytest.raises(TypeError, match=r"explain\(softmax_topk\): target must be a Target"):
        explain_topk(X, 5, target="H200")
    assert explain_topk(X, 5, backend=backend).path == "torch"


def test_explain_sample_checks_what_sample_checks():
    """temperature, top_k, knobs and target are checked as sample checks them (anything was planned), and a NumPy
    top_k plans the K sample runs with (it planned the 64 candidates of a per-row top_k)."""
    assert explain_sample(X, top_k=np.int64(5), target=H200) == explain_sample(X, top_k=5, target=H200)
    assert explain_sample(X, top_k=5, target=H200).k == 5
    for kw, err, what in (({"temperature": -1.0}, ValueError, "temperature"), ({"temperature": "1"}, TypeError,
                          "temperature"), ({"top_k": 0}, ValueError, "top_k"), ({"top_k": 2.0}, TypeError, "top_k"),
                          ({"top_k": True}, TypeError, "top_k"), ({"knobs": 3}, TypeError, "knobs"),
                          ({"target": "H200"}, TypeError, "target")):
        for target in (None, H200):
            with pytest.raises(err, match=f"explain_sample: {what}"):
                explain_sample(X, **{"target": target, **kw})


def test_decode_and_attention_explains():
    q = torch.randn(2, 2, 1, 16)
    cache = torch.randn(2, 2, 16, 16)
    lens = torch.tensor([3, 5], dtype=torch.int32)
    assert explain_kvcache(q, cache, cache, lens, target=H200).path == "split_kv"
    with pytest.raises(TypeError, match=r"explain\(attention_with_kvcache\): target must be a Target"):
        explain_kvcache(q, cache, cache, lens, target="H200")
    with pytest.raises(TypeError, match=r"explain\(attention_with_kvcache\): knobs must be a Knobs"):
        explain_kvcache(q, cache, cache, lens, target=H200, knobs=3)
    with pytest.raises(TypeError, match=r"explain\(merge_attention_states\): o_a must be a torch.Tensor"):
        explain_merge([1.0])
    with pytest.raises(TypeError, match=r"explain\(merge_attention_states\): o_a must have dtype"):
        explain_merge(torch.ones(2, 3, 16, dtype=torch.int32), target=H200)
    with pytest.raises(ValueError, match=r"explain\(merge_attention_states\): o_a must have shape \[..., D\]"):
        explain_merge(torch.tensor(1.0), target=H200)
    with pytest.raises(TypeError, match=r"explain\(merge_attention_states\): target must be a Target"):
        explain_merge(torch.randn(2, 3, 16), target="H200")
    k = torch.randn(1, 2, 8, 16)
    for backend in (None, "torch"):
        with pytest.raises(TypeError, match="onlinesoftmax.explain: knobs must be a Knobs"):
            explain_attention(torch.randn(1, 2, 4, 16), k, k, knobs=3, backend=backend)
