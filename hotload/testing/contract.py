"""The released engines' HTTP contract, as ``hack/engine-fixtures`` extracted it.

``tests/fixtures/engines/<engine>-<version>/`` holds the route table and the
request/response models read from the released SGLang and vLLM wheels. This module loads
them and answers two questions with them, for the contract tests and the fake engines
alike: is this request one the released server accepts (method, path, query parameters,
body fields and their types), and is this answer one it could give (only keys its
handler or model produces). Types are checked from the annotation text the extraction
kept (``Optional[str]``, ``Literal['a', 'b']``, ``list[WeightVersionSpan] | None``…);
names it cannot resolve are accepted rather than guessed.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Final

from hotload.errors import ConfigError

#: The engine releases the adapters are written against (``hack/engine-versions.env``).
PINNED: Final[dict[str, str]] = {"sglang": "0.5.23", "vllm": "0.33.0"}

_TRUE = {"1", "true", "on", "yes", "t", "y"}
_FALSE = {"0", "false", "off", "no", "f", "n"}


class ContractViolation(AssertionError):
    """A request or answer the released server would not send or accept, and why."""


def fixtures_root() -> Path | None:
    """``tests/fixtures/engines`` of the checkout this package runs from, if any."""
    candidate = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "engines"
    return candidate if candidate.is_dir() else None


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    spec: Mapping[str, Any]

    @property
    def auth(self) -> str:
        """SGLang's auth level of the handler (``normal``, ``admin_optional``, ...)."""
        return str(self.spec.get("auth", "normal"))

    @property
    def requires_env(self) -> tuple[str, ...]:
        """vLLM: environment flags without which the route does not exist."""
        return tuple(self.spec.get("requires_env", ()))


