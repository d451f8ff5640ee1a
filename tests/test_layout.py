"""The package's layout promises: every module imports on its own, no import cycle anywhere (function-level imports
included), the shared Triton machinery imports nothing from the families, and plans are keyed by the Target."""

import ast
import pathlib
import subprocess
import sys

import pytest
import torch

import onlinesoftmax
from onlinesoftmax.softmax import explain
from onlinesoftmax.target import A100, H200, INTERPRETER, L4, Target, target_of
from onlinesoftmax.topk import explain as topk_explain

PKG = pathlib.Path(onlinesoftmax.__file__).parent
FAMILIES = ("softmax", "topk", "losses", "attention", "decode", "distributed")


def _modules():
    """Every module of the package: dotted name -> path."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: pathlib.Path, modules: dict) -> set:
    """The package modules ``name`` imports anywhere in its file (module level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[:len(up) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:           # `from pkg import name` where name is not a module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # importing a submodule runs its packages' __init__ first: not an edge of the file's own
    return modules, graph


def test_no_import_cycles():
    modules, graph = _graph()

    def parents(n):
        p = n.split(".")
        return {".".join(p[:i]) for i in range(1, len(p))}

    # a package __init__ re-exporting its own submodules is not a cycle: drop edges from a module to a package above
    # it (Python loads that package before the module anyway)
    edges = {n: {t for t in ts if t not in parents(n)} for n, ts in graph.items()}
    state, stack, cycles = {}, [], []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for t in sorted(edges[n]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_shared_machinery_imports_no_family():
    _, graph = _graph()
    for name, deps in graph.items():
        if name.startswith("onlinesoftmax._triton") or name in ("onlinesoftmax.target", "onlinesoftmax.state",
                                                                 "onlinesoftmax.backend"):
            bad = {d for d in deps if d.split(".")[1:2] and d.split(".")[1] in FAMILIES}
            assert not bad, (name, bad)
    for fam in FAMILIES:                # families do not import each other's internals (only public APIs)
        for name, deps in graph.items():
            if name.startswith(f"onlinesoftmax.{fam}"):
                other = {d for d in deps if d.split(".")[1:2] and d.split(".")[1] in FAMILIES
                         and d.split(".")[1] != fam and not d.endswith(".api")}
                assert not other, (name, other)


def test_every_module_imports_on_its_own():
    """Each module in a fresh interpreter (the shared-memory Gluon kernels included: they compile lazily)."""
    names = [n for n in _modules() if not n.startswith("onlinesoftmax.__main__")]
    code = ("import importlib, sys\n"
            "for name in sys.argv[1:]:\n"
            "    for m in [m for m in sys.modules if m.startswith('onlinesoftmax')]:\n"
            "        del sys.modules[m]\n"
            "    importlib.import_module(name)\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


# ---- the Target --------------------------------------------------------------------------------------------------
def test_hand_built_targets():
    assert H200.sm90 and H200.bf16_pack and H200.sm_count == 132
    assert not A100.sm90 and A100.bf16_pack and not L4.sm90 and L4.bf16_pack
    assert not INTERPRETER.sm90 and not INTERPRETER.bf16_pack and INTERPRETER.interpret
    assert target_of(torch.device("cpu")) == INTERPRETER
    assert Target(75, 40, 65536, 4 << 20).bf16_pack is False            # a T4: no cvt.rn.bf16x2.f32


def _meta(m, n, dtype):
    return torch.empty(m, n, dtype=dtype, device="meta")


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1024, 4096, 16384, 32768, 131072, 262144])
def test_plans_keyed_by_arch(op, dtype, n):
    """The H200's tables (shared-memory and Gluon kernels) apply to sm_90 only: sm_80 and sm_89 get the register
    kernels at the same sizes, and rows that need more chunks than surely fit at once take ``split``."""
    x = _meta((1 << 30) // (n * dtype.itemsize), n, dtype)
    for target in (A100, L4):
        for grad in (False, True) if op != "logsumexp" else (False,):
            plan = explain(x, op=op, target=target, grad=grad)
            assert plan.kernel in ("rows", "chunks", "bf16x2"), (target, plan)
            assert plan.path in ("rows", "coop", "split", "chunks")
            assert plan.chunks <= target.sm_count or plan.path in ("split", "chunks"), plan
    assert explain(x, op=op, target=INTERPRETER).path in ("rows", "split", "chunks")


@pytest.mark.parametrize("op,dtype,n,kernel", [
    ("softmax", torch.bfloat16, 4096, "smem"), ("softmax", torch.float32, 131072, "smem"),
    ("log_softmax", torch.bfloat16, 262144, "smem"), ("logsumexp", torch.bfloat16, 131072, "stream"),
    ("logsumexp", torch.float32, 4096, "pipe"), ("logsumexp", torch.float32, 131072, "chunks"),
    ("softmax", torch.float32, 4096, "rows")])
def test_h200_tables(op, dtype, n, kernel):
    """The same problems on the H200: its tables pick the shared-memory and Gluon kernels where they measured
    faster; on sm_80 / sm_89 none of them."""
    x = _meta((1 << 30) // (n * dtype.itemsize), n, dtype)
    assert explain(x, op=op, target=H200).kernel == kernel
    assert explain(x, op=op, target=A100).kernel not in ("smem", "pipe", "stream")


def test_l4_long_rows_split_where_chunks_cannot_all_be_resident():
    x = _meta(4096, 262144 * 2, torch.float32)                          # 64 chunks of 8192 > 58 SMs
    assert explain(x, target=L4).path == "split"
    assert explain(x, target=A100).path == "coop"                       # 108 SMs hold 64
    assert explain(x, target=H200).kernel == "smem"


def test_topk_plan_portable():
    x = _meta(256, 128256, torch.float32)
    assert topk_explain(x, 50, target=H200) == topk_explain(x, 50, target=A100)
    assert topk_explain(x, 50, target=INTERPRETER).fast is False
