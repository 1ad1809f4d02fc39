"""Kubernetes manifests as `canary inject` reads and writes them: multi-document YAML,
bounded, parsed safely; each object it changed checked against the Kubernetes API
schemas (kubernetes-validate, strict: an unknown field fails) before anything is
printed."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, cast

import yaml

from controlplane.injection.inject import InjectionError

MAX_BYTES = 8 * 1024 * 1024
MAX_DOCUMENTS = 1_000
_VERSION = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}(\.[0-9]{1,3})?")


def _numeric(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def parse(text: str, *, source: str) -> list[Any]:
    """The documents of `text`; refuses an oversized, malformed or aliased stream."""
    if len(text.encode()) > MAX_BYTES:
        raise InjectionError(f"{source}: larger than {MAX_BYTES // (1024 * 1024)} MiB")
    documents: list[Any] = []
    try:
        for document in yaml.load_all(text, Loader=_NoAliasLoader):
            documents.append(document)
            if len(documents) > MAX_DOCUMENTS:
                raise InjectionError(f"{source}: more than {MAX_DOCUMENTS} documents")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InjectionError(f"{source}:{line}: not valid YAML: {problem}") from exc
    return documents


class _NoAliasLoader(yaml.SafeLoader):
    """Anchors and aliases refused: a few aliases can expand to gigabytes (billion
    laughs), and no manifest needs them. Timestamps stay strings, as the API sends
    them (`kubectl get -o yaml` carries creationTimestamp)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = cast(Any, self).peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases are not accepted", event.start_mark
            )
        return super().compose_node(parent, index)


_NoAliasLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def dump(documents: Iterable[Any]) -> str:
    """Multi-document YAML, keys in the order they came."""
    return yaml.safe_dump_all(
        [doc for doc in documents if doc is not None],
        sort_keys=False,
        explicit_start=True,
        default_flow_style=False,
    )


def validate(objects: Iterable[dict[str, Any]], kubernetes_version: str) -> None:
    """Each object valid for that Kubernetes version, or one error naming the first
    that is not."""
    import kubernetes_validate
    from kubernetes_validate.utils import all_versions, major_minor

    # the library compares versions as text and fails on one older than its schemas
    known = {major_minor(version) for version in all_versions()}
    if _VERSION.fullmatch(kubernetes_version) is None or (
        major_minor(kubernetes_version) not in known
    ):
        raise InjectionError(f"Kubernetes {kubernetes_version} is not one the schemas cover "
                             f"({min(known, key=_numeric)} to {max(known, key=_numeric)})")
    for obj in objects:
        name = f"{obj.get('kind', '?').lower()}/{(obj.get('metadata') or {}).get('name', '?')}"
        try:
            kubernetes_validate.validate(obj, kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(part) for part in exc.path) or "(top)"
            raise InjectionError(f"{name} would be invalid at {path}: {exc.message}") from exc
        except kubernetes_validate.SchemaNotFoundError as exc:
            raise InjectionError(f"{name}: no schema for it in Kubernetes "
                                 f"{kubernetes_version}") from exc  # fmt: skip


def latest_kubernetes_version() -> str:
    import kubernetes_validate

    return str(kubernetes_validate.latest_version())
