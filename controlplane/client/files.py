"""Experiment and rule files (YAML or JSON) for the CLI, with errors that point at a line.

A bad file is reported as ONE line naming the file, the line and the field path:

    exp.yaml:12: steps[1].weight_pct: Input should be less than or equal to 100

To know the line of a field, the document is first composed into yaml nodes (which
keep their marks) and then constructed into plain data from those same nodes. A field
path from pydantic (`loc`) is walked down the node tree; the deepest node it reaches
gives the line. The same walk maps an API's problem+json `errors[].loc` back to the
file, for when the API's schemas are not importable locally.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from controlplane.kernel.errors import ConfigError, plain_message

Loc = tuple[str | int, ...]

# pydantic's wording for an unknown field reads as if the user passed a function input
_MESSAGES = {"Extra inputs are not permitted": "unknown field"}


@dataclass(frozen=True)
class FileProblem:
    """One thing wrong with a file: where (line, document path) and what."""

    line: int | None
    path: str
    msg: str


@dataclass
class BadFile(ConfigError):
    """A file that cannot be used; str() is the one line the CLI prints."""

    file: str
    problems: Sequence[FileProblem] = field(default_factory=tuple)

    def __str__(self) -> str:
        parts = []
        for index, problem in enumerate(self.problems):
            if index == 0:
                where = f"{self.file}:{problem.line}: " if problem.line else f"{self.file}: "
            else:
                # later problems name only the line: the file is already named
                where = f"line {problem.line}: " if problem.line else ""
            subject = f"{problem.path}: " if problem.path else ""
            parts.append(f"{where}{subject}{problem.msg}")
        return "; ".join(parts) if parts else f"{self.file}: invalid file"


@dataclass(frozen=True)
class SourceFile:
    """A parsed file: its plain data and the node tree it came from (for line numbers)."""

    name: str
    data: dict[str, Any]
    root: yaml.Node

    def line_of(self, loc: Loc) -> tuple[int, str]:
        """The 1-based line and the document path of the deepest node `loc` reaches."""
        return locate(self.root, loc)

    def problem(self, loc: Loc, msg: str) -> FileProblem:
        line, path = self.line_of(loc)
        return FileProblem(line, path, _MESSAGES.get(msg, msg))

    def bad(self, errors: Iterable[tuple[Loc, str]]) -> BadFile:
        problems = sorted(
            (self.problem(loc, msg) for loc, msg in errors), key=lambda p: p.line or 0
        )
        return BadFile(self.name, problems)


def _format_path(parts: Sequence[str | int]) -> str:
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def locate(root: yaml.Node, loc: Loc) -> tuple[int, str]:
    """Walk `loc` down the node tree; return (line, path of the parts that matched).

    Parts that match nothing are skipped: pydantic puts union members and validator
    names in `loc` (`failure_statuses.list[int].0`). A missing last part (a required
    field) stays in the path and points at the mapping that lacks it.
    """
    node = root
    line = node.start_mark.line + 1
    used: list[str | int] = []
    for index, part in enumerate(loc):
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    # the key's line, not the value's: a nested value may start later
                    line = key.start_mark.line + 1
                    child = value
                    break
        elif (
            isinstance(node, yaml.SequenceNode)
            and isinstance(part, int)
            and 0 <= part < len(node.value)
        ):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is not None:
            used.append(part)
            node = child
        elif index == len(loc) - 1 and not _is_type_tag(part):
            used.append(part)
    return line, _format_path(used)


def _is_type_tag(part: str | int) -> bool:
    # e.g. "list[int]", "literal['5xx']", "function-after[_one_source(), Sticky]"
    return isinstance(part, str) and ("[" in part or "(" in part)


def _duplicate_keys(node: yaml.Node, path: list[str | int]) -> Iterable[FileProblem]:
    # yaml keeps the last of two equal keys silently; a typo'd copy would go unnoticed
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                if key.value in seen:
                    yield FileProblem(
                        key.start_mark.line + 1, _format_path([*path, key.value]), "duplicate key"
                    )
                seen.add(key.value)
                yield from _duplicate_keys(value, [*path, key.value])
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _duplicate_keys(item, [*path, index])


def parse_text(text: str, name: str) -> SourceFile:
    """Parse YAML (JSON is read by the same parser) into a top-level mapping."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise BadFile(name, [FileProblem(None, "", "file is empty")])
        duplicates = list(_duplicate_keys(root, []))
        if duplicates:
            raise BadFile(name, duplicates)
        data = loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        what = exc.problem or exc.context or "cannot parse"
        raise BadFile(name, [FileProblem(line, "", f"invalid YAML/JSON: {what}")]) from exc
    except yaml.YAMLError as exc:
        raise BadFile(name, [FileProblem(None, "", f"invalid YAML/JSON: {exc}")]) from exc
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        kind = type(data).__name__ if data is not None else "nothing"
        problem = FileProblem(root.start_mark.line + 1, "", f"expected a mapping, got {kind}")
        raise BadFile(name, [problem])
    return SourceFile(name, data, root)


