"""The report's sections of issue 37's stages: the fine-tune's scores beside the prior work's ("The fine-tune"), and
"What changed between models" (the compare stage): per-head heatmaps of change with the intervals marked, the
per-layer profile (Kovaleva et al.'s figure), the most-changed heads with exemplar thumbnails of both models side by
side, and the cluster transitions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rapids_attn.explain.formatting import esc, img, num
from rapids_attn.stage import ReportSection
from rapids_attn.store import schema as S

#: the scores shown, in order, with their names in summary.json (qa: percent, as SQuAD's official script)
QA_SCORES = ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_exact", "best_f1")
#: most-changed heads shown with exemplar thumbnails, per compared model
EXEMPLARS = 5


def finetune_result(g) -> dict | None:
    """The fine-tune's result where the store's model is a folder the finetune stage wrote (its
    ``metrics.json``), else None."""
    source = (g.attrs.get(S.Attr.MODEL) or {}).get("source")
    if not source:
        return None
    try:
        made = json.loads((Path(source) / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    return made.get("result") if isinstance(made, dict) else None


class FinetuneSection(ReportSection):
    anchor = "finetune"
    title = "The fine-tune"

    def read(self, g, summary: dict, findings, arrays, earlier: dict[str, Any]) -> dict | None:
        info = finetune_result(g)
        if info is not None:
            summary["finetune"] = info
        return info

    def html(self, info: dict | None, figures: list[str]) -> str:
        if not info:
            return ""
        scores, base, prior = (
            info.get("scores") or {},
            info.get("no_answer_baseline") or {},
            info.get("prior_work") or {},
        )
        if info.get("task") == "qa":
            rows = "".join(
                f"<tr><td>{esc(k)}</td><td class=n>{num(scores.get(k), 2)}</td><td class=n>{num(base.get(k), 2)}</td>"
                f"<td class=n>{num(prior.get(k), 2) if k in prior else 'n/a'}</td></tr>"
                for k in QA_SCORES
            )
            table = (
                "<table><thead><tr><th>SQuAD 2.0 score (%)</th><th class=n>this fine-tune</th>"
                "<th class=n>no answer, always</th><th class=n>prior work (BERT-base, dev set)</th></tr></thead>"
                f"<tbody>{rows}</tbody></table>"
            )
        else:
            per = info.get("scores", {}).get("per_class", {})
            rows = "".join(f"<tr><td>{esc(k)}</td><td class=n>{num(v)}</td></tr>" for k, v in per.items())
            table = (
                f"<p>Accuracy {num(info.get('scores', {}).get('accuracy'))} over {num(info.get('eval_examples'))} "
                "held-out examples.</p><table><thead><tr><th>class</th><th class=n>accuracy</th></tr></thead>"
                f"<tbody>{rows}</tbody></table>"
            )
        return f"""
