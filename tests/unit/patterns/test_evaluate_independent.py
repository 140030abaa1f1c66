"""The generalisation evaluation's own arithmetic (tools/pattern_cnn/evaluate_independent.py): the
"meets its type's rule" column, the rule-abiding ceiling and the labels' ARI, on hand-made inputs."""

import numpy as np

from rapids_attn.patterns.generator import PATTERN_TYPES
from tools.pattern_cnn.evaluate_independent import label_ari, label_tables, rule_ceiling


def _rules(truth, meets_own):
    """[N, 10] rule table where each map meets only its own type's rule, and only if meets_own."""
    r = np.zeros((len(truth), len(PATTERN_TYPES)), bool)
    for i, (t, ok) in enumerate(zip(truth, meets_own)):
        if t in PATTERN_TYPES:
            r[i, PATTERN_TYPES.index(t)] = ok
    return r


def test_ceiling_keeps_the_family_only_where_its_rule_holds_and_unseen_families_are_other():
    truth = np.array(["prev", "prev", "sep", "columns"])
    rules = _rules(truth, [True, False, True, False])
    rules[3, PATTERN_TYPES.index("band")] = True  # an unseen map meeting some rule is still other
    known = np.isin(truth, PATTERN_TYPES)
    assert rule_ceiling(truth, rules, known).tolist() == ["prev", "other", "sep", "other"]


def test_label_ari_is_one_for_a_relabelling_and_below_one_for_merged_families():
    truth = np.array(["a", "a", "b", "b", "c", "c"])
    assert label_ari(np.array(["x", "x", "y", "y", "z", "z"]), truth) == 1.0
    assert label_ari(np.array(["x", "x", "x", "x", "z", "z"]), truth) < 1.0
    # the subset drops the maps it excludes
    assert label_ari(np.array(["x", "x", "y", "y", "q", "r"]), truth, truth != "c") == 1.0


def test_label_table_reports_the_share_of_maps_meeting_their_types_rule():
    truth = np.array(["self"] * 4 + ["band"] * 2 + ["two_back"])
    names = np.array(["self", "self", "other", "other", "band", "band", "band"])
    rules = _rules(truth, [True, True, True, False, True, True, False])
    text = label_tables(truth, names, known=("self", "band"), unseen=("two_back",), rules=rules)
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in text.splitlines()}
    assert rows["self"][2] == "0.500" and rows["self"][-1].strip(" |") == "75.0%"
    assert rows["band"][-1].strip(" |") == "100.0%"
    assert rows["band"][5].startswith("0.667 (3)")  # the unseen two_back map named band costs precision
    assert rows["all known"][-1].strip(" |") == "83.3%"
