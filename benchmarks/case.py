"""One benchmark case, run in a fresh process so its peak memory is its own:
``python -m benchmarks.case '<json spec>'`` (from the repository root) prints one JSON line with the result.

Peak memory is the sum, over this process and all its descendants (the Dask workers included), of
each one's high-water RSS (Linux ``VmHWM``: exact, not sampled; read every 50 ms so that workers
that exit are counted), plus the GPU's peak allocation where there is one. Sampling RSS itself
missed short peaks (a layer's attention scores live for ~0.1 s) and varied by +-100 MB between
identical runs. Where ``VmHWM`` is not available the sampled RSS is used.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

#: The checkout's quickstart job: every pipeline case starts from it, with its settings overridden.
QUICKSTART = Path(__file__).resolve().parent.parent / "jobs" / "quickstart.yaml"


def _hwm(pid: int) -> int | None:
    """The high-water RSS of a process in bytes (Linux), or None."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_hwm() -> bool:
    """Reset this process's high-water RSS to its current RSS (Linux >= 4.0); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class PeakRSS:
    """Peak memory of this process tree, in bytes (``peak``), watched from a background thread.

    ``peak`` sums each process's high-water RSS; ``sample()`` returns the current summed RSS."""

    def __init__(self, interval: float = 0.05):
        import psutil

        self.proc = psutil.Process()
        self.interval = interval
        self.sampled_peak = 0
        self.hwm: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def peak(self) -> int:
        return sum(self.hwm.values()) if self.hwm else self.sampled_peak

    def sample(self) -> int:
        import psutil

        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # a worker that just exited
                total += p.memory_info().rss
                h = _hwm(p.pid)
                if h is not None:
                    self.hwm[p.pid] = max(self.hwm.get(p.pid, 0), h)
        self.sampled_peak = max(self.sampled_peak, total)
        return total

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()
        return False


def _gpu_peak() -> int | None:
    import torch

    return int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else None


def _job(spec: dict, run_dir: Path):
    from rapids_attn.jobfile import load_job

    sets = [
        f"data.path={spec['data']}",
        "data.format=squad",
        f"data.sample={spec['examples']}",
        "data.seed=0",
        f"output.dir={run_dir}",
        f"embed.name={spec.get('embed', 'pattern-cnn')}",
        "runtime.learn_backend=auto",
        f"extract.device={spec.get('device', 'auto')}",
        "explain.report=false",
        "explain.head_views=0",
        "relevance.enabled=false",  # the quickstart's relevance stage is not part of what the pipeline cases time
        f"extract.shard_size={spec.get('shard_size', 64)}",
        f"store.compression_level={spec.get('level', 3)}",
    ]
    if spec.get("embed", "pooled") != "pooled" and spec.get("embed") != "pattern-cnn":
        sets += [
            "embed.weights=random",
            f"embed.input_size={spec.get('input_size', 64)}",
            f"embed.precision={spec.get('precision', 'auto')}",
        ]
    workers = spec.get("workers", 0)
    if workers == 0:  # in-process: one worker thread in this process, torch on every core
        sets += ["runtime.processes=false", "runtime.n_workers=1", f"runtime.threads_per_worker={os.cpu_count()}"]
    else:
        sets += [f"runtime.n_workers={workers}", f"runtime.threads_per_worker={max(1, os.cpu_count() // workers)}"]
    return load_job(QUICKSTART, sets)


def case_pipeline(spec: dict) -> dict:
    """The whole job; phase throughput from the workers' own clocks (model loading excluded)."""
    import torch

    from rapids_attn.pipeline import run_job

    run_dir = Path(spec.get("run_dir") or tempfile.mkdtemp(prefix="bench-"))
    cfg = _job(spec, run_dir)
    torch.set_num_threads(os.cpu_count())
    t0 = time.perf_counter()
    with PeakRSS() as mem:
        s = run_job(cfg, overwrite=True)
    wall = time.perf_counter() - t0
    store = run_dir / "store.zarr"
    size = {p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) for p in store.iterdir() if p.is_dir()}
    run = s["extract"]["runs"][-1]
    return {
        "wall": wall,
        "seconds": s["seconds"],
        "worker_seconds": run["worker_seconds"],
        "learn_seconds": s["clusters"]["learn_seconds"],
        "examples": s["counts"]["examples"],
        "maps": s["counts"]["maps"],
        "tokens": s["counts"]["tokens"],
        "store_bytes": size,
        "peak_rss": mem.peak,
        "gpu_peak": _gpu_peak(),
        "devices": s["backend"]["extract_devices"],
        "learn_backend": s["backend"]["learn"],
        "run_dir": str(run_dir),
    }


