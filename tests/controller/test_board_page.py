"""The board's /metrics page: written once per change of the board, by a round's end
while anyone scrapes, and never older than the last round when a round is under way."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.controller.board_page import BoardPage
from controlplane.controller.experiment_metrics import ExperimentBoard, board_exposition
from controlplane.experiments.lifecycle import ExperimentState
from controlplane.kernel.clock import FakeClock
from tests.controller.test_experiment_metrics import record
from tests.decision.test_rollout import tripped


def page_of(board: ExperimentBoard) -> tuple[BoardPage, FakeClock]:
    clock = FakeClock()
    return BoardPage(board, clock=clock.monotonic, wanted_for_sec=60.0), clock


def test_an_unchanged_board_is_written_once_for_any_number_of_scrapes() -> None:
    board = ExperimentBoard()
    board.observe(record(1), tripped().evidence, 0.0)
    page, _ = page_of(board)
    texts = {page.text() for _ in range(5)}
    assert texts == {board_exposition(board)}
    assert page.written_by_scrapes == 1


def test_a_change_outside_a_round_is_on_the_next_scrape() -> None:
    board = ExperimentBoard()
    page, _ = page_of(board)
    empty = page.text()
    board.observe(record(1), tripped().evidence, 0.0)
    assert page.text() == board_exposition(board) != empty
    board.finish(record(1, state=ExperimentState.ROLLED_BACK), 1.0)
    assert 'state="rolled_back"' in page.text()
    board.drop("1")
    assert 'experiment="1"' not in page.text()
    board.observe(record(2), None, 2.0)
    board.clear()
    assert page.text() == board_exposition(board)
    assert 'experiment="2"' not in page.text()


def test_during_a_round_a_scrape_gets_the_page_the_last_round_left() -> None:
    board = ExperimentBoard()
    board.observe(record(1), None, 0.0)
    page, _ = page_of(board)
    before = page.text()
    page.round_began()
    board.observe(record(2), tripped().evidence, 1.0)  # the round's looks
    assert page.text() == before  # not a page of half a round
    page.round_ended()
    # someone scrapes: the round's end wrote its page, and a scrape reads it as it is
    assert page.written_by_rounds == 1
    assert page.text() == board_exposition(board) != before
    assert page.written_by_scrapes == 1


def test_nobody_scraping_no_round_writes_the_page() -> None:
    board = ExperimentBoard()
    page, clock = page_of(board)
    page.text()  # one scrape, then none
    clock.advance(61.0)
    for i in range(3):
        page.round_began()
        board.observe(record(i + 1), None, float(i))
        page.round_ended()
    assert page.written_by_rounds == 0
    assert page.text() == board_exposition(board)  # the next scrape writes it
    assert page.written_by_scrapes == 2


def test_a_round_that_changed_nothing_writes_nothing() -> None:
    board = ExperimentBoard()
    board.observe(record(1), None, 0.0)
    page, _ = page_of(board)
    page.text()
    page.round_began()
    page.round_ended()
    assert page.written_by_rounds == 0


@settings(max_examples=60)
@given(st.lists(st.tuples(st.sampled_from(["observe", "finish", "drop", "clear", "expire",
                                           "scrape", "round"]),
                          st.integers(1, 4)), max_size=30))  # fmt: skip
def test_out_of_a_round_every_scrape_is_the_board_as_it_is(
    steps: list[tuple[str, int]],
) -> None:
    board = ExperimentBoard(finished_ttl_sec=5.0)
    page, clock = page_of(board)
    now = 0.0
    for action, n in steps:
        now += 1.0
        clock.advance(1.0)
        if action == "observe":
            board.observe(record(n), tripped().evidence if n % 2 else None, now)
        elif action == "finish":
            board.finish(replace(record(n), state=ExperimentState.PROMOTED), now)
        elif action == "drop":
            board.drop(str(n))
        elif action == "clear":
            board.clear()
        elif action == "expire":
            board.expire(now + 10.0 * n)
        elif action == "round":
            page.round_began()
            board.observe(record(n), None, now)
            page.round_ended()
        else:
            assert page.text() == board_exposition(board)
    assert page.text() == board_exposition(board)
