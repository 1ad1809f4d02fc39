"""/v1/experiments: define experiments and drive them through their lifecycle."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Response, status

from controlplane.api.deps import (
    BackendsDep,
    ClockDep,
    ExperimentId,
    Limit,
    Offset,
    SettingsDep,
    StoreDep,
)
from controlplane.api.live import read_live, route_applied, route_confirmation
from controlplane.api.problems import problem_responses
from controlplane.api.schemas import (
    ActionRequest,
    EventPublic,
    ExperimentCreate,
    ExperimentDetail,
    ExperimentPublic,
    ExperimentUpdate,
    Page,
    check_upstreams,
)
from controlplane.api.security import ActorDep, require
from controlplane.auth.roles import Role
from controlplane.experiments import actions
from controlplane.experiments.lifecycle import ExperimentState, LifecycleAction
from controlplane.experiments.store import ExperimentSpec
from controlplane.kernel.values import ServiceName

router = APIRouter(prefix="/v1/experiments", tags=["experiments"])

VIEWER, OPERATOR, ADMIN = (require(r) for r in (Role.VIEWER, Role.OPERATOR, Role.ADMIN))


NO_SUCH = {404: "no such experiment"}

_ITEM = "#/paths/~1v1~1experiments~1{experiment_id}"


def _link(path: str, method: str) -> dict[str, object]:
    return {
        "operationRef": f"{_ITEM}{path}/{method}",
        "parameters": {"experiment_id": "$response.body#/id"},
    }


# OpenAPI links: what a client (or a stateful test) can do with a created experiment
CREATED_LINKS = {
    "GetExperiment": _link("", "get"),
    "UpdateExperiment": _link("", "patch"),
    "DeleteExperiment": _link("", "delete"),
    "ListEvents": _link("~1events", "get"),
    **{f"{a.value.capitalize()}Experiment": _link(f"~1{a.value}", "post") for a in LifecycleAction},
}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ExperimentPublic,
    responses={
        201: {"description": "the draft, at Location", "links": CREATED_LINKS},
        **problem_responses(body=True),
    },
    dependencies=[ADMIN],
)
async def create_experiment(
    body: ExperimentCreate,
    response: Response,
    store: StoreDep,
    clock: ClockDep,
    actor: ActorDep,
    settings: SettingsDep,
) -> ExperimentPublic:
    """Create a draft experiment. Without a baseline it takes the service's stable
    version, as it is when the experiment starts (422 when the service has none)."""
    stable = None
    if body.variants.baseline is None:
        async with store.transaction() as tx:
            stable = await tx.load_stable_version(service=body.service)
    spec = check_upstreams(body.to_spec(stable), settings.upstream_policy)
    experiment = await actions.create_experiment(
        store=store, clock=clock, spec=spec, actor=actor
    )
    response.headers["Location"] = f"{router.prefix}/{experiment.id}"
    return ExperimentPublic.of(experiment)


@router.get(
    "",
    response_model=Page[ExperimentPublic],
    responses=problem_responses(),
    dependencies=[VIEWER],
)
async def list_experiments(
    store: StoreDep,
    service: Annotated[ServiceName | None, Query()] = None,
    state: Annotated[ExperimentState | None, Query()] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> Page[ExperimentPublic]:
    """Experiments, newest first, filtered by service and state."""
    async with store.transaction() as tx:
        rows, total = await tx.list_experiments(
            service=service, states=None if state is None else (state,), limit=limit,
            offset=offset,
        )
    items = [ExperimentPublic.of(e) for e in rows]
    return Page(items=items, total=total, limit=limit, offset=offset)


@router.get(
    "/{experiment_id}",
    response_model=ExperimentDetail,
    responses=problem_responses(notes=NO_SUCH),
    dependencies=[VIEWER],
)
async def get_experiment(experiment_id: ExperimentId, backends: BackendsDep) -> ExperimentDetail:
    """The experiment and its live rollout: breaker, step, weights, what is due next and
    the latest snapshot per variant (left out, with a note, when Redis cannot be read),
    whether etcd holds its desired route yet (`route_applied`) and whether a data plane
    reported holding it (`route_confirmation`)."""
    async with backends.store.transaction() as tx:
        experiment = await tx.load_experiment(experiment_id=experiment_id)
    live = await read_live(backends, experiment)
    applied, note = await route_applied(backends, experiment)
    return ExperimentDetail(
        **dict(ExperimentPublic.of(experiment)), route_applied=applied, route_note=note,
        route_confirmation=await route_confirmation(backends, experiment), live=live,
    )


@router.patch(
    "/{experiment_id}",
    response_model=ExperimentPublic,
    responses=problem_responses(409, body=True, notes=NO_SUCH),
    dependencies=[ADMIN],
)
async def update_experiment(
    experiment_id: ExperimentId,
    body: ExperimentUpdate,
    store: StoreDep,
    clock: ClockDep,
    actor: ActorDep,
    settings: SettingsDep,
) -> ExperimentPublic:
    """Change a draft: the fields given replace the stored ones."""
    policy = settings.upstream_policy

    def change(spec: ExperimentSpec) -> ExperimentSpec:
        return check_upstreams(body.apply(spec), policy)

    experiment = await actions.update_experiment(
        store=store,
        clock=clock,
        experiment_id=experiment_id,
        change=change,
        actor=actor,
    )
    return ExperimentPublic.of(experiment)


@router.delete(
    "/{experiment_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problem_responses(409, notes=NO_SUCH),
    dependencies=[ADMIN],
)
async def delete_experiment(
    experiment_id: ExperimentId, store: StoreDep, clock: ClockDep, actor: ActorDep
) -> None:
    """Delete a draft (its audit trail stays)."""
    await actions.delete_experiment(
        store=store, clock=clock, experiment_id=experiment_id, actor=actor
    )


@router.get(
    "/{experiment_id}/events",
    response_model=Page[EventPublic],
    responses=problem_responses(notes=NO_SUCH),
    dependencies=[VIEWER],
)
async def list_events(
    experiment_id: ExperimentId,
    store: StoreDep,
    limit: Limit = 100,
    offset: Offset = 0,
) -> Page[EventPublic]:
    """The experiment's audit trail, oldest first."""
    async with store.transaction() as tx:
        await tx.load_experiment(experiment_id=experiment_id)  # NotFound: 404
        rows, total = await tx.list_events(experiment_id=experiment_id, limit=limit,
                                           offset=offset)
    return Page(items=[EventPublic.of(e) for e in rows], total=total, limit=limit, offset=offset)