def _setup(spec: dict):
    """Model, tokenizer, examples and the pipeline's own batches, for the single-process cases."""
    import torch

    from rapids_attn.data import read_examples
    from rapids_attn.extract.batching import length_batches, tokenize
    from rapids_attn.extract.model import describe_model, load_model, load_tokenizer
    from rapids_attn.job import ModelConfig

    torch.set_num_threads(os.cpu_count())
    mcfg = ModelConfig(name=spec.get("model", "minilm-l6"))
    device = "cuda" if spec.get("device") == "cuda" else "cpu"
    examples = read_examples(spec["data"], format="squad", sample=spec["examples"], seed=0)
    info = describe_model(mcfg)
    tok = load_tokenizer(mcfg)
    # the capture modes compared here are the eager ones (hooks, output_attentions)
    model = load_model(mcfg, device, "float16" if device == "cuda" else "float32", attention="eager")
    t = tokenize(tok, examples, info.max_length)
    from rapids_attn.job import ExtractConfig

    e = ExtractConfig()  # the pipeline's default batching, so "same batches" holds
    batches = length_batches(t.lengths, e.token_budget, e.max_batch_size, e.attention_budget)
    return model, tok, examples, info, t, batches, device


def case_bare(spec: dict) -> dict:
    """The bare forward: same batches, attention outputs on, nothing captured or embedded."""
    import torch

    model, tok, examples, info, t, batches, device = _setup(spec)
    # no warm-up batch: the pipeline's worker clocks include its first (cold) batch too
    t0 = time.perf_counter()
    with torch.inference_mode(), PeakRSS() as mem:
        for idx in batches:
            enc = tok.pad(t.batch(idx), return_tensors="pt").to(device)
            model(**enc, output_attentions=True)
        if device == "cuda":
            torch.cuda.synchronize()
    sec = time.perf_counter() - t0
    return {
        "seconds": sec,
        "examples": len(examples),
        "maps": len(examples) * info.n_layers * info.n_heads,
        "peak_rss": mem.peak,
        "gpu_peak": _gpu_peak(),
    }


def case_naive(spec: dict) -> dict:
    from benchmarks.naive import run_naive
    from rapids_attn.embed.backbone import _build_network, _strip_head

    model, tok, examples, info, _, _, device = _setup(spec)
    net, dim = _strip_head(_build_network(spec.get("backbone", "resnet18"), "random"))
    net = net.eval().to(device)
    out = Path(tempfile.mkdtemp(prefix="bench-naive-")) / "features.csv"
    with PeakRSS() as mem:
        r = run_naive(model, tok, examples, info.max_length, net, spec.get("input_size", 224), out, device)
    out.unlink()
    return {**r, "examples": len(examples), "peak_rss": mem.peak, "dim": dim, "gpu_peak": _gpu_peak()}


def case_capture(spec: dict) -> dict:
    """Peak memory of one big batch captured by hooks (layer by layer) or output_attentions=True."""
    from rapids_attn.extract.shard import Extractor, ShardTask
    from rapids_attn.pipeline import preflight

    run_dir = Path(tempfile.mkdtemp(prefix="bench-cap-"))
    cfg = _job(spec, run_dir)
    cfg.extract.attention = "eager"  # both modes compared here hold eager maps (hooks, output_attentions)
    plan = preflight(cfg, ("extract",)).ctx
    ex = Extractor(ShardTask.from_job(cfg, plan.layout, plan.model.max_length))
    if spec["mode"] == "output_attentions":
        ex.capture.modules, ex.capture.mode = [], "output_attentions"
    from rapids_attn.extract.batching import tokenize

    t = tokenize(ex.tokenizer, plan.data.read(range(len(plan.data))), plan.model.max_length)
    idx = sorted(range(len(t.lengths)), key=lambda i: -t.lengths[i])[: spec.get("batch", 32)]
    ex.run_batch(**t.batch(idx[:2]))  # warm-up: allocator pools, lazy imports
    reset_hwm()  # the peak of this batch alone, not of loading or the warm-up
    with PeakRSS(0.01) as mem:
        base = mem.sample()
        t0 = time.perf_counter()
        ex.run_batch(**t.batch(idx))
        sec = time.perf_counter() - t0
    return {
        "mode": ex.capture.mode,
        "batch": len(idx),
        "longest": max(t.lengths[i] for i in idx),
        "peak_rss": mem.peak,
        "base_rss": base,
        "peak_over_base": mem.peak - base,
        "seconds": sec,
    }