<section id="finetune"><h2>The fine-tune</h2>
<p class="note">The analysed model is a fine-tune made by the finetune stage ({esc(info.get("task"))}, HuggingFace's
Trainer) on {num(info.get("train_examples"))} examples of {num(info.get("train_groups"))} groups, scored on
{num(info.get("eval_examples"))} examples of {num(info.get("eval_groups"))} other groups (no context on both sides),
on {esc(info.get("device"))} in {num(info.get("train_seconds"), 1)} s of training. The prior work's figures are
BERT-base on the whole SQuAD v2 dev set: a reference, not the same data or model. best_exact and best_f1 are
the official evaluation's scores at the no-answer threshold that scores best on these very questions (an upper
bound: what the spans are worth apart from the no-answer calibration).</p>{table}{baseline_html(info)}</section>"""


def baseline_html(info: dict) -> str:
    """The fine-tune (and each control) against the trivial baselines on the same held-out examples: each baseline's
    score and the per-example gain over it with its interval."""
    runs = [{"label": "finetuned", "seed": info.get("seed"), "shuffled": False, **info}, *info.get("controls", [])]
    rows = []
    for r in runs:
        b = r.get("baseline") or {}
        for base in (b, b.get("also") or {}):
            gain = base.get("gain") or {}
            if not gain:
                continue
            ci = gain.get("ci") or [None, None]
            beats = "yes" if ci[0] is not None and ci[0] > 0 else "no"
            rows.append(
                f"<tr><td>{esc(r['label'])}</td><td class=n>{num(r.get('seed'))}</td>"
                f"<td>{'yes' if r.get('shuffled') else 'no'}</td><td>{esc(base.get('name'))}</td>"
                f"<td>{esc(base.get('questions', ''))}</td><td class=n>{num(base.get('value'))}</td>"
                f"<td class=n>{num(gain.get('mean'))} [{num(ci[0])}, {num(ci[1])}]</td><td>{beats}</td></tr>"
            )
    if not rows:
        return ""
    b = info.get("baseline") or {}
    return (
        f"<p>Against trivial baselines on the same held-out examples: the gain per example ({esc(b.get('score'))}), "
        f"with its {int(100 * (b.get('gain') or {}).get('level', 0.95))}% bootstrap interval over the examples; a "
        "fine-tune beats a baseline where the interval lies above 0.</p><table><thead><tr>"
        "<th>fine-tune</th><th class=n>training seed</th><th>labels shuffled</th><th>baseline</th><th>questions</th>"
        "<th class=n>baseline's score</th><th class=n>gain [CI]</th><th>beats it</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def stored_result(g) -> dict | None:
    return dict(g.attrs.get(S.Attr.COMPARE)) if g.attrs.get(S.complete_attr("compare")) else None


class CompareSection(ReportSection):
    anchor = "compare"
    title = "What changed between models"
    figure_pattern = r"compare_(heads|layers|exemplars|floor|trajectory)(_[A-Za-z0-9_.-]+)?"

    def read(self, g, summary: dict, findings, arrays, earlier: dict[str, Any]) -> dict | None:
        info = stored_result(g)
        if info is None:
            return None
        heads = earlier.get("heads")
        cost = getattr(heads, "info", None) or {}
        cost = np.asarray(cost["cost"], np.float64) if cost.get("cost") is not None else None
        for entry in info.get("compared", []):
            for row in entry.get("most_changed", []):
                if cost is not None and row["layer"] < cost.shape[0] and row["head"] < cost.shape[1]:
                    row["ablation_cost"] = float(cost[row["layer"], row["head"]])
        floor = (info.get("floor") or {}).get("jsd")
        if floor and cost is not None and cost.shape == np.shape(floor["heads"]["changed"]):
            from rapids_attn.compare.floor import causal_check

            h = getattr(heads, "info", None) or {}
            floor["causal"] = {
                "metric": h.get("metric"),
                "headline": h.get("headline"),
                "examples": h.get("examples"),
                **causal_check(floor, cost, h.get("cost_ci")),
            }
        summary["compare"] = info
        from rapids_attn.rundir import shared_paths

        # the figures open the compared stores at the absolute paths the store keeps; the page names them as
        # summary.json does, relative to the run directory (the explain stage's summary holds it while it runs)
        return {"info": info, "g": g, "shown": shared_paths(info, summary.get("run_dir") or ".")}

    def figures(self, out_dir, state: dict | None) -> list[str]:
        if not state:
            return []
        from rapids_attn.explain import figures as F

        info, g = state["info"], state["g"]
        names = []
        heads = g[S.COMPARE_MAP_HEADS][:]
        layers = g[S.COMPARE_MAP_LAYERS][:]
        compared = info.get("compared", [])
        with_maps = [i for i, e in enumerate(compared) if e.get("maps")]
        for i in with_maps:
            label = compared[i]["label"]
            fig = F.new_figure(*F.grid_size(heads.shape[2], heads.shape[3], panels=2))
            for k, (m, title) in enumerate((("cosine", "1 - cosine"), ("jsd", "Jensen-Shannon divergence (nats)"))):
                ax = fig.add_subplot(1, 2, k + 1)
                v = heads[i, k]
                # 1 - cosine's lower end is 1 - the cosine's upper end
                mean, low = (1 - v[..., 0], 1 - v[..., 2]) if m == "cosine" else (v[..., 0], v[..., 1])
                im = ax.imshow(mean, cmap="viridis", aspect="auto")
                fig.colorbar(im, ax=ax, fraction=0.046)
                # marked: the heads whose interval lies wholly above the median head's mean change
                mark = low > np.nanmedian(mean)
                ys, xs = np.nonzero(mark)
                ax.scatter(xs, ys, s=10, c="white", edgecolors="black", linewidths=0.5)
                F.grid_axes(ax, range(v.shape[0]), range(v.shape[1]))
                ax.set_title(f"{title}: {info['job_model']} vs {label}", fontsize=8)
            names.append(F.save(fig, out_dir, f"compare_heads_{label}.png"))
        if with_maps:
            fig = F.new_figure(7.5, 3.2)
            for k, (m, title) in enumerate((("cosine", "cosine of the maps"), ("jsd", "Jensen-Shannon divergence"))):
                ax = fig.add_subplot(1, 2, k + 1)
                for i in with_maps:
                    v = layers[i, k]
                    x = np.arange(v.shape[0])
                    ax.errorbar(
                        x,
                        v[:, 0],
                        yerr=[v[:, 0] - v[:, 1], v[:, 2] - v[:, 0]],
                        marker="o",
                        capsize=3,
                        label=compared[i]["label"],
                    )
                ax.set_xlabel("layer")
                ax.set_title(f"{title} per layer ({int(info['level'] * 100)}% interval)", fontsize=8)
                ax.set_xticks(range(layers.shape[2]))
            ax.legend(fontsize=7)
            names.append(F.save(fig, out_dir, "compare_layers.png"))
        names += self._exemplars(out_dir, info, g, with_maps)
        floor = (info.get("floor") or {}).get("jsd")
        if floor:
            names.append(self._floor_figure(out_dir, floor))
        if info.get("trajectory"):
            names.append(self._trajectory_figure(out_dir, info["trajectory"]))
        return names

    def _trajectory_figure(self, out_dir, t: dict) -> str:
        """Each layer's divergence from the base and from the final model over the kept steps."""
        from rapids_attn.explain import figures as F

        fig = F.new_figure(8.0, 3.2)
        steps = t["steps"]
        for k, (what, title) in enumerate((("to_base", "from the base"), ("to_final", "from the final model"))):
            ax = fig.add_subplot(1, 2, k + 1)
            v = np.asarray([r[what]["layers"] for r in t["rows"]], np.float64)  # [steps, layers, 3]
            for layer in range(v.shape[1]):
                ax.plot(steps, v[:, layer, 0], marker="o", label=f"layer {layer}")
                ax.fill_between(steps, v[:, layer, 1], v[:, layer, 2], alpha=0.2)
            ax.set_xlabel("training step")
            ax.set_title(f"divergence {title}", fontsize=8)
        ax.legend(fontsize=6)
        return F.save(fig, out_dir, "compare_trajectory.png")

    def _floor_figure(self, out_dir, floor: dict) -> str:
        """Per layer, base-to-fine-tune change beside the seed-to-seed floor (and the shuffled control's change),
        with intervals; per head, the excess over the floor with the heads called changed marked."""
        from rapids_attn.explain import figures as F

        excess = np.asarray(floor["heads"]["excess"], np.float64)[..., 0]
        changed = np.asarray(floor["heads"]["changed"], bool)
        fig = F.new_figure(8.0, 3.2)
        ax = fig.add_subplot(1, 2, 1)
        x = np.arange(len(floor["layers"]))
        for k, (what, label) in enumerate((("change", "base vs fine-tunes"), ("floor", "fine-tune vs fine-tune"))):
            v = np.asarray([row[what] for row in floor["layers"]], np.float64)
            ax.errorbar(
                x + (k - 0.5) * 0.2,
                v[:, 0],
                yerr=[v[:, 0] - v[:, 1], v[:, 2] - v[:, 0]],
                fmt="o",
                capsize=3,
                label=label,
            )
        if floor.get("control"):
            ax.plot(x + 0.3, floor["control"]["layers"], "x", label="base vs shuffled labels")
        ax.set_xticks(x)
        ax.set_xlabel("layer")
        ax.set_title(f"divergence per layer ({int(floor['level'] * 100)}% interval, questions and seeds)", fontsize=8)
        ax.legend(fontsize=6)
        ax = fig.add_subplot(1, 2, 2)
        im = ax.imshow(
            excess, cmap="coolwarm", aspect="auto", vmin=-np.nanmax(np.abs(excess)), vmax=np.nanmax(np.abs(excess))
        )
        fig.colorbar(im, ax=ax, fraction=0.046)
        ys, xs = np.nonzero(changed)
        ax.scatter(xs, ys, s=10, c="white", edgecolors="black", linewidths=0.5)
        F.grid_axes(ax, range(excess.shape[0]), range(excess.shape[1]))
        ax.set_title(f"change minus floor; dots: changed (FDR {floor['fdr']})", fontsize=8)
        return F.save(fig, out_dir, "compare_floor.png")

    def _exemplars(self, out_dir, info: dict, g, with_maps: list[int]) -> list[str]:
        """The most-changed heads' maps in both models, side by side, for the compared example where the head's
        divergence is largest (from each store's thumbnails)."""
        import zarr

        from rapids_attn.explain import figures as F
        from rapids_attn.store.zarr_store import decode_thumbnails

        if S.THUMBNAILS not in g:
            return []
        out = []
        store_layers = [int(v) for v in g[S.LAYER][:]]
        store_heads = [int(v) for v in g[S.HEAD][:]]
        examples = g[S.COMPARE_EXAMPLE][:]
        for i in with_maps:
            entry = info["compared"][i]
            other = zarr.open_group(entry["store"], mode="r")
            rows = [r for r in entry.get("most_changed", []) if r["layer"] in store_layers and r["head"] in store_heads]
            rows = rows[:EXEMPLARS]
            if not rows or S.THUMBNAILS not in other:
                continue
            fig = F.new_figure(2.0 * len(rows), 4.2)
            for c, r in enumerate(rows):
                jsd = g[S.COMPARE_MAPS][i, :, r["layer"], r["head"], 1]
                e = int(examples[int(np.nanargmax(jsd))])
                li, hi = store_layers.index(r["layer"]), store_heads.index(r["head"])
                for k, (st, who) in enumerate(((g, info["job_model"]), (other, entry["label"]))):
                    ax = fig.add_subplot(2, len(rows), k * len(rows) + c + 1)
                    F.show_thumb(
                        ax, decode_thumbnails(st[S.THUMBNAILS][e, li, hi]), f"L{r['layer']}H{r['head']} {who}", 7
                    )
            out.append(F.save(fig, out_dir, f"compare_exemplars_{entry['label']}.png"))
        return out

    def html(self, state: dict | None, figures: list[str]) -> str:
        if not state:
            return ""
        info = state.get("shown") or state["info"]
        parts = [
            f"""
<section id="compare"><h2>What changed between models</h2>
<p class="note">The job's model ({esc(info["job_model"])}) against each compared model over the same inputs: per
head, the cosine of the two flattened maps (Kovaleva et al. 2019; 1: the same map) and the mean Jensen-Shannon
divergence of their rows (nats; 0: the same map), over {num(info["examples_compared"])} examples, with
{int(info["level"] * 100)}% bootstrap intervals over examples; every per-map statistic and detector as the job's
model's value minus the compared model's, over {num(info["examples"])} examples; and one clustering of all models'
maps ({num(info.get("n_clusters"))} clusters), so a cluster means the same in every model. In the heatmaps, a dot
marks a head whose interval lies wholly above the median head's change.</p>"""
        ]
        floor = (info.get("floor") or {}).get("jsd")
        if floor:
            parts.append(floor_html(floor))
        if info.get("trajectory"):
            parts.append(trajectory_html(info["trajectory"]))
        for entry in info.get("compared", []):
            control = " (a control: another fine-tune of this job)" if entry.get("control") else ""
            parts.append(f"<h3>{esc(info['job_model'])} vs {esc(entry['label'])} ({esc(entry['name'])}){control}</h3>")
            if not entry.get("maps"):
                parts.append(f"<p><b>Statistics only:</b> {esc(entry.get('maps_refused'))}</p>")
            theirs = entry.get("heads")  # compare.heads: the heads stage ran on the compared model too
            rows = []
            for r in entry.get("most_changed", []):
                stats = "; ".join(
                    f"{esc(s['stat'])} {num(s['change'])} [{num(s['ci'][0])}, {num(s['ci'][1])}]"
                    for s in r.get("stats", [])
                )
                rows.append(
                    f"<tr><td>L{r['layer']}H{r['head']}</td>"
                    f"<td class=n>{num(r['cosine'][0])} [{num(r['cosine'][1])}, {num(r['cosine'][2])}]</td>"
                    f"<td class=n>{num(r['jsd'][0])} [{num(r['jsd'][1])}, {num(r['jsd'][2])}]</td>"
                    f"<td class=n>{num(r.get('cluster_stay'))}</td><td class=n>{num(r.get('ablation_cost'))}</td>"
                    + (f"<td class=n>{num(r.get('compared_ablation_cost'))}</td>" if theirs else "")
                    + f"<td>{stats or 'none beyond chance'}</td></tr>"
                )
            if rows:
                cost_heads = f"<th class=n>ablation cost, {esc(info['job_model'])}</th>" + (
                    f"<th class=n>ablation cost, {esc(entry['label'])}</th>" if theirs else ""
                )
                both = (
                    f" and in {esc(entry['label'])} ({esc(theirs.get('metric'))} over the same "
                    f"{num(theirs.get('examples'))} examples, whole model {num(theirs.get('base'))})"
                    if theirs
                    else ""
                )
                parts.append(
                    "<p>The most-changed heads (by divergence), with the share of examples whose map stays in its "
                    "cluster, the head's single-ablation cost in the job's model (where the heads stage ran)"
                    f"{both}, and its largest statistic changes whose interval excludes 0.</p><table><thead><tr>"
                    "<th>head</th><th class=n>cosine [CI]</th><th class=n>divergence [CI]</th>"
                    f"<th class=n>stays in cluster</th>{cost_heads}<th>largest changes</th></tr></thead>"
                    f"<tbody>{''.join(rows)}</tbody></table>"
                )
            t = entry.get("transitions") or {}
            if t.get("counts"):
                head = "".join(f"<th class=n>{esc(c)}</th>" for c in t["clusters"])
                body = "".join(
                    f"<tr><td>{esc(c)}</td>" + "".join(f"<td class=n>{num(v)}</td>" for v in row) + "</tr>"
                    for c, row in zip(t["clusters"], t["counts"], strict=True)
                )
                parts.append(
                    f"<p>Cluster transitions: maps of the job's model (rows) and of {esc(entry['label'])} (columns) "
                    f"for the same example and head; {num(t['stay'])} of the maps stay in their cluster.</p>"
                    f"<table><thead><tr><th>cluster</th>{head}</tr></thead><tbody>{body}</tbody></table>"
                )
        parts += [img(f, "what changed between models") for f in figures]
        return "".join(parts) + "</section>"


