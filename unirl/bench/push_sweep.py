"""Weight pushes to a rollout engine in its own process, against this machine's memory copy.

    python -m unirl.bench.push_sweep [--sizes-mb 1,16,128,1024] [--dtypes float32,bfloat16]
        [--rollout vllm] [--pushes 3] [--json OUT] [--md OUT] [--plot OUT.png]

For each dtype and size: a Qwen2 of about that many bytes (random weights, unirl's byte tokenizer),
the engine built as a run builds it, then ``--pushes`` pushes of changed weights (each a real
update: every tensor moved), each timed end to end and in its parts (the copy into the shared
file, the worker's mapping, its check that the weights differ, vLLM's in-place reload, the
re-pack and cache reset, the probe that proves the push took). The reference is a memory copy
of the same bytes in this process in the same run: ``dst.copy_(src)`` of one buffer, torch's
threads (the fastest copy the machine does) and a single-threaded one. Fitted over the sizes,
push seconds = fixed + bytes / bandwidth: the fixed cost is what a push costs whatever its size
(messages, the probe, the cache reset), and the per-byte part is set against memcpy's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

BYTES_PER_MB = 2**20


def model_shape(target_bytes: int, itemsize: int) -> dict[str, int]:
    """A Qwen2 shape of about ``target_bytes`` of weights: the width grows with the size, then layers fill it."""
    for hidden in (1024, 512, 256, 128, 64):
        inter = 2 * hidden + hidden // 2
        per_layer = (3 * hidden * hidden + 3 * hidden * inter) * itemsize  # q, o; k, v at half width; the MLP
        if per_layer * 4 <= target_bytes or hidden == 64:
            layers = max(1, round((target_bytes - 260 * hidden * itemsize) / per_layer))
            return {"hidden_size": hidden, "intermediate_size": inter, "num_layers": layers,
                    "num_heads": max(2, hidden // 64), "num_kv_heads": max(1, hidden // 128)}
    raise AssertionError("unreachable")


def memcpy_seconds(nbytes: int, repeat: int = 5, device: str = "cpu") -> dict[str, float]:
    """The best of ``repeat`` copies of ``nbytes`` between two buffers already touched: with torch's
    intra-op threads, and on one thread (on a CUDA device both are the device's own copy)."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {}
    for name, threads in (("memcpy_s", torch.get_num_threads()), ("memcpy_1thread_s", 1)):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            best = float("inf")
            for _ in range(repeat):
                sync()
                t0 = time.perf_counter()
                dst.copy_(src)
                sync()
                best = min(best, time.perf_counter() - t0)
        finally:
            torch.set_num_threads(before)
        out[name] = best
    return out


def measure_size(rollout: str, size_mb: float, dtype: str, pushes: int, workdir: Path,
                 options: dict[str, Any] | None = None) -> dict[str, Any]:
    from unirl.models.tiny import build_tiny_model
    from unirl.testing.rollout_level import RolloutKit

    itemsize = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    shape = model_shape(int(size_mb * BYTES_PER_MB), itemsize)
    model_dir = build_tiny_model(workdir / f"model-{dtype}-{size_mb:g}mb", seed=0, max_position_embeddings=128,
                                 **shape)
    from transformers import AutoModelForCausalLM

    device = "cuda" if (options or {}).get("weight_transport") == "cuda_ipc" else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)
    weights = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    kit = RolloutKit(rollout, options, model=model_dir, dtype=dtype, workdir=workdir / f"kit-{dtype}-{size_mb:g}mb")
    try:
        t0 = time.perf_counter()
        engine = kit.engine
        started = time.perf_counter() - t0
        rows = []
        for i in range(pushes + 1):  # the first push makes the shared file: reported apart
            with torch.no_grad():
                for t in weights.values():
                    t.mul_(1.0 + 1e-3 * (1 if i % 2 else -1))  # every tensor changes, as an update's do
            engine.load_weights(weights)
            rows.append(dict(engine.last_push))
    finally:
        kit.close()
    steady = rows[1:]
    med = {k: statistics.median(r[k] for r in steady) for k in steady[0] if k.endswith("_s")}
    return {"dtype": dtype, "size_mb": size_mb, "bytes": nbytes, "shape": shape, "engine_start_s": started,
            "first_push_s": rows[0]["total_s"], "pushes": steady, "median": med, "memcpy_device": device,
            **memcpy_seconds(nbytes, device=device)}


def fit(points: list[dict[str, Any]]) -> dict[str, float]:
    """Least squares of push seconds = fixed + bytes * per_byte over the sizes of one dtype."""
    xs = [p["bytes"] for p in points]
    ys = [p["median"]["total_s"] for p in points]
    n, mx, my = len(xs), statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    per_byte = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if n > 1 and sxx else 0.0
    out = {"fixed_ms": 1000 * (my - per_byte * mx), "ms_per_gb": 1000 * per_byte * 2**30}
    if n > 1 and sxx:  # how the push grows with the bytes: over every size, and between the two largest
        from unirl.bench.fit import growth_exponent

        top = sorted(zip(xs, ys))[-2:]
        out["exponent"], out["exponent_r2"] = growth_exponent(xs, ys)
        out["exponent_largest"] = growth_exponent([x for x, _ in top], [y for _, y in top])[0]
    return out


