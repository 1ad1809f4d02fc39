"""`canary demo`: the whole story in one command, on the embedded backends."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo_command(
        real: Annotated[
            bool,
            typer.Option(
                "--real",
                help="use the configured CANARY_* etcd, Redis and database instead of the "
                "embedded ones",
            ),
        ] = False,
        quick: Annotated[
            bool, typer.Option("--quick", help="shorter holds and windows (about a minute)")
        ] = False,
        no_live: Annotated[
            bool, typer.Option("--no-live", help="plain progress lines instead of the live view")
        ] = False,
        listen: Annotated[
            str, typer.Option("--listen", help="HOST:PORT for the API (another port if taken)")
        ] = "127.0.0.1:8080",
        router: Annotated[
            str,
            typer.Option(
                "--router",
                help="what users' requests go through: sidecar (ours) or nginx (a real "
                "nginx steered by `canary router nginx`'s agent; needs nginx installed)",
            ),
        ] = "sidecar",
    ) -> None:
        """Roll a healthy canary out (promoted) and a degraded one (rolled back), live.

        Starts three upstream versions, a sidecar, a load generator (~200 requests/s),
        the collector and the control plane with its controller, all in this process.
        Exits 0 when both scenarios end as expected.
        """
        import logging

        from controlplane.demo.run import DemoOptions, main

        # the demo's own view says what matters; the parts speak up only on trouble
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("alembic").setLevel(logging.WARNING)
        if router not in ("sidecar", "nginx"):
            typer.echo(f"canary demo: --router must be sidecar or nginx, got {router!r}",
                       err=True)
            raise typer.Exit(2)
        if router == "nginx":
            from controlplane.demo.nginx_front import find_nginx

            if find_nginx() is None:
                typer.echo("canary demo: --router nginx needs nginx (apt-get install "
                           "nginx-light)", err=True)
                raise typer.Exit(2)
        options = DemoOptions(
            real=real, quick=quick, live=not no_live, api_listen=listen, router=router
        )
        raise typer.Exit(main(options))
