"""`canary demo --quick --no-live [--router nginx]`, end to end, in this process: our
sidecar, or a real nginx steered by its router agent, in front of the upstreams."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from controlplane.demo.run import EXIT_OK, Demo, DemoOptions


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("router", ["sidecar", "nginx"])
async def test_quick_demo_promotes_the_healthy_canary_and_rolls_back_the_degraded(
    router: str,
) -> None:
    out = io.StringIO()
    demo = Demo(
        DemoOptions(quick=True, live=False, api_listen="127.0.0.1:0", router=router),
        Console(file=out, width=120),
    )
    code = await demo.run()
    text = out.getvalue()
    assert code == EXIT_OK, text
    healthy, degraded = demo.results
    assert healthy.progress.state == "promoted", text
    assert degraded.progress.state == "rolled_back", text
    for result in demo.results:
        assert result.load.sidecar_failed == 0, text
        assert result.samples_sent == result.samples_counted > 0, text
    # the degraded canary was caught and cut off, and the events say so
    assert degraded.progress.tripped_at is not None and degraded.progress.cut_at is not None
    kinds = [e.kind for e in degraded.progress.events]
    assert "tripped" in kinds and "half_open" in kinds and "rolled_back" in kinds
    assert "canary demo: summary" in text