def case_fit(spec: dict) -> dict:
    """PCA + KMeans fit time on synthetic features of the real dimension."""
    import numpy as np

    from rapids_attn.devices import resolve_learn_backend

    backend = resolve_learn_backend(spec.get("backend", "cpu"))
    rng = np.random.default_rng(0)
    n, d = spec["n"], spec.get("dim", 256)
    centers = rng.normal(0, 1, (8, d)).astype(np.float32)
    x = centers[rng.integers(0, 8, n)] + rng.normal(0, 0.5, (n, d)).astype(np.float32)
    x = backend.asarray(x)
    t0 = time.perf_counter()
    pca = backend.pca(32, 0).fit(x)
    z = pca.transform(x)
    t1 = time.perf_counter()
    backend.kmeans(8, 0).fit(z)
    if backend.gpu:
        backend.xp.cuda.Device().synchronize()
    t2 = time.perf_counter()
    return {"n": n, "dim": d, "backend": backend.name, "pca": t1 - t0, "kmeans": t2 - t1, "total": t2 - t0}


def case_codec(spec: dict) -> dict:
    """Bytes and write/read time of the features (and stats) of a real store under several codecs."""
    import numpy as np
    import zarr
    from zarr.codecs import BloscCodec, ZstdCodec

    from rapids_attn.store import schema as S

    src = zarr.open_group(spec["store"], mode="r")
    feats = np.asarray(src[S.FEATURES][:])
    stats = np.asarray(src[S.STATS][:])
    out = []
    codecs = {
        "none": None,
        "zstd-1": ZstdCodec(level=1),
        "zstd-3": ZstdCodec(level=3),
        "zstd-9": ZstdCodec(level=9),
        "blosc-zstd-3-shuffle": BloscCodec(cname="zstd", clevel=3, shuffle="shuffle"),
    }
    for rows in spec.get("rows", [16, 64, 256]):
        for name, codec in codecs.items():
            d = tempfile.mkdtemp(prefix="bench-codec-")
            g = zarr.open_group(d, mode="w")
            t0 = time.perf_counter()
            for key, arr in (("features", feats), ("stats", stats)):
                a = g.create_array(
                    key, shape=arr.shape, chunks=(rows, *arr.shape[1:]), dtype=arr.dtype, compressors=codec
                )
                a[:] = arr
            t1 = time.perf_counter()
            for key in ("features", "stats"):
                np.asarray(g[key][:])
            t2 = time.perf_counter()
            size = {
                k: sum(f.stat().st_size for f in (Path(d) / k).rglob("*") if f.is_file()) for k in ("features", "stats")
            }
            out.append({"rows": rows, "codec": name, "bytes": size, "write": t1 - t0, "read": t2 - t1})
    return {"maps": int(np.prod(feats.shape[:3])), "results": out}


def case_fidelity(spec: dict) -> dict:
    """How far int8 features are from float32 ones: finished runs over the same examples (``a`` and
    ``b``: lists of run folders, pairwise over the same segments), compared map by map, and clustered
    alike (PCA to 32, KMeans k=8) to compare the clusterings. The noise floor is the float32
    features clustered again with another KMeans seed."""
    import numpy as np
    import zarr
    from sklearn.cluster import KMeans
    from sklearn.decomposition import PCA
    from sklearn.metrics import adjusted_rand_score

    from rapids_attn.store import schema as S

    def features(runs: list[str]) -> np.ndarray:
        out = [
            np.asarray(zarr.open_group(str(Path(r) / "store.zarr"), mode="r")[S.FEATURES][:], dtype=np.float32)
            for r in runs
        ]
        return np.concatenate([f.reshape(-1, f.shape[-1]) for f in out])

    a, b = features(spec["a"]), features(spec["b"])
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    k = spec.get("k", 8)

    def clusters(x: np.ndarray, seed: int) -> np.ndarray:
        z = PCA(32, random_state=0).fit_transform(x)
        return KMeans(k, n_init=4, random_state=seed).fit_predict(z)

    fp32 = clusters(a, 0)
    return {
        "maps": int(a.shape[0]),
        "cos_mean": float(cos.mean()),
        "cos_min": float(cos.min()),
        "cos_p01": float(np.quantile(cos, 0.01)),
        "ari_int8_vs_fp32": float(adjusted_rand_score(fp32, clusters(b, 0))),
        "ari_fp32_reseeded": float(adjusted_rand_score(fp32, clusters(a, 1))),
        "k": k,
    }


CASES = {
    "pipeline": case_pipeline,
    "fidelity": case_fidelity,
    "bare": case_bare,
    "naive": case_naive,
    "capture": case_capture,
    "fit": case_fit,
    "codec": case_codec,
}


def main() -> None:
    import logging

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI does (rapids_attn/run.py)
    logging.basicConfig(level=logging.ERROR)
    for name in ("distributed", "bokeh", "tornado"):
        logging.getLogger(name).setLevel(logging.ERROR)
    spec = json.loads(sys.argv[1])
    result = CASES[spec["case"]](spec)
    print("RESULT " + json.dumps({"spec": spec, **result}), flush=True)


if __name__ == "__main__":
    main()
