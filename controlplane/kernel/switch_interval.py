"""How soon a thread waiting for the GIL is given it, in the long-running processes.

A controller or a collector answers /healthz and /metrics from a thread of its own
(`admin_thread.py`) while its loop works. CPython hands the GIL to a waiting thread
only once the thread holding it has run for the switch interval (5 ms by default), and
the admin thread gives the GIL up at every blocking call of an answer (accept, receive,
send) and waits again after each: at 5 ms a turn, an answer took several times 5 ms
while the loop was busy, however little it had to do.

At 1 ms the waits are a fifth as long. The loop pays only while another thread wants
the GIL: the admin thread is idle between requests, and nothing else runs in these
processes, so the extra handovers are those of the answers themselves (decision 0076).
"""

from __future__ import annotations

import sys

ANSWERING_SWITCH_INTERVAL_SEC = 0.001


def for_answering_threads(interval: float = ANSWERING_SWITCH_INTERVAL_SEC) -> None:
    """Called once by each long-running command, beside the GC policy."""
    if not 0.0001 <= interval <= 0.005:
        raise ValueError(f"a switch interval within 0.1 and 5 ms, not {interval * 1000:g} ms")
    sys.setswitchinterval(interval)
