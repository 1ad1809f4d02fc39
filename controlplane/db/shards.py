"""The shards' fences in SQL (decision 0057): the fencing token of each shard's owner.

etcd revisions only grow, so the owner that claimed a shard last holds the greatest
fence. Raising the row's fence takes its row lock until the transaction ends: a
decision and a claim of the same shard commit one after the other, and whichever
comes second sees the other's fence.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import case, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from controlplane.db.models import ControllerShard
from controlplane.kernel.errors import NotLeader


def hold_shard(*, session: Session, shard: int, fence: int, owner: str, now: datetime) -> None:
    """Fence the transaction's writes by the shard's owner fence: NotLeader when a
    greater fence holds the shard (another replica claimed it since)."""
    values = {"shard": shard, "fence": fence, "owner": owner, "held_since": now}
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    session.execute(insert(ControllerShard).values(**values).on_conflict_do_nothing())
    moved = session.execute(
        update(ControllerShard)
        .where(ControllerShard.shard == shard, ControllerShard.fence <= fence)
        .values(
            fence=fence,
            owner=owner,
            held_since=case((ControllerShard.fence < fence, now),
                            else_=ControllerShard.held_since),
        )
        .execution_options(synchronize_session=False)
    )
    if moved.rowcount == 0:  # type: ignore[attr-defined]
        raise NotLeader(f"shard {shard} is held under a newer fence than {fence}")


def shard_fences(*, session: Session) -> dict[int, tuple[int, str]]:
    """Every shard's fence and owner."""
    rows = session.execute(
        ControllerShard.__table__.select()
    ).all()
    return {int(r.shard): (int(r.fence), str(r.owner)) for r in rows}
