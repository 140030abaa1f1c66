"""The one record type that flows from readers into extraction."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    """One input to the model.

    id:        stable identifier from the dataset (SQuAD question id, a JSONL field, or the line number).
    text:      the first (or only) text segment.
    text_pair: the second segment of a text pair (SQuAD: the context), or None.
    group:     a grouping label used when explaining clusters (SQuAD: the article title), or "".
    label:     a class label (SQuAD: "answerable" / "impossible"), or "".
    answers:   the gold answer texts (SQuAD: every ``answers[*].text``, for the official max over
               references; empty for an unanswerable question), or ().
    answer_starts: where each answer starts in ``text_pair`` (SQuAD: ``answers[*].answer_start``, characters;
               what fine-tuning trains on), or () where the file gives none.
    """

    id: str
    text: str
    text_pair: str | None = None
    group: str = ""
    label: str = ""
    answers: tuple[str, ...] = ()
    answer_starts: tuple[int, ...] = ()

    def answer_span(self) -> tuple[int, int] | None:
        """Where the gold answer lies in ``text_pair``: (start, end) in characters, or None (no answer, no second
        segment, or no answer in it). The file's ``answer_start`` where it gives one and the first answer's text is
        there (SQuAD: an answer word can occur earlier in the context than the marked one); else the first
        occurrence of the first answer found in it."""
        if not self.answers or not self.text_pair:
            return None
        first = self.answers[0]
        if self.answer_starts and first:
            start = int(self.answer_starts[0])
            if self.text_pair[start : start + len(first)] == first:
                return start, start + len(first)
        for answer in self.answers:
            start = self.text_pair.find(answer) if answer else -1
            if start >= 0:
                return start, start + len(answer)
        return None
