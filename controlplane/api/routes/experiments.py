"""/v1/experiments: define experiments and drive them through their lifecycle."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query, Response, status
from sqlalchemy.orm import Session

from controlplane.api.deps import (
    BackendsDep,
    ClockDep,
    DatabaseDep,
    KeysDep,
    KvDep,
    Limit,
    Offset,
)
from controlplane.api.live import read_live
from controlplane.api.schemas import (
    ActionRequest,
    EventPublic,
    ExperimentCreate,
    ExperimentDetail,
    ExperimentPublic,
    ExperimentUpdate,
    Page,
)
from controlplane.api.security import ActorDep, require
from controlplane.auth.roles import Role
from controlplane.db import experiments as records
from controlplane.experiments import actions
from controlplane.experiments.lifecycle import Action, ExperimentState
from controlplane.kernel.rules import ServiceName

router = APIRouter(prefix="/v1/experiments", tags=["experiments"])

VIEWER, OPERATOR, ADMIN = (require(r) for r in (Role.VIEWER, Role.OPERATOR, Role.ADMIN))

ExperimentId = Annotated[int, Path(ge=1, description="experiment id")]

PROBLEMS = {
    404: {"description": "no such experiment"},
    409: {"description": "not allowed in the current state"},
    422: {"description": "invalid body"},
    503: {"description": "a backend is unavailable; nothing was changed"},
}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ExperimentPublic,
    responses={422: PROBLEMS[422]},
    dependencies=[ADMIN],
)
async def create_experiment(
    body: ExperimentCreate,
    response: Response,
    database: DatabaseDep,
    clock: ClockDep,
    actor: ActorDep,
) -> ExperimentPublic:
    """Create a draft experiment."""
    experiment = await actions.create_experiment(
        database=database, clock=clock, spec=body.to_spec(), actor=actor
    )
    response.headers["Location"] = f"{router.prefix}/{experiment.id}"
    return ExperimentPublic.of(experiment)


@router.get("", response_model=Page[ExperimentPublic], dependencies=[VIEWER])
async def list_experiments(
    database: DatabaseDep,
    service: Annotated[ServiceName | None, Query()] = None,
    state: Annotated[ExperimentState | None, Query()] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> Page[ExperimentPublic]:
    """Experiments, newest first, filtered by service and state."""

    def load(*, session: Session) -> Page[ExperimentPublic]:
        rows, total = records.list_experiments(
            session=session,
            service=service,
            state=state.value if state else None,
            limit=limit,
            offset=offset,
        )
        items = [ExperimentPublic.of(e) for e in rows]
        return Page(items=items, total=total, limit=limit, offset=offset)

    return await database.read(load)


@router.get(
    "/{experiment_id}",
    response_model=ExperimentDetail,
    responses={404: PROBLEMS[404]},
    dependencies=[VIEWER],
)
async def get_experiment(experiment_id: ExperimentId, backends: BackendsDep) -> ExperimentDetail:
    """The experiment and its live rollout: breaker, step, weights, what is due next and
    the latest snapshot per variant (left out, with a note, when Redis cannot be read)."""
    experiment = await backends.database.read(records.get_experiment, experiment_id=experiment_id)
    live = await read_live(backends, experiment)
    return ExperimentDetail(**dict(ExperimentPublic.of(experiment)), live=live)


@router.patch(
    "/{experiment_id}",
    response_model=ExperimentPublic,
    responses={k: PROBLEMS[k] for k in (404, 409, 422)},
    dependencies=[ADMIN],
)
async def update_experiment(
    experiment_id: ExperimentId,
    body: ExperimentUpdate,
    database: DatabaseDep,
    clock: ClockDep,
    actor: ActorDep,
) -> ExperimentPublic:
    """Change a draft: the fields given replace the stored ones."""
    experiment = await actions.update_experiment(
        database=database,
        clock=clock,
        experiment_id=experiment_id,
        change=body.apply,
        actor=actor,
    )
    return ExperimentPublic.of(experiment)


@router.delete(
    "/{experiment_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={k: PROBLEMS[k] for k in (404, 409)},
    dependencies=[ADMIN],
)
async def delete_experiment(
    experiment_id: ExperimentId, database: DatabaseDep, clock: ClockDep, actor: ActorDep
) -> None:
    """Delete a draft (its audit trail stays)."""
    await actions.delete_experiment(
        database=database, clock=clock, experiment_id=experiment_id, actor=actor
    )


@router.get(
    "/{experiment_id}/events",
    response_model=Page[EventPublic],
    responses={404: PROBLEMS[404]},
    dependencies=[VIEWER],
)
async def list_events(
    experiment_id: ExperimentId,
    database: DatabaseDep,
    limit: Limit = 100,
    offset: Offset = 0,
) -> Page[EventPublic]:
    """The experiment's audit trail, oldest first."""

    def load(*, session: Session) -> Page[EventPublic]:
        records.get_experiment(session=session, experiment_id=experiment_id)
        rows, total = records.list_events(
            session=session, experiment_id=experiment_id, limit=limit, offset=offset
        )
        return Page(
            items=[EventPublic.of(e) for e in rows], total=total, limit=limit, offset=offset
        )

    return await database.read(load)


def _action_endpoint(action: Action) -> None:
    async def act(
        experiment_id: ExperimentId,
        database: DatabaseDep,
        kv: KvDep,
        keys: KeysDep,
        clock: ClockDep,
        actor: ActorDep,
        body: Annotated[ActionRequest | None, Body()] = None,
    ) -> ExperimentPublic:
        experiment = await actions.apply_action(
            database=database,
            kv=kv,
            keys=keys,
            clock=clock,
            experiment_id=experiment_id,
            action=action,
            actor=actor,
            reason=body.reason if body else "",
        )
        return ExperimentPublic.of(experiment)

    act.__name__ = f"{action.value}_experiment"
    act.__doc__ = f"{action.value.capitalize()} the experiment and publish its route."
    router.add_api_route(
        f"/{{experiment_id}}/{action.value}",
        act,
        methods=["POST"],
        response_model=ExperimentPublic,
        responses={k: PROBLEMS[k] for k in (404, 409, 503)},
        summary=f"{action.value.capitalize()} an experiment",
        dependencies=[OPERATOR],
    )


for _action in Action:
    _action_endpoint(_action)
