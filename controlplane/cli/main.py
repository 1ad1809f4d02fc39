"""`canary` — the one console script (DESIGN §10).

Each command group lives in its own module with a `register(app)` function and
imports its heavy dependencies inside the commands, so `canary --help` stays fast.
"""

from __future__ import annotations

import typer

from controlplane.cli import bench, collector, demo, experiments, rules, server, sidecar

app = typer.Typer(
    name="canary",
    help="Canary releases and A/B experiments with circuit breaking.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for module in (bench, collector, demo, experiments, rules, server, sidecar):
    module.register(app)


if __name__ == "__main__":
    app()
