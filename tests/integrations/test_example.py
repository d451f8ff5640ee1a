"""examples/transformers_llama.py runs (a smoke run of its tiny config on this machine's device) and reports what
it measures: every row for both attention implementations, greedy tokens identical to sdpa's."""

import importlib.util
import os

import pytest
import torch

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_transformers_example_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("transformers_llama",
                                                  os.path.join(ROOT, "examples", "transformers_llama.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out = tmp_path / "rows.json"
    rows = mod.main(["--small", "--device", dev, "--layers", "2", "--batch", "2", "--seq", "48", "--decode-batch", "2",
                     "--prompt", "12", "--new-tokens", "6", "--reps", "1", "--breakdown", "--json", str(out)])
    assert {(r["case"].split()[0], r["impl"]) for r in rows} == {(c, i) for c in ("prefill", "training", "greedy")
                                                                 for i in ("sdpa", "onlinesoftmax")}
    assert all(r["seconds"] > 0 for r in rows)
    assert all(r["greedy tokens identical"] for r in rows if r["case"].startswith("greedy"))
    assert out.exists()
    kinds = [r["gpu ms by kind"] for r in rows if r["case"].startswith("training")]
    assert len(kinds) == 2 and all(set(k) == {"attention", "loss", "matmul", "other"} for k in kinds)
    assert all(k["matmul"] > 0 for k in kinds)
