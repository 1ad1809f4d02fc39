"""The signature a receiver checks, and the bodies it gets in each format."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from controlplane.notify.kinds import NOTIFIABLE_KINDS, expand, topic_of, wants
from controlplane.notify.payloads import MAX_BODY_BYTES, render, slack_escape
from controlplane.notify.records import AnnouncedEvent, Format
from controlplane.notify.sample import sample_event
from controlplane.notify.signing import new_secret, signature, signed_headers, verify

SECRET = "whsec_0123456789abcdefghijklmnopqrstuv"
NOW = 1_800_000_000
AT = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)


def event(**overrides: Any) -> AnnouncedEvent:
    fields: dict[str, Any] = {
        "event_id": 41,
        "kind": "tripped",
        "service": "checkout",
        "experiment_id": 7,
        "experiment_name": "checkout v2",
        "at": AT,
        "actor": "controller",
        "from_state": "closed",
        "to_state": "open",
        "reason": "p95 above 250 ms",
        "payload": {"evidence": {"weights": {"canary_bp_after": 0}, "trips": 2}},
    }
    fields.update(overrides)
    return AnnouncedEvent(**fields)


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    body = b'{"kind":"tripped"}'
    expected = hmac.new(SECRET.encode(), b"1800000000." + body, hashlib.sha256).hexdigest()
    assert signature(SECRET, NOW, body) == f"sha256={expected}"
    assert signed_headers(SECRET, NOW, body) == {
        "X-Canary-Timestamp": "1800000000",
        "X-Canary-Signature": f"sha256={expected}",
    }


@pytest.mark.parametrize(
    ("timestamp", "body", "secret", "now", "valid"),
    [
        ("1800000000", b"{}", SECRET, NOW, True),
        ("1800000000", b"{}", SECRET, NOW + 300, True),
        ("1800000000", b"{}", SECRET, NOW + 301, False),  # too old: a replay
        ("1800000000", b"{}", SECRET, NOW - 301, False),  # from the future
        ("1800000000", b"{ }", SECRET, NOW, False),  # the body changed
        ("1800000001", b"{}", SECRET, NOW, False),  # the timestamp changed
        ("1800000000", b"{}", SECRET + "x", NOW, False),  # another secret
        ("-1", b"{}", SECRET, NOW, False),
        (None, b"{}", SECRET, NOW, False),
    ],
)
def test_verify(timestamp: str | None, body: bytes, secret: str, now: int, valid: bool) -> None:
    signed = signature(SECRET, NOW, b"{}")
    assert verify(secret, timestamp=timestamp, signature_value=signed, body=body, now=now) is valid


def test_a_missing_or_garbled_signature_does_not_verify() -> None:
    for value in (None, "", "sha256=", "sha256=zz", "sha1=" + "0" * 40, "sha256=é"):
        assert not verify(
            SECRET, timestamp="1800000000", signature_value=value, body=b"{}", now=NOW
        )


def test_secrets_are_new_each_time_and_long() -> None:
    first, second = new_secret(), new_secret()
    assert first != second and first.startswith("whsec_") and len(first) >= 48


def test_the_json_body_has_the_event_its_evidence_and_link() -> None:
    body = json.loads(render(event(), Format.JSON, base_url="https://canary.example.com/"))
    assert body == {
        "version": 1,
        "event_id": 41,
        "kind": "tripped",
        "topic": "trip",
        "service": "checkout",
        "experiment": {"id": 7, "name": "checkout v2"},
        "at": "2027-01-15T08:00:00+00:00",
        "actor": "controller",
        "from_state": "closed",
        "to_state": "open",
        "reason": "p95 above 250 ms",
        "summary": "tripped (trip 2); canary cut to 0%",
        "evidence": {"evidence": {"weights": {"canary_bp_after": 0}, "trips": 2}},
        "link": "https://canary.example.com/ui/experiments/7",
    }


def test_without_a_base_url_or_an_experiment_there_is_no_link() -> None:
    assert json.loads(render(event(), Format.JSON, base_url=None))["link"] is None
    service_level = event(experiment_id=None, experiment_name=None, kind="rule_rejected")
    body = json.loads(render(service_level, Format.JSON, base_url="https://c.example.com"))
    assert body["link"] is None and body["experiment"] is None and body["topic"] == "rules"


def test_evidence_too_large_is_left_out_and_says_so() -> None:
    huge = event(payload={"blob": "x" * (MAX_BODY_BYTES + 10)})
    raw = render(huge, Format.JSON, base_url=None)
    assert len(raw) <= MAX_BODY_BYTES
    evidence = json.loads(raw)["evidence"]
    assert evidence["truncated"] is True and evidence["bytes"] > MAX_BODY_BYTES


def test_non_json_evidence_is_refused_rather_than_sent() -> None:
    with pytest.raises(ValueError):
        render(event(payload={"p": float("nan")}), Format.JSON, base_url=None)


def test_the_slack_message_is_an_incoming_webhook_with_blocks() -> None:
    message = json.loads(
        render(
            event(reason="<!channel> & <https://evil|click>"),
            Format.SLACK,
            base_url="https://canary.example.com",
        )
    )
    assert set(message) == {"text", "blocks"}
    assert message["text"] == (
        "checkout: experiment 7 “checkout v2” tripped: tripped (trip 2); canary cut to 0%"
    )
    header, sentence, facts, reason, context = message["blocks"]
    assert header == {
        "type": "header",
        "text": {"type": "plain_text", "text": "checkout: experiment 7 “checkout v2” tripped"},
    }
    assert sentence["text"]["text"] == "tripped (trip 2); canary cut to 0%"
    # the reason cannot mention a channel or forge a link
    assert reason["elements"][0]["text"] == "&lt;!channel&gt; &amp; &lt;https://evil|click&gt;"
    assert [f["text"] for f in facts["fields"]] == [
        "*State*\nclosed → open",
        "*Canary weight*\n0.00 %",
        "*Trips*\n2",
        "*By*\ncontroller",
    ]
    assert context["elements"][0]["text"].startswith(
        "<https://canary.example.com/ui/experiments/7|Open in canary> · event 41"
    )


def test_without_a_public_url_the_slack_message_says_there_is_no_link() -> None:
    message = json.loads(render(event(), Format.SLACK, base_url=None))
    context = message["blocks"][-1]["elements"][0]["text"]
    assert context.startswith("no dashboard link: CANARY_PUBLIC_URL is not set · event 41")
    assert "127.0.0.1" not in json.dumps(message) and "Open in canary" not in context


def test_the_slack_message_tells_a_trip_in_words_beside_its_numbers() -> None:
    evidence = {
        "at": AT.timestamp(),
        "trips": 1,
        "weights": {"canary_bp_before": 500, "canary_bp_after": 0},
        "rule": {"percentile": 95, "threshold_ms": 200, "max_trips": 3, "cooldown_sec": 60,
                 "half_open_weight": 100},
        "window": {
            "variants": {
                "canary": {"percentile_ms": 407.2, "count": 68, "failures": 0,
                           "failure_ratio": 0.0, "above_threshold_fraction": 0.4,
                           "window_start": AT.timestamp() - 10, "window_end": AT.timestamp()},
                "baseline": {"percentile_ms": 88.0, "count": 1290},
            },
            "guardrails": {
                "latency": {"basis": "exact_above_threshold_count", "observed": 0.4,
                            "bound": 0.05, "exceeded": True, "breached": True},
                "failures": {"basis": "ratio_and_binomial_vs_bound", "observed": 0.0,
                             "bound": 0.05, "exceeded": False, "breached": False},
            },
        },
    }
    trip = event(reason="trip 1 of 3 (stop: canary 0 bp); latency 0.4 vs bound 0.05",
                 payload={"evidence": evidence})
    message = json.loads(render(trip, Format.SLACK, base_url="https://canary.example.com"))
    sentence = message["blocks"][1]["text"]["text"]
    assert sentence == (
        "tripped (trip 1 of 3): canary P95 407 ms &gt; bound 200 ms over the last 10 s, n=68 "
        "(40.0% above it, 5.0% allowed); baseline P95 88 ms; canary cut to 0%, probed again "
        "at 1% from 2027-01-15T08:01:00Z"
    )
    assert "canary P95 407 ms" in message["text"]
    assert message["blocks"][3]["elements"][0]["text"].startswith("trip 1 of 3 (stop")


def test_an_api_action_shows_its_canary_weight_in_slack() -> None:
    action = event(kind="promote", actor="token:ci", payload={"canary_weight_bp": 10000})
    fields = json.loads(render(action, Format.SLACK, base_url=None))["blocks"][2]["fields"]
    assert "*Canary weight*\n100.00 %" in [f["text"] for f in fields]


def test_slack_escape() -> None:
    assert slack_escape("a<b>&c") == "a&lt;b&gt;&amp;c"


def test_the_sample_is_marked_and_names_no_real_event() -> None:
    body = json.loads(render(sample_event(AT), Format.JSON, base_url=None))
    assert body["event_id"] == 0 and body["evidence"]["sample"] is True
    # shaped like a real trip, so a test send shows the sentence a real one would
    assert body["summary"].startswith(
        "tripped (trip 1 of 3): canary P95 412 ms > bound 250 ms over the last 60 s, n=240"
    )


def test_topics_expand_to_kinds_and_unknown_names_are_refused() -> None:
    assert expand(["trip", "rollback"]) == ("abort", "rollback", "rolled_back", "tripped")
    assert expand(["promoted"]) == ("promoted",)
    with pytest.raises(ValueError, match="created"):
        expand(["created"])
    assert topic_of("probe_failed") == "probe" and topic_of("nope") == "other"


@pytest.mark.parametrize(
    ("kinds", "kind", "wanted"),
    [
        ((), "tripped", True),
        ((), "created", False),
        (("tripped",), "tripped", True),
        (("tripped",), "promoted", False),
        (("created",), "created", False),
    ],
)
def test_wants(kinds: tuple[str, ...], kind: str, wanted: bool) -> None:
    assert wants(kinds, kind) is wanted


def test_every_announced_kind_has_a_topic() -> None:
    assert all(topic_of(kind) != "other" for kind in NOTIFIABLE_KINDS)