def _action_endpoint(action: LifecycleAction) -> None:
    async def act(
        experiment_id: ExperimentId,
        backends: BackendsDep,
        clock: ClockDep,
        actor: ActorDep,
        body: Annotated[ActionRequest | None, Body()] = None,
    ) -> ExperimentPublic:
        experiment = await actions.apply_action(
            store=backends.store,
            changes=backends.route_changes,
            clock=clock,
            experiment_id=experiment_id,
            action=action,
            actor=actor,
            reason=body.reason if body else "",
        )
        return ExperimentPublic.of(experiment)

    act.__name__ = f"{action.value}_experiment"
    act.__doc__ = (
        f"{action.value.capitalize()} the experiment. The answer comes once its state and "
        "its service's desired route are committed; the route reaches etcd right after "
        "(`route_applied` in GET /v1/experiments/{id}), then the data planes, which confirm "
        "it (`route_confirmation`)."
    )
    router.add_api_route(
        f"/{{experiment_id}}/{action.value}",
        act,
        methods=["POST"],
        response_model=ExperimentPublic,
        responses=problem_responses(409, body=True, notes=NO_SUCH),
        summary=f"{action.value.capitalize()} an experiment",
        dependencies=[OPERATOR],
    )


for _action in LifecycleAction:
    _action_endpoint(_action)
