"""The explain stage: ``maps.parquet``, the findings, ``summary.json``'s body, the report and head views.

It reads the store (features' coordinates, clusters, stats, thumbnails, example metadata), builds
typed findings (:func:`rapids_attn.explain.describe.describe`), writes the per-head detector scores
back to the store, and renders the report from the findings. The pipeline writes ``summary.json``
from the result.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rapids_attn.stage import RunContext, Stage, StageResult
from rapids_attn.stagekit import open_for_run
from rapids_attn.store import schema as S


@dataclass
class ExplainResult(StageResult):
    #: the body of summary.json (counts, backend, clusters with their descriptions, heads, metadata, ...); its paths
    #: relative to the run directory (rapids_attn.rundir.shared_paths)
    summary: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dict(self.summary)


class ExplainStage(Stage):
    name = "explain"
    requires = (
        S.CLUSTER,
        S.COORDS,
        S.REDUCED,
        S.STATS,
        S.DETECTORS,
        S.SEQ_LEN,
        S.TRUNCATED,
        S.EXAMPLE_ID,
        S.EXAMPLE_GROUP,
        S.EXAMPLE_LABEL,
    )
    provides = S.arrays_of("explain")

    @classmethod
    def carries(cls, stage: type[Stage]) -> bool:
        """Whether the summary this stage writes already carries ``stage``'s result, so that ``summary.json`` does
        not repeat it under the stage's name: the stages whose arrays it requires (its summary is built from them:
        extract's this_run and runs, learn's clusters), and those that say so (:attr:`Stage.summarised`: heads,
        joined as head_importance; relevance, read back from the store)."""
        return stage.summarised or stage.name in {spec.stage for spec in cls.requires}

    def __init__(self, explain, model, data, embed_name: str, seed: int = 0):
        self.explain_cfg = explain
        self.model_cfg = model
        self.data = {"path": str(data.path), "format": data.format}
        self.embed_name = embed_name
        self.seed = seed

    @classmethod
    def from_job(cls, cfg) -> ExplainStage:
        return cls(cfg.explain, cfg.model, cfg.data, cfg.embed.name, cfg.runtime.seed)

    def run(self, ctx: RunContext, client=None) -> ExplainResult:
        from rapids_attn.explain.describe import describe
        from rapids_attn.explain.outputs import build_summary, write_maps_table
        from rapids_attn.extract.model import load_tokenizer
        from rapids_attn.store.zarr_store import consolidate, mark_complete

        g = open_for_run(self, ctx, rewrite=False)
        n_maps = write_maps_table(g, ctx.run_dir / "maps.parquet")
        summary = build_summary(ctx, g, n_maps, self.data, self.embed_name)
        say(f"describing {summary['clusters']['n_clusters']} clusters of {n_maps:,} maps")
        findings, arrays = describe(g, self.explain_cfg, self.seed, load_tokenizer(self.model_cfg), say=say)
        found = findings.to_dict()
        summary["clusters"]["descriptions"] = found["clusters"]
        summary["heads"] = found["heads_table"]
        summary["metadata"] = found["metadata"]
        data_warnings = list(getattr(ctx.data, "warnings", ()))  # preflight printed them
        findings.warnings[:0] = data_warnings  # the report's and summary.json's warnings start with the data's
        summary["warnings"] = findings.warnings
        summary["clusters"]["k_sweep"] = found["k_sweep"]
        summary["head_detectors"] = found["detectors"]
        # every registered stage's report section, in the stages' order: what it left in the store, into the summary
        self._sections = {}
        for name, section in report_sections(ctx.registry).items():
            self._sections[name] = (section, section.read(g, summary, findings, arrays, self._reported()))
        from rapids_attn.explain import head_classes as HC

        hc_cfg = self.explain_cfg.head_classes
        say("head classes: scores, bootstrap and split halves")
        hc = HC.compute(g, hc_cfg.thresholds(), hc_cfg.min_length, hc_cfg.bootstrap, self.seed)
        windowed = HC.windowed_examples(g)
        summary["head_classes"] = HC.write(ctx.run_dir, hc, summary["model"], summary["counts"]["examples"], windowed)
        summary["head_classes"]["exports"] = self._exports(ctx, hc, findings)
        self._sections["head_classes"] = (HC.HeadClassesSection(), (hc, summary["head_classes"]))
        short = HC.short_windows_warning(windowed, ctx.model.max_length)
        if short:
            findings.warnings.append(short)
        S.create_array(
            g,
            S.HEAD_DETECTORS,
            arrays.head_detectors.shape,
            data=arrays.head_detectors,
            attributes={S.Attr.NAMES: list(findings.detectors.names)},
        )
        mark_complete(g, self.name, True)
        consolidate(ctx.store_path)
        learned = ctx.results.get("learn")  # the learn stage of this run printed its own warnings already
        printed = set(learned.to_dict().get("warnings") or []) if learned is not None else set()
        printed.update(data_warnings)
        for w in findings.warnings:
            if w not in printed:
                print(f"warning: {w}", file=sys.stderr)
        if self.explain_cfg.report:
            summary["report"] = str(self._report(ctx, summary, findings, arrays))
        from rapids_attn.rundir import shared_paths

        # summary.json is shared: it names the run directory ".", the paths in it relative to it, and a model
        # folder or file elsewhere by its name (issue 47); the store keeps the absolute ones later runs read back
        return ExplainResult(summary=shared_paths(summary, ctx.run_dir))

    def _exports(self, ctx: RunContext, hc, findings) -> dict:
        """head_classes/ (explain.head_classes.exports) for a decoder whose every layer and head the run captured;
        otherwise, or where the classes do not apply, none, and the summary says why. An earlier run's folder is
        removed first, so a folder present is this run's."""
        import shutil

        from rapids_attn.extract.model import load_config
        from rapids_attn.kvheads import export as X
        from rapids_attn.kvheads.formats import ExportError, ModelShape
        from rapids_attn.rundir import EXPORTS_MANIFEST, shared_path

        out = ctx.run_dir / X.FOLDER
        if out.is_dir() and not out.is_symlink() and (out / EXPORTS_MANIFEST).is_file():
            shutil.rmtree(out)  # an earlier run's, written whole by us
        elif out.exists() or out.is_symlink():
            why = f"the path {out} is in the way (not a folder of exports this tool wrote); move it and rerun explain"
            findings.warnings.append(f"head-class exports not written: {why}")
            return {"written": False, "why": why}
        cfg = self.explain_cfg.head_classes.exports
        if not cfg.enabled:
            return {"written": False, "why": "explain.head_classes.exports.enabled is false"}
        if not hc.evidence.causal:
            return {"written": False, "why": "an encoder (no KV cache): the exports are for decoders"}
        try:
            _, config = load_config(self.model_cfg)
            shape = ModelShape.from_config(config, self.model_cfg.name)
            # the files are made to be shared: a local model folder is named as summary.json names it (issue 47)
            name = shared_path(self.model_cfg.name, ctx.run_dir)
            manifest = X.write_exports(out, hc, shape, X.ExportSettings.from_config(cfg), name)
        except ExportError as e:
            msg = f"head-class exports not written: {e} (python -m rapids_attn.export writes them later)"
            findings.warnings.append(msg)
            return {"written": False, "why": str(e)}
        say(f"head classes: exports in {out}")
        return {"written": True, "path": str(out), "formats": sorted(manifest["formats"])}

    def _report(self, ctx: RunContext, summary: dict, findings, arrays):
        from rapids_attn.explain.findings import ClusteringOverview, RunOverview
        from rapids_attn.explain.headview import VENDOR_FILES, head_view_sizes, write_head_views
        from rapids_attn.explain.report import write_report
        from rapids_attn.rundir import own_report_files, write_report_manifest

        c = summary["clusters"]
        overview = RunOverview(
            model=summary["model"],
            data=summary["data"],
            counts=summary["counts"],
            backend=summary["backend"],
            seconds=summary["seconds"],  # build_summary took them from ctx.timings: preflight and earlier stages
            clustering=ClusteringOverview(
                coords="umap" if c["umap"] else "pca",
                method=c["method"],
                n_clusters=c["n_clusters"],
                silhouette=c["silhouette"],
                noise_share=c["noise_share"],
                stability=(c.get("stability") or {}).get("min_ari"),
                embedder=self.embed_name,
            ),
        )
        report_dir = ctx.run_dir / "report"
        before = own_report_files(report_dir) if report_dir.is_dir() else set()  # what earlier reports wrote
        written: set[str] = set()
        views = None
        if self.explain_cfg.head_views:
            say(f"head views: {self.explain_cfg.head_views} exemplars of each of {len(findings.clusters)} clusters")
            try:
                views = write_head_views(
                    report_dir, self.model_cfg, ctx.data.examples(), findings.clusters, owned=before
                )
                if views:
                    written |= {p for paths in views.values() for p in paths}
                    written |= {f"headviews/vendor/{n}" for n in (*VENDOR_FILES, "LICENSES.txt")}
            except Exception as e:  # noqa: BLE001 - the head views are an aid: the report goes on without them, and says so
                first = str(e).splitlines()[0][:200] if str(e) else ""
                msg = f"head views not written ({type(e).__name__}: {first})"
                findings.warnings.append(msg)  # summary["warnings"] is the same list
                print(f"warning: {msg}", file=sys.stderr)
            summary["head_views"] = head_view_sizes(ctx.run_dir / "report", views)  # pages, bytes: kept small
        self._explorer(ctx, summary, findings)  # first, so that the report links to it
        if summary.get("explorer"):
            written.add(Path(summary["explorer"]["path"]).name)
        say("report: figures and page")
        index = write_report(
            ctx.run_dir,
            overview,
            findings,
            arrays,
            views,
            sections=list(getattr(self, "_sections", {}).values()),
            owned=before,
            written=written,
        )
        for rel in sorted(before - written):  # an earlier report's files this one did not write again
            (report_dir / rel).unlink(missing_ok=True)
        write_report_manifest(report_dir, written)
        return index

    def _explorer(self, ctx: RunContext, summary: dict, findings=None) -> None:
        """report/explorer.html (explain.explorer), or none: an earlier run's file is removed."""
        import zarr

        from rapids_attn.explain.explorer import FILE, explorer_models, map_limit, sample_maps, write_explorer

        out = ctx.run_dir / "report" / FILE
        out.parent.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)
        if not self.explain_cfg.explorer:
            return
        g = zarr.open_group(str(ctx.store_path), mode="r")
        shape = g[S.CLUSTER].shape
        idx = sample_maps(shape, map_limit(g, self.explain_cfg.explorer_sample), self.seed)
        examples = sorted({int(i) for i in idx // (shape[1] * shape[2])})
        texts = {
            i: e.text + (f" | {e.text_pair}" if e.text_pair else "")
            for i, e in zip(examples, ctx.data.read(examples), strict=True)
        }
        atlas = (self._reported().get("relevance") or {}).get("atlas")  # the relevance stage's head atlas
        n_models = len(explorer_models(g))
        say(f"explorer: {len(idx):,} sampled maps" + (f" of each of {n_models} models" if n_models > 1 else ""))
        names = {c.id: c.summary for c in findings.clusters} if findings is not None else None  # the legend's
        path = write_explorer(out.parent, g, texts, atlas, self.explain_cfg.explorer_sample, self.seed, names)
        summary["explorer"] = {
            "path": str(path),
            "maps": len(idx),  # per model: with the compare stage, every model's maps of the same sample
            "models": n_models,
            "bytes": path.stat().st_size,
        }

    def _reported(self) -> dict:
        """What each report section read in this run, by stage name."""
        return {name: state for name, (_, state) in getattr(self, "_sections", {}).items()}


def say(msg: str) -> None:
    """One status line on stderr for a long step of the stage: ``rapids_attn: explain: ...``."""
    print(f"rapids_attn: explain: {msg}", file=sys.stderr, flush=True)


def report_sections(stages: Mapping[str, type[Stage]]) -> dict:
    """The report sections of ``stages`` (the run's registry, :attr:`RunContext.registry`) that have one
    (:meth:`Stage.report_section`), by stage name, in their order."""
    out = {}
    for name, st in stages.items():
        section = st.report_section()
        if section is not None:
            out[name] = section
    return out
