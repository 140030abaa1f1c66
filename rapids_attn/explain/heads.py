"""The heads stage's results in the explain stage: joined to the clusters, drawn, and written up.

:func:`join` reads the store's ``heads`` attribute (the heads stage's result) and gives, for each cluster,
its heads (those whose maps fall mostly in it: the explain stage's dominant cluster per head), what
ablating them together costs (the heads stage's ``cluster:<id>`` set), their mean single-head cost and
importance, and the probes' mean and best accuracy over them. A heads result from another clustering
(the learn stage ran again since) is not joined; the report says to rerun ``--stages heads``.
"""

from __future__ import annotations

import numpy as np

from rapids_attn.explain.formatting import esc, img, num

#: figure file names (the report's clean-up keeps only the names it wrote)
FIGURES = ("head_importance.png", "pruning.png")


def stored_result(g) -> dict | None:
    """The heads stage's result, its summaries recomputed from the stored per-example scores
    (:func:`rapids_attn.heads.summary.resummarise`); None when the stage has not completed."""
    from rapids_attn.heads.summary import resummarise
    from rapids_attn.store.schema import complete_attr

    info = g.attrs.get("heads") if g.attrs.get(complete_attr("heads")) else None
    return resummarise(g, dict(info)) if info else None


def join(
    g, info: dict | None, dominant_cluster: np.ndarray, layers, heads, cluster_ids
) -> tuple[dict | None, str | None]:
    """-> (the join, for summary.json and the report; a warning or None). ``info``: :func:`stored_result`.
    ``dominant_cluster`` [l, h] is over the store's kept layers and heads (``layers``, ``heads``), whose
    model indices the heads stage uses."""
    from rapids_attn.learn.storeio import learn_key

    attrs = g.attrs
    if not info:
        return None, None
    out = {k: info.get(k) for k in ("metric", "examples", "ablation", "headline", "higher_is_better", "base")}
    if info.get("scope"):  # what the scores are measured against (retrieval: the sample's paragraphs)
        out["scope"] = info["scope"]
    out["base_columns"] = info.get("base_columns")
    out["pruning"] = info.get("pruning") or {}
    out["most_costly"] = info.get("most_costly", [])[:5]
    out["significant"] = info.get("significant")
    out["importance_vs_ablation"] = info.get("importance_vs_ablation")
    out["layers"] = {k.split(":")[1]: v for k, v in info.get("sets", {}).items() if k.startswith("layer:")}
    if info.get("learn_key") and info["learn_key"] != learn_key(attrs):
        return out, (
            "the heads stage's results come from an earlier clustering, so they are not joined to these clusters; "
            "rerun with --stages heads,explain"
        )
    cost = np.asarray(info["cost"], np.float64) if info.get("cost") is not None else None
    imp = np.asarray(info["importance"], np.float64) if info.get("importance") is not None else None
    probes = (info.get("probing") or {}).get("tasks", {})
    by_cluster = {}
    for cid in cluster_ids:
        members = [(int(layers[i]), int(heads[j])) for i, j in zip(*np.nonzero(dominant_cluster == cid), strict=True)]
        entry: dict = {"heads": [list(m) for m in members]}
        s = info.get("sets", {}).get(f"cluster:{cid}")
        if s is not None:
            entry["set"] = {"cost": s["cost"], "ci": s["ci"], "heads": info.get("clusters", {}).get(str(cid), [])}
        if members and cost is not None:
            entry["mean_cost"] = float(np.nanmean([cost[m] for m in members]))
        if members and imp is not None:
            entry["mean_importance"] = float(np.mean([imp[m] for m in members]))
        if members:
            entry["probing"] = {}
            for task, r in probes.items():
                acc = np.asarray(r["accuracy"], np.float64)
                vals = [acc[m] for m in members]
                best = members[int(np.argmax(vals))]
                entry["probing"][task] = {
                    "mean": float(np.mean(vals)),
                    "best": {"layer": best[0], "head": best[1], "accuracy": float(np.max(vals))},
                    "majority": r["majority"],
                }
        by_cluster[str(cid)] = entry
    out["by_cluster"] = by_cluster
    probing = info.get("probing") or {}
    out["probing_folds"] = probing.get("folds")
    out["probing_skipped"] = dict(probing.get("skipped") or {})
    out["probing"] = {
        t: {
            "majority": r["majority"],
            "best_head": r["best_head"],
            "best_heads": {k: r["best_heads"].get(k) for k in ("best_heads", "reference", "k")},
        }
        for t, r in probes.items()
    }
    return out, None