class EngineContract:
    """Routes, models and settings of one released engine version."""

    def __init__(self, engine: str, version: str, directory: Path) -> None:
        self.engine = engine
        self.version = version
        self.directory = directory
        self.routes: dict[tuple[str, str], Route] = {}
        for spec in self._read("routes.json")["routes"]:
            route = Route(spec["method"], spec["path"], spec)
            self.routes.setdefault((route.method, route.path), route)
        models = self._read("models.json")
        self.models: dict[str, dict[str, Any]] = models["models"]
        self.aliases: dict[str, str] = models.get("aliases", {})
        self.settings: dict[str, Any] = self._read("settings.json")["settings"]

    @classmethod
    def load(cls, engine: str, directory: Path | None = None) -> EngineContract:
        """The pinned version's contract (from the checkout's fixtures unless given)."""
        return _load(engine, directory)

    def _read(self, name: str) -> dict[str, Any]:
        path = self.directory / name
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError("engine contract fixture unreadable", path=str(path)) from err
        return data

    # --- requests -----------------------------------------------------------------

    def route(self, method: str, path: str) -> Route:
        route = self.routes.get((method.upper(), path))
        if route is None:
            same_path = sorted(m for m, p in self.routes if p == path)
            hint = f" (it has {', '.join(same_path)})" if same_path else ""
            raise ContractViolation(
                f"{self.engine} {self.version} has no route {method.upper()} {path}{hint}"
            )
        return route

    def check_request(
        self,
        method: str,
        path: str,
        query: Mapping[str, list[str]] | None = None,
        body: Any = None,
        *,
        content_type: str | None = None,
    ) -> Route:
        """The route, or ``ContractViolation`` saying what the released server would refuse
        (or silently ignore: an unknown field is a request that does not do what we think)."""
        route = self.route(method, path)
        where = f"{self.engine} {self.version} {route.method} {route.path}"
        params: dict[str, Any] = route.spec.get("query", {})
        for name, values in (query or {}).items():
            if name not in params:
                raise ContractViolation(f"{where}: unknown query parameter {name!r}")
            for value in values:
                if not self.query_value_ok(params[name]["type"], value):
                    raise ContractViolation(
                        f"{where}: query {name}={value!r} is not a {params[name]['type']}"
                    )
        for name, param in params.items():
            if param["required"] and name not in (query or {}):
                raise ContractViolation(f"{where}: required query parameter {name!r} missing")
        spec = route.spec.get("body")
        if spec is None:
            if body not in (None, {}, b""):
                raise ContractViolation(f"{where}: takes no body, got {body!r}")
            return route
        json_required = route.spec.get("json_content_type_required") and body is not None
        if json_required and content_type is not None and "application/json" not in content_type:
            raise ContractViolation(f"{where}: needs Content-Type application/json")
        if "model" in spec:
            if body is None:
                if not spec.get("optional"):
                    raise ContractViolation(f"{where}: needs a JSON body ({spec['model']})")
                return route
            self.check_object(spec["model"], body, where=where)
        elif "fields" in spec:
            self._check_fields(spec["fields"], body, where=where)
        elif "raw_keys" in spec:
            if not isinstance(body, Mapping):
                raise ContractViolation(f"{where}: the body must be a JSON object")
            unknown = sorted(set(body) - set(spec["raw_keys"]))
            if unknown:
                raise ContractViolation(f"{where}: the handler never reads {unknown}")
        return route

    def check_object(self, model: str, value: Any, *, where: str = "") -> None:
        """``value`` is a JSON object the model accepts: known fields, required ones, types."""
        if model not in self.models:
            raise ContractViolation(f"{where}: no model {model} in the {self.engine} fixtures")
        self._check_fields(self.models[model]["fields"], value, where=f"{where} {model}".strip())

    def _check_fields(self, fields: Mapping[str, Any], value: Any, *, where: str) -> None:
        if not isinstance(value, Mapping):
            raise ContractViolation(f"{where}: expected a JSON object, got {value!r}")
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ContractViolation(
                f"{where}: unknown field(s) {unknown} (known: {sorted(fields)})"
            )
        for name, spec in fields.items():
            if name not in value:
                if spec["required"]:
                    raise ContractViolation(f"{where}: required field {name!r} missing")
                continue
            if not self.value_ok(spec["type"], value[name], where=f"{where}.{name}"):
                raise ContractViolation(f"{where}.{name}={value[name]!r} is not a {spec['type']}")

    # --- answers ------------------------------------------------------------------

    def check_answer(self, method: str, path: str, payload: Any) -> None:
        """``payload`` holds only keys the released handler (or its answer model) produces."""
        route = self.route(method, path)
        where = f"{self.engine} {self.version} {route.method} {route.path} answer"
        models = route.spec.get("answer_models")
        if models:
            problems = []
            for model in models:
                try:
                    self.check_object(model, payload, where=where)
                    return
                except ContractViolation as err:
                    problems.append(str(err))
            raise ContractViolation("; ".join(problems))
        keys = set(route.spec.get("answer_keys", ()))
        if not isinstance(payload, Mapping):
            return  # plain text or an empty body: nothing keyed to check
        unknown = sorted(set(payload) - keys)
        if unknown:
            raise ContractViolation(
                f"{where}: the handler never answers {unknown} (only {sorted(keys)})"
            )

    def example(self, model: str, /, **values: Any) -> dict[str, Any]:
        """An instance of ``model`` as the server serialises it: every field with a literal
        default, placeholders for required ones, ``values`` on top (checked, nested too)."""
        if model not in self.models:
            raise ContractViolation(f"no model {model} in the {self.engine} fixtures")
        fields = self.models[model]["fields"]
        out: dict[str, Any] = {}
        for name, spec in fields.items():
            if name in values:
                continue
            default = spec["default"]
            computed = isinstance(default, str) and default.startswith("<")
            if spec["required"] or computed:  # a factory's value is always serialised
                out[name] = self._placeholder(spec["type"])
            else:
                out[name] = default
        out.update(values)
        self.check_object(model, out, where="example")
        return out

    def _placeholder(self, type_text: str) -> Any:
        node = _parse(type_text)
        return _placeholder_for(node, self)

    # --- types --------------------------------------------------------------------

    def value_ok(self, type_text: str, value: Any, *, where: str = "") -> bool:
        return _matches(_parse(type_text), value, self, where)

    def query_value_ok(self, type_text: str, text: str) -> bool:
        """A query string FastAPI would convert to ``type_text``."""
        node = _parse(type_text)
        return any(_query_matches(option, text, self) for option in _options(node, self))


@cache
def _load(engine: str, directory: Path | None) -> EngineContract:
    if engine not in PINNED:
        raise ConfigError("no contract for this engine", engine=engine)
    version = PINNED[engine]
    if directory is None:
        root = fixtures_root()
        if root is None:
            raise ConfigError(
                "engine contract fixtures not found (they live in the checkout's "
                "tests/fixtures/engines; pass the directory explicitly)",
                engine=engine,
            )
        directory = root / f"{engine}-{version}"
    return EngineContract(engine, version, directory)