def read_file(path: str | Path) -> SourceFile:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise BadFile(str(path), [FileProblem(None, "", "no such file")]) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise BadFile(str(path), [FileProblem(None, "", f"cannot read: {exc}")]) from exc
    return parse_text(text, str(path))


def validate(source: SourceFile, model: type[BaseModel]) -> dict[str, Any]:
    """Check the data against `model`; return it as JSON-ready data, or raise BadFile."""
    try:
        model.model_validate(source.data)
    except ValidationError as exc:
        problems = ((tuple(err["loc"]), plain_message(err["msg"])) for err in exc.errors())
        raise source.bad(problems) from exc
    # the file's own data, not the model's dump: the API fills its defaults itself
    return source.data


def api_errors_to_file(source: SourceFile, errors: Sequence[Mapping[str, Any]]) -> BadFile:
    """Map an API's 422 `errors` (loc starting with "body") back to the file's lines."""
    pairs: list[tuple[Loc, str]] = []
    for err in errors:
        loc = tuple(err.get("loc") or ())
        if loc and loc[0] == "body":
            loc = loc[1:]
        pairs.append((loc, str(err.get("msg", "invalid"))))
    return source.bad(pairs)


def _schema(module: str, names: Sequence[str]) -> type[BaseModel] | None:
    """The API's request schema when it is importable here, else None (the API checks)."""
    try:
        found = importlib.import_module(module)
    except ImportError:
        return None
    for name in names:
        model = getattr(found, name, None)
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model
    return None


def experiment_schema() -> type[BaseModel] | None:
    return _schema("controlplane.api.schemas", ("ExperimentCreate",))


def rule_schema() -> type[BaseModel] | None:
    # the rule's contract lives in the kernel (architecture §6); the API may wrap it
    return _schema("controlplane.api.schemas", ("RulePut", "RuleIn", "BreakerRule")) or _schema(
        "controlplane.kernel.rules", ("BreakerRule",)
    )


def load_experiment(path: str | Path) -> tuple[SourceFile, dict[str, Any]]:
    """Read and check an experiment file: the source (for API errors) and the body."""
    source = read_file(path)
    model = experiment_schema()
    return source, validate(source, model) if model else source.data


def load_rule(path: str | Path, *, service: str | None = None) -> tuple[SourceFile, dict[str, Any]]:
    """Read and check a breaker-rule file; return the source and the body to PUT.

    The rule's `service` says where it applies; `service` fills it in when the file
    leaves it out, and must agree with it otherwise.
    """
    source = _with_service(read_file(path), service)
    model = rule_schema()
    return source, validate(source, model) if model else source.data


def load_overload(
    path: str | Path, *, service: str | None = None
) -> tuple[SourceFile, dict[str, Any]]:
    """Read and check an overload-protection file, named like a rule file (`service`)."""
    from controlplane.kernel.overload import ServiceOverload

    source = _with_service(read_file(path), service)
    return source, validate(source, ServiceOverload)


def _with_service(source: SourceFile, service: str | None) -> SourceFile:
    named = source.data.get("service")
    if service is not None:
        if named is not None and named != service:
            raise source.bad(
                [(("service",), f"the file says {named!r}, --service says {service!r}")]
            )
        source = SourceFile(source.name, {**source.data, "service": service}, source.root)
    elif not isinstance(named, str):
        raise source.bad([(("service",), "Field required (or pass --service)")])
    return source
