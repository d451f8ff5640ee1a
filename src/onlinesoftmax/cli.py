"""The command line: onlinesoftmax info | bench [SUITE ...] [--quick] [--out DIR] | replot RESULTS.json ..."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

import torch

from .backend import interpret_mode, triton_available

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}


def info() -> None:
    import platform

    print(f"onlinesoftmax {__import__('onlinesoftmax').__version__}")
    print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    try:
        import triton
        print(f"triton {triton.__version__}")
    except ImportError:
        print("triton: not installed")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"cuda:{i} {p.name}, {p.multi_processor_count} SMs, {p.total_memory >> 30} GiB, "
                  f"L2 {p.L2_cache_size >> 20} MB, sm_{p.major}{p.minor}")
    else:
        print("device: no CUDA device; CPU only")
    cuda = torch.cuda.is_available()
    print("backends:")
    print("  torch  : usable (portable path, any device)")
    if triton_available() and cuda:
        print("  triton : usable (CUDA)")
    elif triton_available() and interpret_mode():
        print("  triton : usable on CPU tensors through the interpreter (TRITON_INTERPRET=1), slow")
    elif triton_available():
        print("  triton : installed, no CUDA device (set TRITON_INTERPRET=1 to run kernels on the CPU)")
    else:
        print("  triton : not installed")
    nvcc = shutil.which("nvcc")
    print(f"  ladder (CUDA C++): nvcc {'at ' + nvcc if nvcc else 'not found'}, "
          f"{'GPU present' if cuda else 'no GPU (compile only)'}")


class UserError(Exception):
    """A mistake in the command line: printed as one line, exit status 2, no traceback."""


def main(argv=None) -> int:
    try:
        return _main(argv)
    except UserError as e:
        print(f"onlinesoftmax: error: {e}", file=sys.stderr)
        return 2


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="onlinesoftmax",
        description="Softmax-shaped GPU kernels on the online (m, d) normalizer: device info, benchmarks, plots.")
    p.add_argument("--version", action="version", version=f"onlinesoftmax {__import__('onlinesoftmax').__version__}")
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("info", help="print the device, versions and usable backends")
    b = sub.add_parser("bench", help="run benchmark suites (all when none named)")
    b.add_argument("suites", nargs="*", help="suite names; --list shows them")
    b.add_argument("--quick", action="store_true", help="few small shapes, short timing")
    b.add_argument("--out", default=None, help="folder for JSON, markdown and PNG results")
    b.add_argument("--dtype", action="append", choices=sorted(_DTYPES), help="restrict dtypes (repeatable)")
    b.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    b.add_argument("--list", action="store_true", help="list the registered suites and exit")
    r = sub.add_parser("replot", help="draw the PNG of results JSON files again, beside each")
    r.add_argument("json", nargs="+", help="results JSON written by `onlinesoftmax bench --out`")
    args = p.parse_args(argv)
    if args.cmd is None:
        p.print_help()
        return 0
    if args.cmd == "info":
        info()
        return 0
    if args.cmd == "replot":
        from .bench import report, suites  # noqa: F401  (suites register their plot labels on import)

        for path in args.json:
            if not os.path.isfile(path):
                raise UserError(f"replot: no such file: {path}")
            try:
                out = report.replot(path)
            except ValueError as e:
                raise UserError(f"replot: {e}") from None
            print(f"wrote {out}" if out else f"{path}: no row with a rate to draw (no PNG)")
        return 0
    from .bench import runner
    from .bench.harness import SUITES

    if args.list:
        print("\n".join(sorted(SUITES)))
        return 0
    try:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as e:
        raise UserError(f"bench: --device {args.device!r} is not a device ({e})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("bench: --device cuda, but torch sees no CUDA device here (use --device cpu)")
    if device.type not in ("cuda", "cpu"):
        raise UserError(f"bench: --device must be cuda or cpu, got {args.device!r}")
    unknown = [n for n in args.suites if n not in SUITES]
    if unknown:
        raise UserError(f"bench: unknown suite(s) {', '.join(unknown)}; `onlinesoftmax bench --list` shows them")
    if args.out is not None and os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UserError(f"bench: --out {args.out} is a file, not a folder for the results")
    dtypes = tuple(_DTYPES[d] for d in args.dtype) if args.dtype else None
    runner.run(args.suites, device=device, quick=args.quick, out_dir=args.out, dtypes=dtypes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
