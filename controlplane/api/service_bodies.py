"""Per-service bodies (a breaker rule, an overload config): validated for the service
in the path, which the body may leave out but not contradict."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from controlplane.kernel.errors import FieldError, ValidationFailed
from controlplane.kernel.rules import pydantic_field_errors

M = TypeVar("M", bound=BaseModel)


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI `requestBody` of a route that takes `model` as a dict for the service
    in its path: the model's schema, self-contained, with `service` optional."""
    return {"required": True, "content": {"application/json": {"schema": service_optional(model)}}}


def service_optional(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON schema, self-contained, with `service` optional (a body that
    belongs to a service named elsewhere may leave it out)."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})
    inlined: dict[str, Any] = _inline(schema, definitions)
    inlined["required"] = [name for name in inlined.get("required", []) if name != "service"]
    return inlined


def _inline(node: Any, definitions: dict[str, Any]) -> Any:
    """`node` with every `#/$defs/…` reference replaced by its definition."""
    if isinstance(node, list):
        return [_inline(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    reference = node.get("$ref")
    if isinstance(reference, str) and reference.startswith("#/$defs/"):
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return {**_inline(definitions[reference.removeprefix("#/$defs/")], definitions), **rest}
    return {key: _inline(value, definitions) for key, value in node.items()}


def validate_for_service(model: type[M], service: str, body: dict[str, Any], what: str) -> M:
    """Validate `body` as `model` for `service`; errors name the body's fields."""
    named = body.get("service")
    if named is not None and named != service:
        raise ValidationFailed(
            f"invalid {what}",
            [FieldError(("body", "service"), f"must be {service!r}, the service in the path")],
        )
    try:
        return model.model_validate({**body, "service": service})
    except ValidationError as exc:
        errors = [FieldError(("body", *e.loc), e.msg) for e in pydantic_field_errors(exc)]
        raise ValidationFailed(f"invalid {what}", errors) from exc
