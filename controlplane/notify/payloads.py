"""The bodies a webhook receives, one per format: pure functions of the event.

`json` (version 1):

    {"version": 1, "event_id": 812, "kind": "tripped", "topic": "trip",
     "service": "checkout", "experiment": {"id": 7, "name": "checkout v2"},
     "at": "2026-12-02T10:00:00+00:00", "actor": "controller",
     "from_state": "closed", "to_state": "open", "reason": "…",
     "summary": "tripped (trip 1 of 3): canary P95 407 ms > bound 200 ms …",
     "evidence": {…the event's payload…},
     "link": "https://canary.example.com/ui/experiments/7"}

`slack`: an incoming-webhook message (`text` for the notification, `blocks` for the
channel), the event's sentence first and its reason (the numbers) beside. A body is
at most MAX_BODY_BYTES: larger evidence is left out and says so.

Links point at the `public_url` setting (CANARY_PUBLIC_URL); without it a message
has no link, and a Slack message says why.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Final

from controlplane.decision.words import event_sentence
from controlplane.notify.kinds import topic_of
from controlplane.notify.records import AnnouncedEvent, Format

VERSION: Final = 1
MAX_BODY_BYTES: Final = 256 * 1024
SLACK_TEXT_MAX: Final = 3000  # Slack's limit on a section's text
SLACK_HEADER_MAX: Final = 150  # ... and on a header's
NO_LINK_NOTE: Final = "no dashboard link: CANARY_PUBLIC_URL is not set"


def dashboard_link(base_url: str | None, experiment_id: int | None) -> str | None:
    if not base_url or experiment_id is None:
        return None
    return f"{base_url.rstrip('/')}/ui/experiments/{experiment_id}"


def render(event: AnnouncedEvent, fmt: Format, *, base_url: str | None) -> bytes:
    link = dashboard_link(base_url, event.experiment_id)
    if fmt is Format.SLACK:
        return _encode(slack_message(event, link))
    return json_body(event, link)


def json_document(event: AnnouncedEvent, link: str | None) -> dict[str, Any]:
    experiment = (
        {"id": event.experiment_id, "name": event.experiment_name}
        if event.experiment_id is not None
        else None
    )
    return {
        "version": VERSION,
        "event_id": event.event_id,
        "kind": event.kind,
        "topic": topic_of(event.kind),
        "service": event.service,
        "experiment": experiment,
        "at": _iso(event.at),
        "actor": event.actor,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "reason": event.reason,
        "summary": summary_of(event),
        "evidence": event.payload,
        "link": link,
    }


def json_body(event: AnnouncedEvent, link: str | None) -> bytes:
    document = json_document(event, link)
    body = _encode(document)
    if len(body) <= MAX_BODY_BYTES:
        return body
    document["evidence"] = {"truncated": True, "bytes": len(body)}
    document["reason"] = event.reason[:SLACK_TEXT_MAX]
    document["summary"] = str(document["summary"])[:SLACK_TEXT_MAX]
    return _encode(document)


def summary_of(event: AnnouncedEvent) -> str:
    """The event in one sentence (decision/words.py); absolute times, since a
    delivery may be retried long after the event."""
    return event_sentence(event.kind, event.reason, event.payload, actor=event.actor)


def _encode(document: dict[str, Any]) -> bytes:
    # events hold JSON the store already accepted; default=str covers a stray datetime
    return json.dumps(
        document, separators=(",", ":"), sort_keys=True, default=str, allow_nan=False
    ).encode("utf-8")


def _iso(at: datetime) -> str:
    return at.isoformat()


def slack_escape(text: str) -> str:
    """Slack's mrkdwn control characters: &, < and > (its own link syntax)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _subject(event: AnnouncedEvent) -> str:
    if event.experiment_id is None:
        return f"{event.service}: {event.kind}"
    name = f" “{event.experiment_name}”" if event.experiment_name else ""
    return f"{event.service}: experiment {event.experiment_id}{name} {event.kind.replace('_', ' ')}"


def _facts(event: AnnouncedEvent) -> list[tuple[str, str]]:
    facts: list[tuple[str, str]] = []
    if event.from_state or event.to_state:
        facts.append(("State", f"{event.from_state or '-'} → {event.to_state or '-'}"))
    payload = event.payload
    weights = (
        payload.get("evidence", {}).get("weights")
        if isinstance(payload.get("evidence"), dict)
        else None
    )
    canary_bp = weights.get("canary_bp_after") if isinstance(weights, dict) else None
    if canary_bp is None:
        canary_bp = payload.get("canary_weight_bp")
    if isinstance(canary_bp, int) and not isinstance(canary_bp, bool):
        facts.append(("Canary weight", f"{canary_bp / 100:.2f} %"))
    trips = (
        payload.get("evidence", {}).get("trips")
        if isinstance(payload.get("evidence"), dict)
        else None
    )
    if isinstance(trips, int) and not isinstance(trips, bool):
        facts.append(("Trips", str(trips)))
    facts.append(("By", event.actor))
    return facts


def slack_message(event: AnnouncedEvent, link: str | None) -> dict[str, Any]:
    subject = _subject(event)
    summary = summary_of(event)
    fields = [
        {"type": "mrkdwn", "text": f"*{name}*\n{slack_escape(_clip(value, 200))}"}
        for name, value in _facts(event)
    ]
    context = f"event {event.event_id} · {slack_escape(_iso(event.at))}"
    if link is not None:
        context = f"<{slack_escape(link)}|Open in canary> · {context}"
    else:
        context = f"{NO_LINK_NOTE} · {context}"
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": _clip(subject, SLACK_HEADER_MAX)},
        },
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": slack_escape(_clip(summary, SLACK_TEXT_MAX))},
        },
        {"type": "section", "fields": fields},
    ]
    if event.reason and event.reason != summary:
        blocks.append(
            {
                "type": "context",
                "elements": [
                    {"type": "mrkdwn", "text": slack_escape(_clip(event.reason, SLACK_TEXT_MAX))}
                ],
            }
        )
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    text = f"{subject}: {summary}"
    return {"text": slack_escape(_clip(text, SLACK_TEXT_MAX)), "blocks": blocks}
