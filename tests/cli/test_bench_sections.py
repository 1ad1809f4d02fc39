"""`canary bench NAME --only SECTIONS`: which sections run, and one-line refusals."""

from __future__ import annotations

import pytest

from controlplane.benchmarks.sidecar_streams import SECTIONS, parse_only
from controlplane.cli.main import main


def test_only_names_the_sidecar_streaming_sections_in_order() -> None:
    assert parse_only("sse, websocket") == ["sse", "websocket"]
    assert parse_only(",".join(SECTIONS)) == list(SECTIONS)


@pytest.mark.parametrize("only", ["", "http", "websocket,nope"])
def test_only_refuses_other_names(only: str) -> None:
    with pytest.raises(ValueError, match="--only takes some of websocket, sse, large_bodies"):
        parse_only(only)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["bench", "round", "--only", "sse"], "canary bench: round has no sections"),
        (["bench", "collector", "--only", "sse"], "canary bench: collector: the section to pick"),
        (["bench", "collector", "--workers", "2"], "canary bench: collector has no --workers"),
        (["bench", "sidecar", "--only", "http"], "canary bench: --only takes some of"),
    ],
)
def test_a_bad_only_is_one_line_and_exit_2(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    _, err = capsys.readouterr()
    assert err.startswith(expected), err
    assert err.count("\n") == 1, err