def _ci(v) -> str:
    return f"{num(v[0])} [{num(v[1])}, {num(v[2])}]"


def floor_html(floor: dict) -> str:
    """The noise-floor subsection: per layer, change, floor and excess; the heads called changed."""
    rows = "".join(
        f"<tr><td>{r['layer']}</td><td class=n>{_ci(r['change'])}</td><td class=n>{_ci(r['floor'])}</td>"
        f"<td class=n>{_ci(r['excess'])}</td><td class=n>{num(r['p'])}</td></tr>"
        for r in floor["layers"]
    )
    ctrl = floor.get("control")
    heads = "".join(
        f"<tr><td>L{r['layer']}H{r['head']}</td><td class=n>{_ci(r['change'])}</td><td class=n>{_ci(r['floor'])}</td>"
        f"<td class=n>{_ci(r['excess'])}</td><td class=n>{num(r['p_adjusted'])}</td>"
        + (f"<td>{'yes' if ctrl['task_specific'][r['layer']][r['head']] else 'no'}</td>" if ctrl else "")
        + "</tr>"
        for r in floor["changed"]
    )
    agree = floor.get("agreement") or {}
    return f"""
<h3>Change against training noise</h3>
<p class="note">{len(floor["fine_tunes"])} fine-tunes of this job ({esc(", ".join(floor["fine_tunes"]))}: the
same data and schedule, other training seeds). <b>Change</b>: base against each fine-tune; <b>floor</b>: each
fine-tune against each other; <b>excess</b>: change minus floor. Mean Jensen-Shannon divergence over
{num(floor["examples"])} examples, {int(floor["level"] * 100)}% intervals from a bootstrap over the questions, the
fine-tunes and their pairs ({num(floor["resamples"])} resamples; with three seeds the seed level is coarse). A head
is called changed where its excess is above 0 with the false-discovery rate across its
{num(floor["n_heads"])} heads at {num(floor["fdr"])} (Benjamini-Hochberg).</p>
<p><b>{num(floor["n_changed"])} of {num(floor["n_heads"])} heads changed beyond the floor</b>;
{num(floor["n_within_floor"])} change no more than two seeds differ (their excess interval reaches 0). The
fine-tunes rank heads by change alike at Spearman {num(agree.get("spearman"))}, and two fine-tunes' top
{num(agree.get("top"))} share {num(agree.get("top_shared"))} of their heads.{
        f" Against training on shuffled labels ({esc(ctrl['label'])}), {num(ctrl['n_task_specific'])} of the changed "
        "heads also change more than that control does."
        if ctrl
        else ""
    }</p>
{causal_html(floor.get("causal"))}
<table><thead><tr><th>layer</th><th class=n>change [CI]</th><th class=n>floor [CI]</th><th class=n>excess [CI]</th>
<th class=n>p (excess &gt; 0)</th></tr></thead><tbody>{rows}</tbody></table>
{
        "<table><thead><tr><th>head called changed</th><th class=n>change [CI]</th><th class=n>floor [CI]</th>"
        "<th class=n>excess [CI]</th><th class=n>adjusted p</th>"
        + ("<th>beyond shuffled labels</th>" if ctrl else "")
        + f"</tr></thead><tbody>{heads}</tbody></table>"
        if heads
        else ""
    }"""


