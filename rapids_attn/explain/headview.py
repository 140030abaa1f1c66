"""Interactive BertViz head views of each cluster's exemplar maps, as offline HTML pages.

For every exemplar ``{"example_index", "example_id", "layer", "head"}`` of a cluster, the model is
run again on that one example (tokenized exactly as the extraction tokenizes it: the same
``tokenize`` with the model's ``max_length``, the same ``input_ids`` (+ ``token_type_ids``) inputs,
eager attention) and ``report/headviews/cluster{c}_ex{i}.html`` is written with BertViz's head
view, opened at the exemplar's layer with its head selected.

BertViz's HTML loads require.js, d3 and jQuery from cdnjs. The pages here load copies vendored in
``rapids_attn/explain/vendor/`` (see ``LICENSES.txt`` there), copied to ``report/headviews/vendor/``,
so they work with no network. Two more changes keep the pages safe and small:

- the script body is escaped so that no token can close the ``<script>`` element (``</`` -> ``<\\/``);
- attention weights are rounded to ``decimals`` places (BertViz draws a line's opacity from the
  weight, so 1e-3 is far below what shows) and, unless ``all_layers`` / ``all_heads``, only the
  exemplar's own layer and head are included (the weights are sliced before BertViz sees them; its
  ``head_view`` has ``include_layers`` but no head filter). On the quickstart (MiniLM, 12 heads,
  inputs of about 86 tokens) a page is 66-165 KB; with the exemplar's whole layer it was 0.6-1.8 MB.
  :func:`head_view_sizes` counts what was written, for ``summary.json``.
"""

from __future__ import annotations

import dataclasses
import html
import logging
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePath

log = logging.getLogger(__name__)

VENDOR_DIR = Path(__file__).resolve().parent / "vendor"
VENDOR_FILES = ("require.js", "d3.min.js", "jquery.min.js")
HEADVIEW_DIR = "headviews"
#: the most tokens a page shows (an exemplar's first ones): the model runs again with eager attention, every
#: layer's [head, T, T] weights held, and a page draws every pair; at 4,096 tokens on a tiny decoder a page was
#: 176 MB, and a 30-layer model would hold some 17 GiB of weights per example
MAX_TOKENS = 512

# BertViz's CDN URLs -> the vendored copies (relative to the page; require.config paths carry no ".js")
_CDN_REWRITES = (
    (
        re.compile(r"https?://cdnjs\.cloudflare\.com/ajax/libs/require\.js/[^\"'\s]*?/require(?:\.min)?\.js"),
        "vendor/require.js",
    ),
    (re.compile(r"https?://cdnjs\.cloudflare\.com/ajax/libs/d3/[^\"'\s]*?/d3(?:\.min)?(?=['\"])"), "vendor/d3.min"),
    (
        re.compile(r"https?://cdnjs\.cloudflare\.com/ajax/libs/jquery/[^\"'\s]*?/jquery(?:\.min)?(?=['\"])"),
        "vendor/jquery.min",
    ),
)
# the only other URL in BertViz's output is a credit in a JS comment; keep the credit, drop the scheme
_COMMENT_URL = re.compile(r"(Based on:\s*)https?://(\S+)")
_SCRIPT_OPEN = '<script type="text/javascript">'
_PAGE_RE = re.compile(r"^cluster-?\d+_ex\d+\.html$")

PAGE_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;margin:16px 24px;
  color:#1d1d1f;line-height:1.4}
