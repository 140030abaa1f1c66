"""``python -m rapids_attn.export RUN [--format all|duo_attention,sparse_attention,head_score,kv_budget] [--model M]``

The head classes of an existing run (its extract stage finished) as the files KV-cache tools load
(:mod:`rapids_attn.kvheads.export`; docs/kv-heads.md), with no re-extraction: the classes, their bootstrap and
split halves are computed again from the store, with the run's ``explain.head_classes`` settings unless options
here change them. The files are checked against the model's config (``--model``: a folder or hub id, default the
model the run read) and refused in one line, exit 2, where they would not match. Writes ``RUN/head_classes/`` (or
``--out``) whole or not at all, and prints what it wrote.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rapids_attn.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    from rapids_attn.kvheads.export import FORMATS

    p = argparse.ArgumentParser(
        prog="python -m rapids_attn.export",
        description="Write a run's head classes in the formats KV-cache tools load (DuoAttention/kvpress, "
        "MInference/vLLM/SGLang, HeadKV, per-head keep indices), checked against the model.",
    )
    p.add_argument("run", help="the run directory (holds store.zarr)")
    p.add_argument("--format", default="all", help=f"comma-separated formats: {', '.join(FORMATS)}, or all (default)")
    p.add_argument("--model", help="the model folder or hub id whose config the files must match (default: the run's)")
    p.add_argument("--out", help="the folder to write (default: RUN/head_classes)")
    p.add_argument(
        "--combine", choices=("max", "mean"), help="a key-value head's DuoAttention value from its query heads'"
    )
    p.add_argument("--share", type=float, help="share of attention mass the vertical and slash sizes must hold")
    p.add_argument("--budget", type=float, help="kv_budget.json: mean kept per key-value head, share of the context")
    p.add_argument("--context-length", type=int, help="kv_budget.json's context length (default: the run's longest)")
    p.add_argument("--min-length", type=int, help="examples of at least this many tokens define streaming/retrieval")
    p.add_argument("--bootstrap", type=int, help="bootstrap resamples for the stability measures")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks for errors")
    return p


def _settings(g, args):
    """The run's explain.head_classes, with the options' overrides, validated as a job's would be."""
    from pydantic import ValidationError

    from rapids_attn.errors import JobConfigError
    from rapids_attn.job import HeadClassThresholds
    from rapids_attn.store.schema import Attr

    job = dict(g.attrs.get(Attr.JOB) or {})
    raw = dict(((job.get("explain") or {}).get("head_classes")) or {})
    exports = dict(raw.get("exports") or {})
    for key, value in (("combine", args.combine), ("share", args.share), ("budget", args.budget)):
        if value is not None:
            exports[key] = value
    if args.context_length is not None:
        exports["context_length"] = args.context_length
    raw["exports"] = exports
    for key, value in (("min_length", args.min_length), ("bootstrap", args.bootstrap)):
        if value is not None:
            raw[key] = value
    try:
        return HeadClassThresholds(**raw), int((job.get("runtime") or {}).get("seed", 0) or 0)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        raise JobConfigError(f"--{field.split('.')[-1].replace('_', '-')}: {err['msg']}") from None


def _model_shape(g, model: str | None):
    from rapids_attn.errors import ModelError
    from rapids_attn.kvheads.formats import ModelShape
    from rapids_attn.store.schema import Attr

    meta = dict(g.attrs.get(Attr.MODEL) or {})
    name = model or meta.get("source") or meta.get("name")
    if not name:
        raise ModelError("--model: the run's store names no model; pass --model FOLDER_OR_ID")
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(name))
    except Exception as e:  # noqa: BLE001 - any failure to read a config is the user's to fix, in one line
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ModelError(
            f"--model: cannot read the config of '{name}': {first}; pass --model a folder with its config.json"
        ) from None
    return ModelShape.from_config(config, str(model or meta.get("name") or name)), str(
        model or meta.get("name") or name
    )


def export_run(run: Path, args) -> dict:
    import zarr

    from rapids_attn.errors import StoreError
    from rapids_attn.explain import head_classes as HC
    from rapids_attn.kvheads import export as X
    from rapids_attn.rundir import shared_path
    from rapids_attn.store.schema import Attr, complete_attr

    store = Path(run) / "store.zarr"
    if not store.is_dir():
        raise StoreError(f"{run}: no store.zarr here; pass a run directory (its output.dir) whose extract stage ran")
    try:
        g = zarr.open_group(str(store), mode="r")
    except Exception as e:  # noqa: BLE001 - an unreadable store: one line
        raise StoreError(f"{store}: cannot open the store ({type(e).__name__}: {e})") from None
    if not g.attrs.get(complete_attr("extract")) and not g.attrs.get(Attr.EXTRACT_RUNS):
        raise StoreError(f"{store}: its extract stage has not finished; rerun the job to complete it")
    formats = (
        X.FORMATS if args.format.strip() == "all" else tuple(f.strip() for f in args.format.split(",") if f.strip())
    )
    hc_cfg, seed = _settings(g, args)
    shape, model = _model_shape(g, args.model)
    model = shared_path(model, run) or model  # the files are made to be shared: no absolute path (issue 47)
    hc = HC.compute(g, hc_cfg.thresholds(), hc_cfg.min_length, hc_cfg.bootstrap, seed)
    out = Path(args.out) if args.out else Path(run) / X.FOLDER
    settings = X.ExportSettings.from_config(hc_cfg.exports, formats)
    return X.write_exports(out, hc, shape, settings, model) | {"path": str(out)}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    t0 = time.perf_counter()
    try:
        manifest = export_run(Path(args.run), args)
    except (UserError, OSError) as e:
        if args.verbose:
            raise
        what = f"cannot write {e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename else str(e)
        print(f"error: {what}", file=sys.stderr)
        return 2
    st = manifest["stability"]["split_half"]
    print(
        f"wrote {manifest['path']} in {time.perf_counter() - t0:.1f} s: {', '.join(manifest['formats'])} for "
        f"{manifest['model']} ({manifest['shape']['layers']} layers, {manifest['shape']['heads']} heads on "
        f"{manifest['shape']['kv_heads']} key-value heads); classes {manifest['counts']}; split-half kappa "
        f"{st['kappa']} ({st['halves']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
