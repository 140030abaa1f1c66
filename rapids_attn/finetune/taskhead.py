"""The model a fine-tune starts from, loaded with its task head newly made, in one line of ours (issue 47).

``from_pretrained`` of a task class (``AutoModelForQuestionAnswering``, ``AutoModelForSequenceClassification``) on a
checkpoint without that head logs transformers' load report: a table of the MISSING and UNEXPECTED keys with two
notes, about ten lines, as one warning of the ``transformers.modeling_utils`` logger (transformers 5,
``transformers.utils.loading_report.log_state_dict_report``). A new task head is what fine-tuning expects, so that
report is held back (a filter on that logger while the model loads; every other message goes through) and
:func:`load_for_task` says what happened in one line, from the loading info ``output_loading_info=True`` returns.
What is news stays visible: weights of the model itself that the checkpoint lacks (one warning line naming them),
and the whole report where loading fails after it (a shape mismatch, a conversion error: transformers' error then
points at "the above report").
"""

from __future__ import annotations

import logging
import sys

#: the logger transformers' load report goes to, and the words of its first line
REPORT_LOGGER = "transformers.modeling_utils"
REPORT_TITLE = "LOAD REPORT"
#: weight names shown in a line before "and N more"
SHOWN = 3


class _HoldReport(logging.Filter):
    """Keeps the load report back (in ``held``), lets every other record through."""

    def __init__(self):
        super().__init__()
        self.held: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot format is not the report: let logging deal with it
            return True
        if REPORT_TITLE in message.partition("\n")[0]:
            self.held.append(message)
            return False
        return True


def _names(keys, shown: int = SHOWN) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more


def _modules(keys) -> list[str]:
    """The modules the weights belong to (``qa_outputs.weight`` -> ``qa_outputs``), sorted."""
    return sorted({k.rpartition(".")[0] or k for k in keys})


def load_note(model, info: dict, source: str) -> tuple[str | None, str | None]:
    """(our line about the load, or None where nothing was new; a warning, or None) from ``from_pretrained``'s
    loading info. Missing weights outside the base model (``model.base_model_prefix``) are the new task head; missing
    weights of the base model itself are news; checkpoint weights the task model does not use (a pooler, the
    checkpoint's own head) are named in the line."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    has_base = bool(prefix) and getattr(model, prefix, None) is not None
    missing = set(info.get("missing_keys") or ())
    lost = {k for k in missing if k.startswith(prefix + ".")} if has_base else set(missing)
    head = missing - lost
    unused = set(info.get("unexpected_keys") or ())
    mismatched = {k[0] for k in info.get("mismatched_keys") or ()}
    parts = []
    if head:
        parts.append(f"new task head {_names(_modules(head))} (random weights, trained now)")
    if unused:
        parts.append(f"the checkpoint's {_names(_modules(unused))} not used by the task's model")
    line = f"rapids_attn: finetune: {'; '.join(parts)}" if parts else None
    news = []
    if lost:
        news.append(
            f"{len(lost)} weight(s) of the model itself are not in {source} and start from random weights "
            f"({_names(lost)}); is model.name the model meant?"
        )
    if mismatched:
        news.append(
            f"{len(mismatched)} weight(s) of {source} had another shape and start from random weights "
            f"({_names(mismatched)})"
        )
    warning = "warning: finetune: " + "; ".join(news) if news else None
    return line, warning


def load_for_task(auto_class, source: str, **kwargs):
    """``auto_class.from_pretrained(source, **kwargs)`` with transformers' load report replaced by one line on stderr
    (and a warning line where weights of the model itself are missing); where the load fails, the held report is
    printed before the error goes on."""
    logger = logging.getLogger(REPORT_LOGGER)
    hold = _HoldReport()
    logger.addFilter(hold)
    try:
        model, info = auto_class.from_pretrained(source, output_loading_info=True, **kwargs)
    except BaseException:
        for message in hold.held:  # the details the error refers to
            print(message, file=sys.stderr)
        raise
    finally:
        logger.removeFilter(hold)
    line, warning = load_note(model, info, str(source))
    for text in (line, warning):
        if text:
            print(text, file=sys.stderr, flush=True)
    return model
