"""How long a step gate may wait for units that cannot come clean, and what then.

A step gate wants every guardrail within its bound (docs/decisions/0003). Judged per
request, waiting resolves an exceedance: more requests shrink the noise. Judged on
units it need not: the step's estimate is made by the same sticky units all step
long, and when a few heavy users carry a window (one making a fifth of all
requests, each with a latency level of its own) the arms differ by which of them
landed where for as long as the step lasts. Before this module such a gate held
silently until the end of the benchmark's run (docs/decisions/0050-heavy-users.md).

So a gate held only by guardrails judged on units (cluster-robust) holds for at most
`GATE_EXTENSION_HOLDS` times the step's hold past its due time, saying so; then it is
judged on what it has: a guardrail breached at the bound's share of the rule's alpha
(Holm over the guardrails) trips the breaker with the rule's action, else the step
advances and the next step's, larger set of units judges again. The rule's alpha
(the step's whole false-alarm budget) is split, Bonferroni, between the wait and the
bound (`WAIT_ALPHA_SHARE`, decision 0056): while it waits, a held gate whose evidence
is breached at the wait's share trips at once rather than a hold later - a slowdown
the looks could not cut was otherwise cut only at the bound, a whole hold after its
step was due. A share of the rule's alpha and not a look's: a canary twice as slow
whose heaviest user is in it can stay below a look's share all step long while the
step's evidence is far below the rule's alpha, and advancing it at the bound would
promote it. A gate held by a guardrail judged per request keeps waiting as before
(new requests do resolve it).

The same bound holds for a step short of the rule's `min_samples` whose canary
samples are judged on units: at a 1% step the canary holds 1% of the users, and when
none of them is heavy they make far less than 1% of the requests (a few tenths of a
request a second on the benchmark's traffic), so `min_samples` can take many holds to
arrive. Past the bound the gate judges the samples it has, saying so; the next step's
larger share of the users judges again. A step short of samples judged per request
keeps waiting, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.decision.breaker import Evaluation, Guardrail, Verdict, clustered_units
from controlplane.decision.tally import Tally
from controlplane.kernel.routes import CANARY
from controlplane.kernel.rules import BreakerRule

# a gate held on units waits at most this many holds of its step past the due time
GATE_EXTENSION_HOLDS = 1.0
# the rule's alpha, split between the wait (a held gate trips as soon as its evidence
# is breached at this share) and the bound (the rest): Bonferroni over the two
# (decision 0056)
WAIT_ALPHA_SHARE = 0.5


@dataclass(frozen=True)
class GateDeadline:
    """What a held gate does now: keep holding (with `note`), advance, or trip."""

    advance: bool = False
    trip: bool = False
    note: str = ""


def _on_units(g: Guardrail) -> bool:
    return g.test is not None and g.test.method.startswith("cluster_robust")


def resolve(
    gate: Evaluation,
    holding: tuple[Guardrail, ...],
    late_sec: float,
    hold_sec: float,
    alpha: float,
) -> GateDeadline:
    """The held gate `gate`, `late_sec` past its step's due time.

    `holding`: the guardrails that keep it from advancing; `alpha`: the rule's.
    Nothing changes unless every holding guardrail is judged on units and the gate's
    evidence was judged at all.
    """
    if gate.verdict not in (Verdict.PASS, Verdict.BREACH) or not holding:
        return GateDeadline()
    if not all(_on_units(g) for g in holding):
        return GateDeadline()
    limit = GATE_EXTENSION_HOLDS * hold_sec
    names = ", ".join(g.name for g in holding)
    worst = min((g.p_adjusted if g.p_adjusted is not None else 1.0) for g in holding if g.exceeded)
    if late_sec < limit:
        waiting = alpha * WAIT_ALPHA_SHARE
        if worst < waiting:
            return GateDeadline(
                trip=True,
                note=(
                    f"step gate held {late_sec:.0f}s on units ({names}) and breached at "
                    f"{waiting:.2g}, the wait's share of the rule's alpha (Holm p={worst:.3g})"
                ),
            )
        return GateDeadline(
            note=(
                f"; held on units ({names}): the same users make the step's evidence, "
                f"so it is judged on what it has in {limit - late_sec:.0f}s"
            )
        )
    bound = alpha * (1.0 - WAIT_ALPHA_SHARE)
    if worst < bound:
        return GateDeadline(
            trip=True,
            note=(
                f"step gate held {late_sec:.0f}s on units ({names}) and breached at "
                f"{bound:.2g}, the bound's share of the rule's alpha (Holm p={worst:.3g})"
            ),
        )
    return GateDeadline(
        advance=True,
        note=(
            f"step gate held {late_sec:.0f}s on units ({names}); judged on what it has: "
            f"Holm p={worst:.3g} is not below {bound:.2g}, the bound's share of the "
            f"rule's alpha, advanced"
        ),
    )


@dataclass(frozen=True)
class Samples:
    """Whether a step short of `min_samples` keeps waiting (`wait`, with `note`), and
    the rule its gate is judged by otherwise (min_samples lowered to what it has)."""

    wait: bool
    rule: BreakerRule
    note: str = ""


def short_of_samples(rule: BreakerRule, tally: Tally, late_sec: float, hold_sec: float) -> Samples:
    """A step due `late_sec` ago whose merged evidence is `tally`."""
    count = tally.canary.count
    if count >= rule.min_samples:
        return Samples(False, rule)
    merged = tally.snapshots(experiment="")[CANARY]
    if count == 0 or clustered_units(merged) is None:
        return Samples(True, rule)
    limit = GATE_EXTENSION_HOLDS * hold_sec
    if late_sec < limit:
        note = (
            f"; its canary users make few requests: judged on the samples it has "
            f"in {limit - late_sec:.0f}s"
        )
        return Samples(True, rule, note)
    note = (
        f"judged on the {count} canary samples it has after waiting {late_sec:.0f}s "
        f"for min_samples {rule.min_samples} (its canary users make few requests); "
    )
    return Samples(False, rule.model_copy(update={"min_samples": count}), note)
