"""The split judged across the whole ramp: bucket intervals per unit, always-valid."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.decision import decide
from controlplane.decision.ramp_split import LEDGER_UNITS, ODDS_RATIOS, RampSplit
from controlplane.decision.stats import SRM_P_VALUE
from controlplane.kernel.units import DISTINCT_K, UnitSummary, bottom_distinct

from .factory import STEPS, T0, rule, snap, state
from .test_units import with_units


def distinct_hashes(rng: np.random.Generator, n: int) -> np.ndarray:
    """n distinct non-zero 32-bit unit hashes, in random order."""
    drawn = np.unique(rng.integers(1, 2**32, 2 * n + 16, dtype=np.uint64))
    return rng.permutation(drawn)[:n].astype(np.uint32)


def sketch(*hashes: int) -> np.ndarray:
    return np.array(sorted(set(hashes)), dtype=np.uint32)


EMPTY = sketch()


# ---------------------------------------------------------------- table tests


@pytest.mark.parametrize(
    ("sightings", "events", "canary_events", "expected", "inconsistent"),
    [
        # first seen in the canary at 1%: one event, p = 0.01
        ([(100, True)], 1, 1, 0.01, 0),
        # first seen in the baseline at 1%, then at 5% in the canary: two events
        ([(100, False), (500, True)], 2, 1, 0.01 + 400 / 9900, 0),
        # seen in the baseline at every step of the ramp, then promoted: the 100% step
        # teaches nothing
        (
            [(100, False), (2500, False), (5000, False), (10_000, True)],
            3,
            0,
            0.01 + 2400 / 9900 + 2500 / 7500,
            0,
        ),
        # seen again at the same weight: its arm is known, no second event
        ([(2500, False), (2500, False)], 1, 0, 0.25, 0),
        # in the canary at 25%: in the canary at every higher weight, no more events
        ([(2500, True), (5000, True)], 1, 1, 0.25, 0),
        # a cut back to 5% after being in the baseline at 25%: in the baseline for sure
        ([(2500, False), (500, False)], 1, 0, 0.25, 0),
        # in the canary at 25%, then in the baseline at 50%: an assignment contradiction
        ([(2500, True), (5000, False)], 1, 1, 0.25, 1),
        # at 0% nothing is judged (and nothing is learnt)
        ([(0, False)], 0, 0, 0.0, 0),
    ],
)
def test_each_sighting_inside_a_units_bucket_interval_is_one_event(
    sightings: list[tuple[int, bool]],
    events: int,
    canary_events: int,
    expected: float,
    inconsistent: int,
) -> None:
    ramp = RampSplit()
    for bp, in_canary in sightings:
        one = sketch(0xABC)
        ramp = ramp.observe(EMPTY if in_canary else one, one if in_canary else EMPTY, bp)
    assert (ramp.events, ramp.canary_events, ramp.inconsistent) == (
        events,
        canary_events,
        inconsistent,
    )
    assert math.isclose(ramp.expected, expected, rel_tol=1e-12)


def test_a_unit_in_both_arms_of_one_window_is_counted_as_inconsistent_not_judged() -> None:
    both = sketch(7, 8)
    ramp = RampSplit().observe(both, sketch(8, 9), 5000)
    assert ramp.inconsistent == 1  # unit 8
    assert ramp.events == 2 and ramp.canary_events == 1  # units 7 and 9
    assert ramp.units == 2


def test_windows_without_units_leave_the_ramp_untouched() -> None:
    # no-unit traffic: the windows carry no unit state, the ramp is never started
    s = state(step_index=2, canary_bp=2500, weight_since=T0)
    window = {
        "canary": snap("canary", T0 + 11.5, count=250),
        "baseline": snap("baseline", T0 + 11.5, count=750),
    }
    d = decide(s, window, rule(), STEPS, T0 + 11.5)
    assert d.new_state.ramp_split is None
    assert d.evidence["srm"]["judged_on"] == "requests"


def test_a_unit_making_half_of_a_window_is_one_event_like_any_other() -> None:
    rng = np.random.default_rng(3)
    units = rng.integers(1, 2**32, 40, dtype=np.uint64).astype(np.uint32)
    heavy = np.uint32(0xBEEF)
    samples = np.concatenate([np.full(400, heavy), units[rng.integers(0, 40, 400)]])
    canary = with_units(
        snap("canary", T0 + 11.5), samples, np.zeros(800, bool), np.zeros(800, bool)
    )
    base_units = rng.integers(1, 2**32, 40, dtype=np.uint64).astype(np.uint32)
    baseline = with_units(
        snap("baseline", T0 + 11.5), base_units, np.zeros(40, bool), np.zeros(40, bool)
    )
    s = state(step_index=3, canary_bp=5000, weight_since=T0)
    ramp = decide(s, {"canary": canary, "baseline": baseline}, rule(), STEPS, T0 + 11.5)
    split = ramp.new_state.ramp_split
    assert split is not None
    distinct_canary = len(set(samples.tolist()))
    assert split.events == distinct_canary + 40
    assert split.canary_events == distinct_canary  # the heavy unit counts once


def test_units_above_the_sketches_common_cover_are_not_seen_in_either_arm() -> None:
    k = 8
    canary = sketch(*range(1, 2 * k + 1, 2))  # full: 1, 3, ..., 15
    baseline = sketch(*range(2, 40, 2))  # 2..38, more than k
    ramp = RampSplit().observe(baseline, canary, 5000, k=k)
    # the union's 8 smallest are 1..8: known in both arms; 9 and above are not
    assert ramp.events == k
    assert ramp.canary_events == 4
    assert ramp.hashes.tolist() == list(range(1, k + 1))


def test_a_full_ledger_counts_new_units_without_following_them() -> None:
    many = np.arange(1, LEDGER_UNITS + 11, dtype=np.uint32)
    ramp = RampSplit()
    for chunk in np.array_split(many, 6):  # windows below the sketch size
        assert chunk.shape[0] <= DISTINCT_K
        ramp = ramp.observe(chunk, EMPTY, 5000)
    assert ramp.units == LEDGER_UNITS
    assert ramp.not_followed == 10
    assert ramp.events == LEDGER_UNITS


# ---------------------------------------------------------------- the test's errors


def _ramp(rng: np.random.Generator, users: int, lost: float) -> RampSplit:
    """A 1/5/25/50% ramp over `users` units with random activity; `lost`: the share of
    units whose canary requests never arrive."""
    hashes = distinct_hashes(rng, users)
    bucket = rng.integers(0, 10_000, users)
    gone = rng.random(users) < lost
    activity = rng.uniform(0.05, 0.9, users)  # chance of being seen in one window
    ramp = RampSplit()
    for bp in (100, 500, 2500, 5000):
        for _ in range(5):
            seen = rng.random(users) < activity
            canary = seen & (bucket < bp) & ~gone
            baseline = seen & (bucket >= bp)
            ramp = ramp.observe(np.sort(hashes[baseline]), np.sort(hashes[canary]), bp)
    return ramp


def test_a_sound_assignment_rarely_warns_and_its_events_centre_on_their_expectation() -> None:
    rng = np.random.default_rng(11)
    ramps = [_ramp(rng, 600, 0.0) for _ in range(200)]
    warned = sum(r.mismatch for r in ramps)
    z = np.array([r.z() for r in ramps], dtype=float)
    assert warned <= 2  # level 0.001: 0.2 expected in 200
    assert abs(float(z.mean())) < 0.25  # 200 runs: standard error 0.07
    assert 0.8 < float(z.std()) < 1.2


def test_a_canary_losing_a_third_of_its_units_is_found_across_the_ramp() -> None:
    rng = np.random.default_rng(12)
    ramps = [_ramp(rng, 1000, 1 / 3) for _ in range(20)]
    assert sum(r.mismatch for r in ramps) >= 18
    assert all(r.always_valid_p() < 1 for r in ramps)
    # the canary is short, not long
    assert all((r.z() or 0.0) < 0 for r in ramps)


def test_a_rejection_stands_once_reached() -> None:
    rng = np.random.default_rng(13)
    ramp = _ramp(rng, 1500, 1 / 2)
    assert ramp.mismatch and ramp.always_valid_p() < SRM_P_VALUE
    # fair windows afterwards cannot undo an always-valid rejection
    fresh = np.arange(1, 200, dtype=np.uint32)
    assert ramp.observe(fresh[1::2], fresh[::2], 5000).mismatch


# ---------------------------------------------------------------- through decide()


def test_decide_warns_when_the_canary_loses_units_across_steps() -> None:
    rng = np.random.default_rng(21)
    users = 3000
    hashes = distinct_hashes(rng, users)
    bucket = rng.integers(0, 10_000, users)
    gone = rng.random(users) < 0.3
    s = state()
    events: list[str] = []
    reasons: list[str] = []
    for index, step in enumerate(STEPS):
        since = T0 + 100 * index
        s = s.with_changes(step_index=index, canary_bp=step.weight_bp, weight_since=since)
        for k in range(4):
            t = since + 11.5 + 10 * k
            seen = rng.random(users) < 0.3
            arm = {
                "canary": hashes[seen & (bucket < step.weight_bp) & ~gone],
                "baseline": hashes[seen & (bucket >= step.weight_bp)],
            }
            window = {
                name: with_units(snap(name, t), u, np.zeros(u.size, bool), np.zeros(u.size, bool))
                for name, u in arm.items()
            }
            d = decide(s, window, rule(), STEPS, t)
            s = d.new_state
            events += [e.kind.value for e in d.events]
            reasons += [e.reason for e in d.events]
    assert "srm_detected" in events
    assert s.srm_flagged and s.ramp_split is not None and s.ramp_split.mismatch
    # and the state, ledger included, survives being stored
    from controlplane.decision import RolloutState

    assert RolloutState.from_dict(s.to_dict()) == s


# ---------------------------------------------------------------- state and shards


def test_the_ledger_survives_its_round_trip_and_refuses_malformed_state() -> None:
    ramp = _ramp(np.random.default_rng(5), 300, 0.0)
    data = ramp.to_dict()
    assert RampSplit.from_dict(data) == ramp
    bad = [
        {**data, "units": "not base64!"},
        {**data, "units": "AAAA"},  # 3 bytes: not whole units
        {**data, "log_terms": [0.0]},
        {**data, "log_terms": [math.inf] * len(ODDS_RATIOS)},
        {**data, "events": -1},
        {**data, "canary_events": data["events"] + 1},
        {**data, "variance": -1.0},
        {**data, "mismatch": "yes"},
        [],
    ]
    for value in bad:
        with pytest.raises(ValueError):
            RampSplit.from_dict(value)
    # an interval with lo >= hi, and unsorted hashes
    flipped = RampSplit(
        hashes=np.array([5, 3], dtype=np.uint32),
        lo=np.array([0, 0], dtype=np.uint16),
        hi=np.array([10_000, 10_000], dtype=np.uint16),
    )
    with pytest.raises(ValueError):
        RampSplit.from_dict(flipped.to_dict())
    empty = RampSplit(
        hashes=np.array([5], dtype=np.uint32),
        lo=np.array([300], dtype=np.uint16),
        hi=np.array([300], dtype=np.uint16),
    )
    with pytest.raises(ValueError):
        RampSplit.from_dict(empty.to_dict())


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.tuples(st.integers(0, 2500), st.integers(0, 2500)),
    shards=st.integers(1, 5),
    seed=st.integers(0, 2**16),
    bp=st.sampled_from([100, 2500, 5000, 9999]),
)
def test_windows_merged_across_shards_give_the_ledger_of_the_whole_window(
    sizes: tuple[int, int], shards: int, seed: int, bp: int
) -> None:
    rng = np.random.default_rng(seed)
    pool = distinct_hashes(rng, sum(sizes))
    arms = (pool[: sizes[0]], pool[sizes[0] :])

    def merged_over_shards(units: np.ndarray) -> UnitSummary:
        # each collector shard sees some of the window's requests; a unit may reach
        # several shards, and the partial windows merge as the controller merges them
        requests = np.repeat(units, 3)
        shard = rng.integers(0, shards, requests.shape[0])
        parts = [
            UnitSummary(UnitSummary.empty().rows, bottom_distinct([requests[shard == i]]))
            for i in range(shards)
        ]
        merged = parts[0]
        for part in parts[1:]:
            merged = merged.add(part)
        return merged

    whole = [bottom_distinct([units]) for units in arms]
    sharded = [merged_over_shards(units).distinct for units in arms]
    for a, b in zip(sharded, whole, strict=True):
        np.testing.assert_array_equal(a, b)
    ramp = RampSplit().observe(sharded[0], sharded[1], bp)
    assert ramp == RampSplit().observe(whole[0], whole[1], bp)
    assert bool(np.all(ramp.lo < ramp.hi))
    assert ramp.canary_events <= ramp.events <= DISTINCT_K
    assert RampSplit.from_dict(ramp.to_dict()) == ramp