def figures(out_dir, info: dict) -> list[str]:
    """The layer x head heatmaps (ablation cost, importance, probe accuracy per task) and the pruning curves."""
    from rapids_attn.explain import figures as F

    panels = []
    if info.get("cost") is not None:
        panels.append(
            ("ablation cost (" + str(info["headline"]) + ")", np.asarray(info["cost"], np.float64), "RdBu_r", True)
        )
    if info.get("importance") is not None:
        panels.append(("importance (Michel et al.)", np.asarray(info["importance"], np.float64), "viridis", False))
    for task, r in ((info.get("probing") or {}).get("tasks") or {}).items():
        panels.append(
            (f"probe: {task} (majority {r['majority']:.2f})", np.asarray(r["accuracy"], np.float64), "viridis", False)
        )
    names = []
    if panels:
        n_layers, n_heads = panels[0][1].shape
        w, h = F.grid_size(n_layers, n_heads, panels=1)
        cols = min(3, len(panels))
        rows = -(-len(panels) // cols)
        fig = F.new_figure((w + 0.8) * cols, h * rows)
        for i, (title, v, cmap, centred) in enumerate(panels):
            ax = fig.add_subplot(rows, cols, i + 1)
            lim = F.finite_max(np.abs(v)) or 1.0
            kw = {"vmin": -lim, "vmax": lim} if centred else {}
            im = ax.imshow(np.ma.masked_invalid(v), cmap=cmap, aspect="equal", interpolation="nearest", **kw)
            F.grid_axes(ax, list(range(n_layers)), list(range(n_heads)))
            ax.set_title(title, fontsize=9)
            if centred and info.get("cost_ci") is not None:  # a dot: the 95% interval excludes 0
                ci = np.asarray(info["cost_ci"], np.float64)
                sig_r, sig_c = np.nonzero((ci[..., 0] > 0) | (ci[..., 1] < 0))
                ax.scatter(sig_c, sig_r, s=6, c="black", marker="o")
            fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
        names.append(F.save(fig, out_dir, FIGURES[0]))
    curves = info.get("pruning") or {}
    if curves:
        fig = F.new_figure(6.5, 3.8)
        ax = fig.add_subplot(1, 1, 1)
        for order, c in curves.items():
            ax.plot(c["removed"], c["score"], marker=".", label=f"{order} (removable {c['removable']})")
            if "min" in c:
                ax.fill_between(c["removed"], c["min"], c["max"], alpha=0.2)
        ax.axhline(info["base"], color="grey", linewidth=0.8, linestyle="--")
        ax.set_xlabel("heads removed")
        ax.set_ylabel(str(info["headline"]))
        ax.legend(fontsize=8)
        names.append(F.save(fig, out_dir, FIGURES[1]))
    return names


def _probes_note(joined: dict) -> str:
    """What the probes were, as this run made them: their folds, and each task left out with why."""
    done, skipped, folds = joined.get("probing") or {}, joined.get("probing_skipped") or {}, joined.get("probing_folds")
    if not done and not skipped:
        return "no probes were run (heads.probing)."
    parts = []
    if done:
        how = f"{int(folds)}-fold cross-validated" if folds else "cross-validated"
        parts.append(
            f"probes ({esc(', '.join(done))}) are {how} linear probes on each head's output mean-pooled over the example"
        )
    if skipped:
        parts.append("not probed: " + "; ".join(f"{esc(t)} ({esc(why)})" for t, why in skipped.items()))
    return "; ".join(parts) + "."


def _scope_note(joined: dict) -> str:
    """The note on what the score is measured against, where that depends on the examples scored (retrieval:
    the candidate paragraphs); empty otherwise."""
    scope = joined.get("scope") or {}
    return f" (ranked against {esc(scope['pool'])})" if scope.get("pool") else ""


def section(joined: dict | None, warning: str | None, figs: list[str]) -> str:
    """The report's "Which heads matter" section (empty when the heads stage has not run)."""
    if joined is None:
        return ""
    head = f"""
<section id="importance"><h2>Which heads matter</h2>
<p class="note">From the heads stage: {esc(joined["metric"])} on {num(joined["examples"])} examples; the
whole model scores {esc(joined["headline"])} = {num(joined["base"])}{_scope_note(joined)}. A head's ablation cost is the mean
over examples of the score lost when its output is {esc(joined["ablation"])}ed before the attention output
projection (positive: the task needs it), with a 95% t interval over the examples; importance is Michel et
al.'s |dL/dgate|, normalised per layer; {_probes_note(joined)}</p>"""
    if warning:
        return head + f'<p class="warn">{esc(warning)}</p></section>'
    rows = []
    for cid, e in joined.get("by_cluster", {}).items():
        s = e.get("set")
        set_txt = f"{num(s['cost'])} [{num(s['ci'][0])}, {num(s['ci'][1])}]" if s else "n/a"
        probe_txt = "; ".join(
            f"{t} {num(p['best']['accuracy'])} (L{p['best']['layer']}-H{p['best']['head']}, majority {num(p['majority'])})"
            for t, p in e.get("probing", {}).items()
        )
        rows.append(
            f"<tr><td>{esc(cid)}</td><td class=n>{len(e['heads'])}</td><td class=n>{esc(set_txt)}</td>"
            f"<td class=n>{num(e.get('mean_cost'))}</td><td class=n>{num(e.get('mean_importance'))}</td>"
            f"<td>{esc(probe_txt)}</td></tr>"
        )
    prune = ", ".join(f"{o}: {c['removable']}" for o, c in (joined.get("pruning") or {}).items())
    table = (
        "<table><thead><tr><th>cluster</th><th class=n>its heads</th><th class=n>cost of ablating them together "
        "[95% CI]</th><th class=n>mean single-head cost</th><th class=n>mean importance</th><th>best probe among "
        f"its heads</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
    prune_txt = (
        f"<p>Heads removable before the score drops by more than 0.01, by order: {esc(prune)}.</p>" if prune else ""
    )
    sig, agree = joined.get("significant"), joined.get("importance_vs_ablation")
    if sig:
        prune_txt += (
            f"<p>Heads whose removal alone costs beyond chance (95% interval above 0; dots in the heatmap): "
            f"{num(sig['worse'])}; whose removal helps: {num(sig['better'])}.</p>"
        )
    if agree:
        prune_txt += (
            f"<p>Importance against ablation cost over {num(agree['heads'])} heads: Spearman's rho "
            f"{num(agree['raw']['spearman'])} (raw importance), {num(agree['normalised']['spearman'])} "
            "(normalised per layer).</p>"
        )
    imgs = "".join(img(f, "head importance and pruning") for f in figs)
    return head + table + prune_txt + imgs + "</section>"
