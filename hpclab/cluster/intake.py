"""The client's side of rank 0's telemetry (:mod:`hpclab.rank.publisher`): rows taken in order.

A live message carries the rows made since a few messages back, each table with the position of
its first row. :class:`Intake` takes one table (history rows or epoch rows) in that order: from
the message while it reaches back to the first position not taken yet, and otherwise (the client
was away: a paused notebook, a slow callback) from rank 0's log in the run folder, which holds
every row; a log whose newest lines are not visible yet (a network file system's attribute
cache) is read again at the next poll, and once more at the end. Every byte of the log is read
at most once, so the cost is O(new rows) however long the run.
"""

from __future__ import annotations

import json
from pathlib import Path


class Intake:
    """One table of rank 0's telemetry, by position; ``key`` (``step`` or ``epoch``) must grow:
    a row whose key does not (rank 0 rolled back and made it again) is dropped, as before."""

    def __init__(self, log: Path | str, key: str):
        self.log, self.key = Path(log), key
        self.count = 0  # positions taken
        self.from_log = 0  # of which read from the log (the client was behind)
        self._offset = 0  # bytes of the log read
        self._read = 0  # positions the log lines read so far cover
        self.last = None  # the newest key taken

    def take(self, at: int | None, rows: list[dict]) -> list[dict]:
        """The new rows of a message whose first row is at position ``at``, in order (those it
        does not reach back to from the log first); ``at`` None: rows newer by key only."""
        if at is None:
            return self._newer(rows)
        got = self._from_log() if at > self.count else []
        if at <= self.count:
            got += rows[self.count - at :]
            self.count = max(self.count, at + len(rows))
        return self._newer(got)

    def finish(self) -> list[dict]:
        """After the ranks ended: whatever the log holds that was not taken."""
        return self._newer(self._from_log())

    def _from_log(self) -> list[dict]:
        try:
            with open(self.log, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:  # not there (yet): the next poll, or the end, reads it again
            return []
        end = data.rfind(b"\n") + 1  # whole lines only: a torn last one is read next time
        self._offset += end
        out = []
        for line in data[:end].split(b"\n")[:-1]:
            if self._read >= self.count:
                out.append(json.loads(line))
                self.count = self._read + 1
                self.from_log += 1
            self._read += 1
        return out

    def _newer(self, rows: list[dict]) -> list[dict]:
        out = []
        for row in rows:
            if self.last is None or row[self.key] > self.last:
                out.append(row)
                self.last = row[self.key]
        return out


__all__ = ["Intake"]
