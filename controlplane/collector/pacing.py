"""How often a collector publishes an experiment whose window changed, and applies the
batches it read (decision 0080).

A publish rewrites the experiment's current second whole (its histogram, unit rows,
reservoir and distinct units: ~4 KB at 50 samples a second). A collector publishing at
every tick wrote it ten times a second for a busy service whose sidecars flush every
50 ms, and every controller look found a fresh window to merge. Paced, a changed
experiment goes out at most every `publish_every` seconds, and at once when the
collector's screen finds its canary just turned worse (its alarm goes with it), so a
bad canary is not held back. Held-back samples stay unacknowledged until the publish
that carries them, as before (a collector that dies meanwhile leaves them pending for
another to claim).
"""

from __future__ import annotations

import math

# what `canary collector`, the embedded collector of `canary serve` and the demo use;
# a `Collector` made without it publishes at every tick (0), as a test stepping a fake
# clock expects
PUBLISH_EVERY_SEC = 1.0
# the same processes apply an experiment's batches read within a tick together, at the
# tick (`Collector(coalesce=True)`): a batch's own cost (~0.2 ms whatever its size) is
# paid once a tick, not once a batch, for a service whose many sidecars each send a few
# samples every 50 ms. Nothing reads a window between ticks but the tick's publish.
COALESCE = True
# an experiment whose canary turned worse is published at every tick for this long
# after its alarm: the controller's next looks (a trip takes consecutive breached
# looks, each on a window newer than the last) find its newest samples at once, not
# at the next alarm or the next paced publish
UNPACED_AFTER_ALARM_SEC = 5.0
# the collector's heartbeat interval (service.HEARTBEAT_SEC): paced any longer, a busy
# experiment would go unpublished longer than an idle one
MAX_PUBLISH_EVERY_SEC = 5.0


def held_back(
    *, changed: bool, heartbeat: bool, quiet_for: float, publish_every: float,
    alarmed_ago: float = math.inf,
) -> bool:  # fmt: skip
    """Is a changed experiment's publish held back at this tick, unless its screen
    raises an alarm? Not when it is due a heartbeat anyway, nor once `publish_every`
    has passed since its last publish (or it was never published), nor within
    UNPACED_AFTER_ALARM_SEC of its last alarm."""
    if alarmed_ago < UNPACED_AFTER_ALARM_SEC:
        return False
    return changed and not heartbeat and quiet_for < publish_every


def check_publish_every(value: float) -> float:
    """`value`, or a ValueError saying what it may be."""
    if not 0.0 <= value <= MAX_PUBLISH_EVERY_SEC:  # NaN fails both comparisons
        raise ValueError(f"publish every: 0 to {MAX_PUBLISH_EVERY_SEC:g} s, not {value!r}")
    return value
