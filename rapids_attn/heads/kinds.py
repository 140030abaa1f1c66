"""What head a model has (question answering, causal or masked LM, sequence or token classifier, or a bare
encoder), from a loaded model's class or a checkpoint config's ``architectures``, and the task metric that
``heads.metric: auto`` picks for it."""

from __future__ import annotations

from rapids_attn.errors import JobConfigError

# head kind -> (transformers' Auto mapping that lists its classes, class-name endings for unlisted ones)
_KINDS = {
    "qa": ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", ("ForQuestionAnswering",)),
    "masked-lm": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", ("ForMaskedLM",)),
    "causal-lm": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", ("ForCausalLM", "LMHeadModel")),
    "seq-cls": ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", ("ForSequenceClassification",)),
    "token-cls": ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", ("ForTokenClassification",)),
    "encoder": ("MODEL_MAPPING_NAMES", ("Model",)),
}


def head_kind(model_or_config) -> tuple[str, str]:
    """(kind, class name): a loaded model by its class, a config by the checkpoint's ``architectures``."""
    from transformers.models.auto import modeling_auto

    config = getattr(model_or_config, "config", model_or_config)
    if hasattr(model_or_config, "config"):
        name = type(model_or_config).__name__
    else:
        name = (getattr(config, "architectures", None) or [""])[0]
    if not name:
        return "unknown", ""
    for kind, (mapping, _) in _KINDS.items():
        values = getattr(modeling_auto, mapping, {}).values()
        if any(name == v or (isinstance(v, tuple) and name in v) for v in values):
            return kind, name
    if name.endswith("ForPreTraining") and config.model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "masked-lm", name
    for kind, (_, endings) in _KINDS.items():
        if name.endswith(endings):
            return kind, name
    return "unknown", name


def metric_for_kind(kind: str, data_format: str | None) -> str | None:
    if kind == "encoder":
        return "retrieval" if data_format in (None, "squad") else None
    return {"qa": "squad", "causal-lm": "lm", "masked-lm": "lm", "seq-cls": "accuracy"}.get(kind)


def auto_metric(model_config, data_format: str | None) -> str:
    """``heads.metric: auto``: QA head -> squad; causal/masked LM head -> lm; sequence classifier -> accuracy;
    a bare encoder (BertModel, sentence-transformers like MiniLM) on SQuAD -> retrieval."""
    kind, cls = head_kind(model_config)
    name = metric_for_kind(kind, data_format or "auto")
    if name is None:
        raise JobConfigError(
            f"heads.metric: auto finds no task metric for a {cls or 'model whose config names no architecture'} "
            f"on {data_format} data; set heads.metric to squad, lm, retrieval or accuracy"
        )
    return name