def trajectory_html(t: dict) -> str:
    """Per layer, the divergence from the base at each kept step; and when the heads' changes appear."""
    steps = t["steps"]
    head = "".join(f"<th class=n>step {s}</th>" for s in steps)
    rows = "".join(
        f"<tr><td>{layer}</td>"
        + "".join(f"<td class=n>{_ci(r['to_base']['layers'][layer])}</td>" for r in t["rows"])
        + f"<td class=n>{num(float(np.mean(t['final'][layer])))}</td></tr>"
        for layer in range(len(t["final"]))
    )
    half = np.asarray(t["half_change_step"])
    counts = ", ".join(f"{int((half == s).sum())} by step {s}" for s in steps)
    return f"""
<h3>When the changes appear</h3>
<p class="note">The fine-tune's weights at each kept step against the base (mean Jensen-Shannon divergence over the
compared examples, {esc(t.get("measure"))}; intervals over examples). A head's change appears at the first step whose
divergence from the base reaches half of the final model's: {esc(counts)}; {int((half < 0).sum())} after the last
kept step.</p>
<table><thead><tr><th>layer</th>{head}<th class=n>final</th></tr></thead><tbody>{rows}</tbody></table>"""


def causal_html(c: dict | None) -> str:
    """Whether the changed heads are the ones whose ablation costs the fine-tune (:func:`causal_check`)."""
    if not c or c.get("spearman") is None:
        return ""
    diff = (
        f" The heads called changed cost {num(c['mean_cost_changed'])} on average when ablated alone, the others "
        f"{num(c['mean_cost_others'])} (permutation p = {num(c['p'])})."
        if "difference" in c
        else ""
    )
    costly = (
        f" {num(c['changed_costly'])} of the {num(c['changed'])} changed heads and {num(c['others_costly'])} of the "
        "others cost beyond chance on their own."
        if "changed_costly" in c
        else ""
    )
    return (
        f"<p><b>Do the changed heads matter?</b> Single-head ablation of the fine-tune ({esc(c.get('metric'))}, "
        f"scored by {esc(c.get('headline'))} over {num(c.get('examples'))} examples): Spearman correlation of a "
        f"head's excess over the floor with its ablation cost {num(c['spearman'])} over {num(c['heads'])} heads."
        f"{diff}{costly}</p>"
    )
