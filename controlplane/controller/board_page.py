"""The leader's experiment board as /metrics text, written once per round, not per scrape.

At N = 1,000 the board is ~17,000 lines (1.3 MB) and `board_exposition` takes ~18 ms
of CPU. Written in the admin thread at every scrape, that is 18 ms a scrape taken from
the rounds (the thread shares the GIL with them), and a scrape's answer waits for as
many GIL turns as the text takes to write. Instead:

- a scrape answers with the page written last if the board has not changed since
  (`ExperimentBoard.version`), or if a round is under way: the page the last round
  left, at most one round old; the rounds change the board at every look, so a page
  written in the middle of one would be no truer;
- a round's end writes the page on the loop, if the board changed and a scrape came
  within `wanted_for_sec` (nobody scraping, nothing is written);
- otherwise (the board changed outside a round, or no page was written yet) the
  scrape writes it, as before.

Scrapes come from the admin thread, rounds run on the loop: the page and the version
it was written at are one tuple, replaced whole, so either thread reads a matching pair.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.controller.experiment_metrics import ExperimentBoard, board_exposition

WANTED_FOR_SEC = 300.0  # well past any scrape interval (Prometheus' default is 60 s)


@dataclass
class BoardPage:
    board: ExperimentBoard
    clock: Callable[[], float] = time.monotonic
    wanted_for_sec: float = WANTED_FOR_SEC
    # pages written, by whom: a scrape, or a round's end (for tests and benchmarks)
    written_by_scrapes: int = 0
    written_by_rounds: int = 0
    _page: tuple[str, int] | None = None
    _asked_at: float | None = None
    _in_round: bool = False

    def text(self) -> str:
        """The page for a scrape (any thread)."""
        self._asked_at = self.clock()
        page = self._page
        if page is not None and (self._in_round or page[1] == self.board.version):
            return page[0]
        self.written_by_scrapes += 1
        return self._write()

    def round_began(self) -> None:
        self._in_round = True

    def round_ended(self) -> None:
        """On the loop, after a round: the page it left, if anyone is scraping."""
        self._in_round = False
        page, asked = self._page, self._asked_at
        if asked is None or self.clock() - asked > self.wanted_for_sec:
            return
        if page is None or page[1] != self.board.version:
            self.written_by_rounds += 1
            self._write()

    def _write(self) -> str:
        version = self.board.version  # before: a change while writing leaves it stale
        text = board_exposition(self.board)
        self._page = (text, version)
        return text
