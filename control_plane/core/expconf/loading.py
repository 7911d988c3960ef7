"""Reading a config's text: size and shape bounds (checked on the YAML event stream before
anything is built), a YAML loader that refuses duplicate keys and reads like JSON and
Determined's parser, and the checks that what was read survives a trip through JSON."""

import math
import re
from typing import Any

import yaml

from control_plane.core.expconf.describe import join_path, yaml_type
from control_plane.core.expconf.errors import ConfigInvalid, FieldError

__all__ = ["MAX_CONFIG_BYTES", "json_problems", "load_document"]

# A config is a page of YAML; anything this large is a mistake or an attack on the parser.
MAX_CONFIG_BYTES = 2 * 1024 * 1024
# Bounds on the parsed document: YAML aliases can expand a small text into a huge tree.
_MAX_NODES = 200_000
_MAX_DEPTH = 64
# Nodes in the text itself (aliases not expanded), checked on the event stream before PyYAML
# composes anything: its pure-Python loader spends ~30 µs per node, so this caps the CPU one
# config can cost (well under a second); a real config has a few hundred nodes.
_MAX_DOCUMENT_NODES = 20_000


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and keeps dates as strings (JSON has no dates)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults` may be overridden by explicit keys, as YAML intends
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable; the base class reports it with its position
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r} (first at line {seen[key].start_mark.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _construct_str(loader: _ConfigLoader, node: yaml.ScalarNode) -> str:
    value = loader.construct_scalar(node)
    # JSON writes astral characters as "\ud83d\ude00"; YAML decodes each half separately.
    if _SURROGATE.search(value):
        try:
            value = value.encode("utf-16", "surrogatepass").decode("utf-16")
        except UnicodeDecodeError:
            pass  # a lone surrogate; reported by json_problems
    return value


_ConfigLoader.add_constructor("tag:yaml.org,2002:str", _construct_str)
# YAML 1.1 (PyYAML) reads ``1e-5`` as a string because it has no dot; YAML 1.2, JSON and
# Determined's Go parser read a float. Same pattern as PyYAML's, with the dot made optional
# when there is an exponent.
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_ConfigLoader.yaml_implicit_resolvers = {
    ch: [
        (tag, _FLOAT if tag == "tag:yaml.org,2002:float" else rx)
        for tag, rx in resolvers
        if tag != "tag:yaml.org,2002:timestamp"
    ]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_document(text: str | bytes) -> Any:
    """The parsed YAML (or JSON) document; ``ConfigInvalid`` if the text is too large, not UTF-8,
    beyond the shape bounds or not YAML."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_CONFIG_BYTES:
            raise ConfigInvalid([FieldError("", f"config is larger than {MAX_CONFIG_BYTES} bytes")])
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ConfigInvalid(
                [
                    FieldError(
                        "", f"config is not valid UTF-8 (byte 0x{text[exc.start]:02x} at offset {exc.start})"
                    )
                ]
            ) from None
    elif len(text.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
        raise ConfigInvalid([FieldError("", f"config is larger than {MAX_CONFIG_BYTES} bytes")])
    try:
        _check_shape(text)
        return yaml.load(text, Loader=_ConfigLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "unreadable"
        raise ConfigInvalid([FieldError("", f"invalid YAML{where}: {problem}")]) from None
    except yaml.YAMLError as exc:
        raise ConfigInvalid([FieldError("", f"invalid YAML: {exc}")]) from None
    except RecursionError:
        raise ConfigInvalid([FieldError("", "invalid YAML: nested too deeply")]) from None


# libyaml's parser when PyYAML has it (it ships in PyYAML's wheels): a fast, iterative event stream.
_EventLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _check_shape(text: str) -> None:
    """Refuse, from the document's event stream and before it is composed, a document nested
    deeper than _MAX_DEPTH, with more than _MAX_DOCUMENT_NODES nodes, or whose aliases expand to
    more than _MAX_NODES values ("billion laughs"): PyYAML's composer recurses once per level and
    its scanner is quadratic in flow nesting, so 6 KB of `[[[[` cost seconds. Same rules and
    messages as `json_problems`, which still checks the loaded tree. Malformed text is left to the
    loader, whose messages say where."""
    too_big = f"config is too large (more than {_MAX_NODES} values after expanding aliases)"
    nodes = 0
    expanded: dict[str, int] = {}  # anchor → values its node expands to
    # one entry per open collection: [values inside it so far (expanded), its anchor]
    open_: list[list[Any]] = [[0, None]]
    try:
        for event in yaml.parse(text, Loader=_EventLoader):
            if isinstance(event, yaml.CollectionEndEvent):
                size, anchor = open_.pop()
                if anchor is not None:
                    expanded[anchor] = size
                open_[-1][0] += size
                if open_[-1][0] > _MAX_NODES:
                    raise ConfigInvalid([FieldError("", too_big)])
                continue
            if not isinstance(event, yaml.NodeEvent):
                continue  # stream and document boundaries
            nodes += 1
            if len(open_) - 1 > _MAX_DEPTH:
                raise ConfigInvalid([FieldError("", f"nested more than {_MAX_DEPTH} levels deep")])
            if nodes > _MAX_DOCUMENT_NODES:
                raise ConfigInvalid([FieldError("", f"config is too large (more than {_MAX_DOCUMENT_NODES} values)")])
            if isinstance(event, yaml.CollectionStartEvent):
                open_.append([1, event.anchor])
                continue
            size = expanded.get(event.anchor, 1) if isinstance(event, yaml.AliasEvent) else 1
            if isinstance(event, yaml.ScalarEvent) and event.anchor is not None:
                expanded[event.anchor] = 1
            open_[-1][0] += size
            if open_[-1][0] > _MAX_NODES:
                raise ConfigInvalid([FieldError("", too_big)])
    except yaml.YAMLError:
        return


def json_problems(doc: Any) -> list[FieldError]:
    """Everything that would not survive a trip through JSON/JSONB, plus size bounds (which also
    stop alias bombs and self-referencing aliases). Problems come out in document order."""
    problems: list[FieldError] = []
    budget = _MAX_NODES
    # (path, node, depth, problem): a non-None problem is reported when popped, keeping order.
    stack: list[tuple[str, Any, int, str | None]] = [("", doc, 0, None)]
    while stack:
        path, node, depth, problem = stack.pop()
        if problem is not None:
            problems.append(FieldError(path, problem))
            continue
        budget -= 1
        if budget < 0:
            return [
                FieldError("", f"config is too large (more than {_MAX_NODES} values after expanding aliases)")
            ]
        if depth > _MAX_DEPTH:
            return [FieldError(path, f"nested more than {_MAX_DEPTH} levels deep")]
        if isinstance(node, dict):
            for key, value in reversed(node.items()):
                if not isinstance(key, str):
                    stack.append(
                        (join_path(path, str(key)), None, depth, f"keys must be strings (got {yaml_type(key)})")
                    )
                elif _string_problem(key) is not None:
                    stack.append((path, None, depth, f"keys {_string_problem(key)}"))
                else:
                    stack.append((join_path(path, key), value, depth + 1, None))
        elif isinstance(node, list):
            for i in reversed(range(len(node))):
                stack.append((join_path(path, i), node[i], depth + 1, None))
        elif isinstance(node, float):
            if not math.isfinite(node):
                problems.append(FieldError(path, "must be a finite number (got .nan/.inf)"))
        elif isinstance(node, str):
            if _string_problem(node) is not None:
                problems.append(FieldError(path, str(_string_problem(node))))
        elif node is not None and not isinstance(node, (bool, int)):
            problems.append(FieldError(path, f"unsupported YAML value of type {yaml_type(node)}"))
    return problems


def _string_problem(text: str) -> str | None:
    if "\x00" in text:
        return "must not contain NUL characters"
    if _SURROGATE.search(text):
        return "must be valid Unicode (found an unpaired surrogate)"
    return None