@cache
def _parse(type_text: str) -> ast.expr:
    try:
        return ast.parse(type_text, mode="eval").body
    except SyntaxError:
        return ast.Name(id="Any")


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value  # a forward reference: 'Model'
    return ""


def _args(node: ast.Subscript) -> list[ast.expr]:
    return list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]


def _options(node: ast.expr, contract: EngineContract) -> list[ast.expr]:
    """The alternatives of a union (``X | Y``, ``Union``, ``Optional``, aliases)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _options(node.left, contract) + _options(node.right, contract)
    if isinstance(node, ast.Subscript):
        head = _name(node.value)
        if head == "Union":
            return [o for arg in _args(node) for o in _options(arg, contract)]
        if head == "Optional":
            return [ast.Constant(value=None), *_options(_args(node)[0], contract)]
        if head == "Annotated":
            return _options(_args(node)[0], contract)
    name = _name(node)
    if name in contract.aliases:
        return _options(_parse(contract.aliases[name]), contract)
    return [node]


def _matches(node: ast.expr, value: Any, contract: EngineContract, where: str) -> bool:
    return any(_matches_one(o, value, contract, where) for o in _options(node, contract))


def _matches_one(node: ast.expr, value: Any, contract: EngineContract, where: str) -> bool:
    if isinstance(node, ast.Constant):
        return node.value is None and value is None
    if isinstance(node, ast.Subscript):
        head = _name(node.value)
        args = _args(node)
        if head == "Literal":
            return any(isinstance(a, ast.Constant) and a.value == value for a in args)
        if head in {"List", "list", "Sequence", "Iterable", "Set", "set", "Tuple", "tuple"}:
            return isinstance(value, list) and all(
                _matches(args[0], item, contract, where) for item in value
            )
        if head in {"Dict", "dict", "Mapping"}:
            return isinstance(value, Mapping) and all(
                isinstance(k, str) and _matches(args[-1], v, contract, where)
                for k, v in value.items()
            )
        return True  # a generic we do not model: accept
    name = _name(node)
    if name in {"Any", "object", ""}:
        return True
    if name == "None":
        return value is None
    if name == "str":
        return isinstance(value, str)
    if name == "bool":
        return isinstance(value, bool)
    if name == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if name in {"dict", "Dict"}:
        return isinstance(value, Mapping)
    if name in {"list", "List"}:
        return isinstance(value, list)
    if name in contract.models:
        try:
            contract.check_object(name, value, where=where)
        except ContractViolation:
            return False
        return True
    return True  # unresolved (a type from elsewhere): accept rather than guess


def _query_matches(node: ast.expr, text: str, contract: EngineContract) -> bool:
    if isinstance(node, ast.Subscript) and _name(node.value) == "Literal":
        return any(isinstance(a, ast.Constant) and str(a.value) == text for a in _args(node))
    name = _name(node)
    if name == "bool":
        return text.lower() in _TRUE | _FALSE
    if name == "int":
        try:
            int(text)
        except ValueError:
            return False
        return True
    if name == "float":
        try:
            float(text)
        except ValueError:
            return False
        return True
    return not (isinstance(node, ast.Constant) and node.value is None)


def _placeholder_for(node: ast.expr, contract: EngineContract) -> Any:
    option = next(
        (o for o in _options(node, contract) if not (isinstance(o, ast.Constant))),
        None,
    )
    if option is None:
        return None
    if isinstance(option, ast.Subscript):
        head = _name(option.value)
        if head == "Literal":
            first = _args(option)[0]
            return first.value if isinstance(first, ast.Constant) else None
        if head in {"List", "list", "Sequence", "Tuple", "tuple"}:
            return []
        if head in {"Dict", "dict", "Mapping"}:
            return {}
    name = _name(option)
    defaults: dict[str, Any] = {"str": "x", "int": 0, "float": 0.0, "bool": False}
    if name in defaults:
        return defaults[name]
    if name in contract.models:
        return contract.example(name)
    return None


def parse_bool_query(text: str) -> bool:
    """FastAPI's reading of a boolean query parameter (``ValueError`` otherwise)."""
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"not a boolean: {text!r}")