h1{font-size:1.25em;margin:.2em 0 .3em} .note{color:#555;font-size:.9em;max-width:60em}
"""


def _exemplars(v) -> list[dict]:
    """Exemplar references as dicts: typed ``ExemplarRef``s (explain's findings) or dicts already."""
    return [dataclasses.asdict(x) if dataclasses.is_dataclass(x) else dict(x) for x in v or []]


def _normalise_items(items) -> list[tuple[int, list[dict]]]:
    """``items``: the findings' clusters (objects with ``id`` and ``exemplar_examples``), dicts with the
    same keys, or a mapping of cluster id to a list of exemplars (or to a cluster dict)."""
    out: list[tuple[int, list[dict]]] = []
    if isinstance(items, Mapping):
        for cid, v in items.items():
            if isinstance(v, Mapping):
                v = v.get("exemplar_examples") or []
            out.append((int(cid), _exemplars(v)))
    else:
        for c in items or []:
            if isinstance(c, Mapping):
                out.append((int(c["id"]), _exemplars(c.get("exemplar_examples"))))
            else:
                out.append((int(c.id), _exemplars(c.exemplar_examples)))
    return out


def page_name(cluster_id: int, i: int) -> str:
    return f"cluster{int(cluster_id)}_ex{int(i)}.html"


def copy_vendor(headview_dir: Path) -> Path:
    """Copy the vendored JS into ``headview_dir/vendor`` (each file written under a temporary name, then renamed)."""
    dest = Path(headview_dir) / "vendor"
    dest.mkdir(parents=True, exist_ok=True)
    for name in VENDOR_FILES + ("LICENSES.txt",):
        src = VENDOR_DIR / name
        if not src.is_file():
            raise FileNotFoundError(f"vendored file missing from the package: {src} (reinstall rapids_attn)")
        tmp = dest / (name + ".tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest / name)
    return dest


def offline_html(bertviz_html: str) -> str:
    """BertViz's returned HTML with CDN URLs pointed at ``vendor/`` and the script body made unbreakable."""
    out = bertviz_html
    for pattern, repl in _CDN_REWRITES:
        out, n = pattern.subn(repl, out)
        if n == 0:
            raise RuntimeError(
                f"bertviz's HTML no longer references {repl.split('/')[-1]} from cdnjs as expected; "
                "update rapids_attn/explain/headview.py for this bertviz version"
            )
    out = _COMMENT_URL.sub(r"\1\2", out)
    if "cdnjs" in out or re.search(r"""src\s*=\s*["']?https?:""", out):
        raise RuntimeError("bertviz's HTML still loads a script from the network after rewriting")
    start = out.find(_SCRIPT_OPEN)
    end = out.rfind("</script>")
    if start >= 0 and end > start:
        body = out[start + len(_SCRIPT_OPEN) : end]
        # inside <script>, "</" could end the element (a token such as "</script>"); "<\/" is the same in JS
        body = body.replace("</", "<\\/").replace("<!--", "<\\!--")
        out = out[: start + len(_SCRIPT_OPEN)] + body + out[end:]
    return out


def _page(title: str, intro: str, body: str, back: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{PAGE_CSS}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p class="note">{intro}</p>
<p class="note"><a href="{html.escape(back, quote=True)}">back to the report</a></p>
{body}
</body></html>
"""


def _example(examples, index: int):
    try:
        return examples[index]
    except (IndexError, KeyError):
        raise ValueError(f"head view: example_index {index} is not among the {len(examples)} examples given") from None


def write_head_views(
    report_dir,
    model_cfg,
    examples,
    items,
    *,
    all_layers: bool = False,
    all_heads: bool = False,
    decimals: int = 3,
    owned: set[str] | None = None,
) -> dict[int, list[str]]:
    """Write one head-view page per exemplar; return ``{cluster id: [page path relative to report_dir]}``.

    ``owned``: the paths (relative to ``report_dir``) an earlier report wrote (its manifest); of those, the pages
    this run does not write are removed. None: every file of a page's name.

    model_cfg: the job's ``ModelConfig`` (or its dict). examples: the run's examples, indexable by
    ``example_index`` (a list in store order, a mapping, or the job's ``ctx.data.examples()``, which reads
    only the examples indexed). items: ``d["clusters"]`` or
    ``{cluster id: [exemplar dicts]}``.
    """
    import torch

    from rapids_attn.explain.formatting import anchor
    from rapids_attn.extract.batching import tokenize
    from rapids_attn.extract.model import describe_model, load_model, load_tokenizer
    from rapids_attn.job import ModelConfig

    try:
        from bertviz import head_view
    except ImportError as e:  # pragma: no cover - bertviz is a dependency
        raise ImportError(f"head views need bertviz (pip install bertviz): {e}") from None

    plan = _normalise_items(items)
    if not any(its for _, its in plan):
        return {}
    if not isinstance(model_cfg, ModelConfig):
        model_cfg = ModelConfig.model_validate(model_cfg)
    report_dir = Path(report_dir)
    out_dir = report_dir / HEADVIEW_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    copy_vendor(out_dir)

    # the config only: preflight checked the files, and the tokenizer and model are loaded (and checked) next
    max_length = describe_model(model_cfg, check_files=False).max_length
    shown = min(max_length, MAX_TOKENS)  # eager weights of every layer, and a page that draws every pair
    tokenizer = load_tokenizer(model_cfg)
    model = load_model(model_cfg, "cpu", "float32")  # a few examples: the CPU in float32, whatever the job ran on
    cache: dict[int, tuple[list[str], tuple]] = {}
    full: dict[int, int] = {}  # each example's tokens in the extraction

    def run(index: int):
        if index not in cache:
            ex = _example(examples, index)
            inputs = tokenize(tokenizer, [ex], shown).batch([0])  # input_ids (+ token_type_ids)
            ids = inputs["input_ids"][0]
            full[index] = tokenize(tokenizer, [ex], max_length).lengths[0] if max_length > shown else len(ids)
            t = {k: torch.tensor(v, dtype=torch.long) for k, v in inputs.items()}
            with torch.no_grad():
                out = model(**t, attention_mask=torch.ones_like(t["input_ids"]), output_attentions=True)
            att = getattr(out, "attentions", None)
            if not att or any(a is None for a in att):
                raise RuntimeError(f"model.name: '{model_cfg.name}' returned no attention weights for the head view")
            cache.clear()  # exemplars of one example are usually adjacent; keep memory to one example
            cache[index] = (tokenizer.convert_ids_to_tokens(ids), tuple(a.detach().float().cpu() for a in att))
        return cache[index]

    written: dict[int, list[str]] = {}
    for cid, its in plan:
        paths: list[str] = []
        for i, it in enumerate(its):
            index, layer, head = int(it["example_index"]), int(it["layer"]), int(it["head"])
            ex = _example(examples, index)
            ex_id = it.get("example_id", getattr(ex, "id", index))
            if "example_id" in it and getattr(ex, "id", None) is not None and str(ex.id) != str(it["example_id"]):
                raise ValueError(
                    f"head view: example_index {index} is '{ex.id}' in the examples given, but cluster "
                    f"{cid} names '{it['example_id']}'; pass the run's examples in store order"
                )
            tokens, att = run(index)
            if not 0 <= layer < len(att) or not 0 <= head < att[layer].shape[1]:
                raise ValueError(
                    f"head view: layer {layer} head {head} is outside the model "
                    f"({len(att)} layers x {att[0].shape[1]} heads)"
                )
            # only what the page shows goes into it: the exemplar's layer and head (BertViz numbers the
            # heads it is given 0..; the page's title names the model's head)
            include = list(range(len(att))) if all_layers else [layer]
            keep = slice(None) if all_heads else slice(head, head + 1)
            sliced = [
                torch.round(a[:, keep].double(), decimals=decimals) if j in include else a[:, :0]
                for j, a in enumerate(att)
            ]
            view = head_view(
                sliced,
                tokens,
                layer=layer,
                heads=[head if all_heads else 0],
                include_layers=include,
                html_action="return",
            )
            title = f"{'noise' if cid == -1 else f'cluster {cid}'} · example {ex_id} · layer {layer} head {head}"
            intro = (
                f"BertViz head view of example {html.escape(str(ex_id))} ({_shown(len(tokens), full[index])}), "
                "an exemplar of "
                f"{'the noise' if cid == -1 else f'cluster {cid}'}. Lines join each token on the left (query) "
                f"to the tokens it attends to on the right (keys); darker is more attention. Head {head} of "
                f"layer {layer} is shown"
                + (
                    ": click a colour to show other heads, hover a token to isolate it."
                    if all_heads
                    else " (only this head, to keep the page small); hover a token to isolate it."
                )
            )
            page = _page(title, intro, offline_html(view.data), f"../index.html#{anchor(cid)}")
            name = page_name(cid, i)
            tmp = out_dir / (name + ".tmp")
            tmp.write_text(page, encoding="utf-8")
            os.replace(tmp, out_dir / name)
            paths.append(f"{HEADVIEW_DIR}/{name}")
        written[cid] = paths
    keep = {PurePath(x).name for paths in written.values() for x in paths}
    for old in out_dir.glob("cluster*_ex*.html"):  # pages of an earlier run's clusters
        mine = owned is None or f"{HEADVIEW_DIR}/{old.name}" in owned
        if mine and _PAGE_RE.match(old.name) and old.name not in keep:
            old.unlink()
    log.info("wrote %d head views in %s", sum(len(p) for p in written.values()), out_dir)
    return written


def _shown(n: int, whole: int) -> str:
    if n >= whole:
        return f"{n} tokens"
    return (
        f"its first {n} of {whole} tokens: a page draws every pair of tokens; a decoder's rows there are the "
        "whole input's, an encoder's saw these tokens only"
    )


def head_view_sizes(report_dir, written: dict[int, list[str]] | None) -> dict:
    """What the head views cost on disk: the pages written (``files``, ``bytes``) and the vendored
    scripts they share (``vendor_bytes``), for ``summary.json``."""
    report_dir = Path(report_dir)
    pages = [report_dir / p for paths in (written or {}).values() for p in paths]
    vendor = report_dir / HEADVIEW_DIR / "vendor"
    return {
        "files": len(pages),
        "bytes": sum(p.stat().st_size for p in pages if p.is_file()),
        "vendor_bytes": sum(f.stat().st_size for f in vendor.iterdir() if f.is_file()) if vendor.is_dir() else 0,
    }
