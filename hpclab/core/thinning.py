"""A bounded history: the newest items exact, the older ones thinned by a doubling stride.

Live telemetry arrives as rows for as long as a run lasts (hours: 10⁵ rows and more), but a
client only ever needs the recent rows exactly (the progress bar, the stop grace, the newest
epochs) and a picture of the older ones (a chart ≤ ~2,000 points wide shows no more). So
:class:`Thinned` keeps the last ``recent`` items as they came and, of the older ones, every
``stride``-th by arrival number, doubling the stride (and halving what it holds) whenever more
than ``older`` would be kept: memory and the cost of reading it all stay bounded, each append
is O(1) amortised, and the points kept are spread evenly over the run (what largest-triangle
downsampling would refine, Steinarsson 2013, "Downsampling Time Series for Visual
Representation"; an even stride keeps it O(1) and deterministic). The full record is on disk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any


class Thinned:
    """At most ``recent + older`` items: the newest ``recent`` exact, older ones every stride-th."""

    def __init__(self, recent: int = 1000, older: int = 1000):
        if recent < 1 or older < 2:
            raise ValueError(
                f"Thinned needs recent >= 1 and older >= 2; you passed recent={recent}, "
                f"older={older}."
            )
        self.recent_cap, self.older_cap = int(recent), int(older)
        self._recent: deque[tuple[int, Any]] = deque()
        self._older: list[tuple[int, Any]] = []
        self.stride = 1
        self.count = 0  # items ever appended

    def append(self, item: Any) -> None:
        self._recent.append((self.count, item))
        self.count += 1
        if len(self._recent) > self.recent_cap:
            n, old = self._recent.popleft()
            if n % self.stride == 0:
                self._older.append((n, old))
                if len(self._older) > self.older_cap:
                    self.stride *= 2
                    self._older = [(i, x) for i, x in self._older if i % self.stride == 0]

    def extend(self, items: Iterable[Any]) -> None:
        for item in items:
            self.append(item)

    @property
    def complete(self) -> bool:
        """Every item ever appended is still held (nothing thinned yet)."""
        return len(self) == self.count

    def __len__(self) -> int:
        return len(self._older) + len(self._recent)

    def items(self) -> list:
        """What is held, oldest first."""
        return [x for _, x in self._older] + [x for _, x in self._recent]

    def last(self) -> Any:
        return self._recent[-1][1] if self._recent else None

    def newest(self, keep: Any) -> list:
        """The newest exact items, from the end back while ``keep(item)`` holds, oldest first:
        O(what is returned)."""
        out = []
        for _, item in reversed(self._recent):
            if not keep(item):
                break
            out.append(item)
        return out[::-1]

    def since(self, n: int) -> list:
        """The items appended as number ``n`` or later that are held exactly (the newest
        ``recent``), oldest first: O(what is returned)."""
        out = []
        for i, item in reversed(self._recent):
            if i < n:
                break
            out.append(item)
        return out[::-1]

    def replace(self, items: Iterable[Any]) -> None:
        """Start again from ``items`` (as if appended one by one to an empty history)."""
        self._recent.clear()
        self._older, self.stride, self.count = [], 1, 0
        self.extend(items)


__all__ = ["Thinned"]
