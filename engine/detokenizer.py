"""Incremental detokenization and stop strings that may span tokens.

Text is emitted only once the decoded tail is stable (no trailing U+FFFD from a partial
UTF-8 sequence). Offsets, as in the usual incremental scheme::

    ids:   [ ... | prefix_offset ... read_offset | new ... ]
    new text = decode(ids[prefix_offset:]) minus decode(ids[prefix_offset:read_offset])
"""
from __future__ import annotations


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop_strings: list[str], skip_special_tokens: bool = True,
                 include_stop_str_in_output: bool = False) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        self.skip_special_tokens = skip_special_tokens
        self.include_stop = include_stop_str_in_output
        self.ids: list[int] = []
        self.text = ""
        self._prefix_offset = 0
        self._read_offset = 0
        self._max_stop = max((len(s) for s in stop_strings), default=0)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str | None:
        """Add one token. Returns the stop string if the text now contains one (text is then
        cut at it), else None."""
        self.ids.append(token_id)
        if self.tokenizer is None:
            return None
        before = self._decode(self.ids[self._prefix_offset : self._read_offset])
        after = self._decode(self.ids[self._prefix_offset :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return None
        delta = after[len(before):]
        self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        search_from = max(0, len(self.text) - self._max_stop + 1)
        self.text += delta
        hits = [(at, stop) for stop in self.stop_strings if (at := self.text.find(stop, search_from)) >= 0]
        if not hits:
            return None
        at, stop = min(hits)  # the earliest match wins
        self.text = self.text[: at + len(stop)] if self.include_stop else self.text[:at]
        return stop

    def flush(self) -> None:
        """At the end of a request: decode any held-back bytes (a final partial character)."""
        if self.tokenizer is None:
            return
        tail = self._decode(self.ids[self._prefix_offset :])
        before = self._decode(self.ids[self._prefix_offset : self._read_offset])
        if len(tail) > len(before):
            self.text += tail[len(before):]
            self._prefix_offset = self._read_offset = len(self.ids)
