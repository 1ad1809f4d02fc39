"""HAProxy's assignment in Python, to predict what the base config does per request.

    bucket = xxh32(("<salt>:" + unit) as bytes, seed 0) % 10000

which is `var(salt),concat(:,unit),xxh32,mod(10000)` in `render.py`: HAProxy's
`xxh32` converter (seed 0 when none is given) over the raw bytes of the header or
cookie. The variant is then the sidecar's layout (`BucketLayout`: non-baseline
variants from bucket 0 up in route order, baseline last), so the ramp is monotonic
as in the sidecar. The bucket differs from the sidecar's (blake2b) for the same
unit: HAProxy has no blake2b converter. A service is steered by one kind of router,
so a unit still sees one variant; the samples' unit id is the sidecar's
(`sidecar.assignment.unit_hash`, computed by the log parser).
"""

from __future__ import annotations

import xxhash

from controlplane.kernel.routes import BASELINE, Route
from sidecar.assignment import BUCKETS, BucketLayout


def bucket(salt: str, unit: bytes | str) -> int:
    """The bucket HAProxy gives a unit (a str is sent as its latin-1 bytes, as a
    header carries it)."""
    raw = unit.encode("latin-1") if isinstance(unit, str) else unit
    return xxhash.xxh32_intdigest(salt.encode("ascii") + b":" + raw, seed=0) % BUCKETS


def layout_of(route: Route) -> BucketLayout:
    return BucketLayout.from_weights(
        [(v.name, v.weight) for v in route.variants], baseline=BASELINE
    )


def variant_of(route: Route, unit: bytes | str) -> str:
    """The variant HAProxy sends a unit to under `route` (no forced variant)."""
    return layout_of(route).variant_at(bucket(route.salt, unit))


__all__ = ["bucket", "layout_of", "variant_of"]
