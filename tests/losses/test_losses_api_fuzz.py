"""``cross_entropy`` / ``linear_cross_entropy`` and ``losses.explain`` as a demanding user calls them: scalars as
torch takes them (NumPy numbers, 0-d tensors), a meta tensor where a number is meant, explain's own arguments, meta
inputs on either backend; results against the fp64 references. Also ``sample``'s per-row tensors on the meta
device."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import onlinesoftmax as oss
from onlinesoftmax.losses import explain
from onlinesoftmax.reference import losses as ref

BACKENDS = [pytest.param("torch"), pytest.param("triton", marks=pytest.mark.interpreter)]
TOL = dict(rtol=1e-5, atol=1e-6)


def _case():
    h, w, b = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6)
    return h, w, b, torch.tensor([0, 5, 3, 2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalars_as_torch_takes_them(backend):
    """F.cross_entropy takes a NumPy integer or a 0-d tensor as ignore_index and a NumPy float as label_smoothing;
    these raised TypeError (label_smoothing, z_loss and softcap took a 0-d tensor but not a NumPy float)."""
    h, w, b, t = _case()
    x = h @ w.T + b
    kw = dict(ignore_index=3, label_smoothing=0.1, z_loss=0.01, softcap=5.0)
    want_ce, want_lce = ref.cross_entropy(x, t, **kw), ref.linear_cross_entropy(h, w, t, b, **kw)
    for ii, ls, z, c in ((np.int64(3), np.float32(0.1), np.float64(0.01), np.int32(5)),
                         (torch.tensor(3), torch.tensor(0.1), torch.tensor(0.01), torch.tensor(5.0))):
        args = dict(ignore_index=ii, label_smoothing=ls, z_loss=z, softcap=c, backend=backend)
        torch.testing.assert_close(oss.cross_entropy(x, t, **args).double(), want_ce, **TOL)
        torch.testing.assert_close(oss.linear_cross_entropy(h, w, t, bias=b, **args).double(), want_lce, **TOL)
    for bad in (3.0, True, None, torch.tensor([3]), "3"):
        with pytest.raises(TypeError, match="^cross_entropy: ignore_index must be an int"):
            oss.cross_entropy(x, t, ignore_index=bad, backend=backend)
    with pytest.raises(TypeError, match="^linear_cross_entropy: label_smoothing must be a float, got numpy.bool"):
        oss.linear_cross_entropy(h, w, t, label_smoothing=np.True_, backend=backend)
    with pytest.raises(TypeError, match="label_smoothing"):        # a one-value 1-d tensor: torch refuses it
        F.cross_entropy(x, t, label_smoothing=torch.tensor([0.1]))
    for arg in ("label_smoothing", "z_loss", "softcap"):
        with pytest.raises(TypeError, match=f"^cross_entropy: {arg} must be a float, got torch.Tensor"):
            oss.cross_entropy(x, t, **{arg: torch.tensor([0.1])}, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_meta_number_is_an_error_naming_the_function(backend):
    """A meta 0-d tensor as label_smoothing (or z_loss, softcap) raised torch's "Tensor.item() cannot be called on
    meta tensors", naming neither the function nor the argument."""
    h, w, _, t = _case()
    meta = torch.tensor(0.1, device="meta")
    for arg in ("label_smoothing", "z_loss", "softcap"):
        with pytest.raises(TypeError, match=f"^cross_entropy: {arg} must be a float, got a tensor on the meta"):
            oss.cross_entropy(h, t, **{arg: meta}, backend=backend)
        with pytest.raises(TypeError, match=f"^linear_cross_entropy: {arg} must be a float, got a tensor on the"):
            oss.linear_cross_entropy(h, w, t, **{arg: meta}, backend=backend)


def test_explain_checks_its_own_arguments():
    """``target_gpu="H200"`` raised an AttributeError from deep inside the planner; ``need_grad="no"`` planned a
    gradient. Both are TypeErrors naming the argument now."""
    h, w, _, t = _case()
    for fn, args in ((oss.cross_entropy, (h, t)), (oss.linear_cross_entropy, (h, w, t))):
        with pytest.raises(TypeError, match="^explain: target_gpu must be a Target or None, got str"):
            explain(fn, *args, target_gpu="H200")
        for bad in ("no", 1, np.False_):
            with pytest.raises(TypeError, match="^explain: need_grad must be a bool"):
                explain(fn, *args, need_grad=bad)
        explain(fn, *args, need_grad=False, ignore_index=np.int64(0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_meta_inputs_give_the_fakes_shapes(backend):
    """backend="triton" on meta tensors (the interpreter) tried to copy their data out: now the op's fake."""
    x, t = torch.empty(4, 6, device="meta"), torch.zeros(4, dtype=torch.int64, device="meta")
    assert oss.cross_entropy(x, t, reduction="none", backend=backend).shape == (4,)
    loss = oss.linear_cross_entropy(torch.empty(4, 8, device="meta"), torch.empty(6, 8, device="meta"), t,
                                    backend=backend)
    assert loss.shape == () and loss.device.type == "meta"


def test_sample_parameter_tensor_on_meta():
    """A per-row parameter (or uniform) tensor on the meta device beside CPU logits raised torch's "Cannot copy out
    of meta tensor", naming neither sample nor the argument."""
    x = torch.randn(3, 5)
    for name, v in (("temperature", torch.ones(3)), ("top_k", torch.ones(3, dtype=torch.int64)),
                    ("top_p", torch.full((3,), 0.5)), ("min_p", torch.full((3,), 0.1)),
                    ("uniform", torch.full((3,), 0.5))):
        with pytest.raises(ValueError, match=f"^sample: {name} is a tensor on the meta device"):
            oss.sample(x, **{name: v.to("meta")})
