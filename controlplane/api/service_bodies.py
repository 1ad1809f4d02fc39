"""Per-service bodies (a breaker rule, an overload config): validated for the service
in the path, which the body may leave out but not contradict."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from controlplane.kernel.errors import FieldError, ValidationFailed
from controlplane.kernel.rules import pydantic_field_errors

M = TypeVar("M", bound=BaseModel)


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