def own_part(median: dict[str, float]) -> float:
    """unirl's seconds of a push: all but vLLM's reload, its re-pack and cache reset, and the probe's forward."""
    return median["total_s"] - median["reload_s"] - median["repack_reset_s"] - median["probe_s"]


def markdown(result: dict[str, Any]) -> str:
    lines = ["| dtype | size | tensors' bytes | push ms | copy ms | map ms | check ms | reload ms | repack+reset ms "
             "| probe ms | unirl's part ms | memcpy ms | memcpy 1-thread ms | push / memcpy | unirl's part / memcpy "
             "| first push ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in result["points"]:
        m = p["median"]
        lines.append(f"| {p['dtype']} | {p['size_mb']:g} MiB | {p['bytes'] / BYTES_PER_MB:.1f} MiB | "
                     f"{1000 * m['total_s']:.1f} | {1000 * m['copy_s']:.1f} | {1000 * m['map_s']:.1f} | "
                     f"{1000 * m['check_s']:.1f} | {1000 * m['reload_s']:.1f} | {1000 * m['repack_reset_s']:.1f} | "
                     f"{1000 * m['probe_s']:.1f} | {1000 * own_part(m):.1f} | {1000 * p['memcpy_s']:.1f} | "
                     f"{1000 * p['memcpy_1thread_s']:.1f} | {m['total_s'] / p['memcpy_s']:.2f}x | "
                     f"{own_part(m) / p['memcpy_s']:.2f}x | {1000 * p['first_push_s']:.0f} |")
    lines.append("")
    for dtype, f in result["fit"].items():
        growth = (f"; growth exponent {f['exponent']:.2f} over the sizes (r2 {f['exponent_r2']:.2f}), "
                  f"{f['exponent_largest']:.2f} between the two largest" if "exponent" in f else "")
        lines.append(f"- {dtype}: push = {f['fixed_ms']:.1f} ms + {f['ms_per_gb']:.0f} ms/GiB "
                     f"(memcpy here: {f['memcpy_ms_per_gb']:.0f} ms/GiB; per byte {f['per_byte_vs_memcpy']:.2f}x)"
                     + growth)
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for dtype in result["fit"]:
        pts = [p for p in result["points"] if p["dtype"] == dtype]
        mb = [p["bytes"] / BYTES_PER_MB for p in pts]
        ax.plot(mb, [1000 * p["median"]["total_s"] for p in pts], "o-", label=f"push, {dtype}")
        ax.plot(mb, [1000 * p["median"]["reload_s"] for p in pts], "x:", label=f"vLLM reload part, {dtype}")
        ax.plot(mb, [1000 * own_part(p["median"]) for p in pts], "^-.", label=f"unirl's part, {dtype}")
        ax.plot(mb, [1000 * p["memcpy_s"] for p in pts], "s--", label=f"memcpy of the same bytes ({dtype} sizes)")
    transport = result.get("options", {}).get("weight_transport", "shared-memory file")
    ax.set(xscale="log", yscale="log", xlabel="pushed MiB", ylabel="ms (median)",
           title=f"Weight push to {result['rollout']} ({transport}) against memcpy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unirl.bench.push_sweep")
    parser.add_argument("--rollout", default="vllm")
    parser.add_argument("--sizes-mb", default="1,16,128,1024")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--pushes", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a rollout option, e.g. --set weight_transport=cuda_ipc (scripts/gpu/push.sh)")
    parser.add_argument("--json")
    parser.add_argument("--md")
    parser.add_argument("--plot")
    parser.add_argument("--workdir")
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes_mb.split(",") if s.strip()]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in ("float32", "bfloat16", "float16")]
    if bad or not sizes or min(sizes) <= 0 or args.pushes < 1:
        print(f"push_sweep: --dtypes takes float32, bfloat16, float16 (got {bad}); --sizes-mb positive sizes; "
              f"--pushes >= 1", file=sys.stderr)
        return 2
    options = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"push_sweep: --set {item!r} is not KEY=VALUE (a rollout option)", file=sys.stderr)
            return 2
        options[key.removeprefix("rollout.")] = value
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="unirl-push-sweep-"))
    points = []
    for dtype in dtypes:
        for size in sizes:
            print(f"{dtype} {size:g} MiB: building the model and the engine ...", file=sys.stderr, flush=True)
            point = measure_size(args.rollout, size, dtype, args.pushes, workdir, options)
            print(f"  push {1000 * point['median']['total_s']:.1f} ms (reload {1000 * point['median']['reload_s']:.1f})"
                  f", memcpy {1000 * point['memcpy_s']:.1f} ms", file=sys.stderr, flush=True)
            points.append(point)
    result: dict[str, Any] = {"rollout": args.rollout, "options": options, "threads": torch.get_num_threads(),
                              "points": points, "fit": {}}
    for dtype in dtypes:
        pts = [p for p in points if p["dtype"] == dtype]
        f = fit(pts)
        big = max(pts, key=lambda p: p["bytes"])
        f["memcpy_ms_per_gb"] = 1000 * big["memcpy_s"] / big["bytes"] * 2**30
        f["per_byte_vs_memcpy"] = f["ms_per_gb"] / f["memcpy_ms_per_gb"]
        result["fit"][dtype] = f
    text = markdown(result)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.md:
        Path(args.md).write_text(text)
    if args.plot:
        plot(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
