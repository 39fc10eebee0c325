"""The JSON Schemas of the input formats (files beside the modules that read them), applied with the key of the
first error named; arrays of non-negative integers (token ids, tens of thousands per line) are checked in one pass.

jsonschema is imported on first use: the CLI imports every reader at start-up."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache
from importlib import resources

_NON_NEGATIVE_INT = {"type": "integer", "minimum": 0}


def _short(x: object, limit: int = 80) -> str:
    """A value as an error message quotes it, cut to `limit` characters."""
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@lru_cache(maxsize=1)
def _validator_class():
    """Draft 2020-12 where an integer is a JSON integer (not 1.0, not a boolean), with a one-pass `items` for arrays
    of non-negative integers (the generic rule's result, faster)."""
    import jsonschema
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

    def is_integer(checker, instance: object) -> bool:
        return isinstance(instance, int) and not isinstance(instance, bool)

    def items(validator, value, instance, schema) -> Iterator[ValidationError]:
        if value == _NON_NEGATIVE_INT and isinstance(instance, list):
            for i, x in enumerate(instance):
                if type(x) is not int:
                    yield ValidationError(f"{_short(x)} is not of type 'integer'", path=[i])
                    return
                if x < 0:
                    yield ValidationError(f"{x} is less than the minimum of 0", path=[i])
                    return
            return
        yield from Draft202012Validator.VALIDATORS["items"](validator, value, instance, schema)

    return jsonschema.validators.extend(
        Draft202012Validator, {"items": items},
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", is_integer))


@lru_cache(maxsize=None)
def validator(package: str, name: str):
    """The validator of the schema file `name` shipped in `package` (checked once against the metaschema)."""
    schema = json.loads(resources.files(package).joinpath(name).read_text(encoding="utf-8"))
    cls = _validator_class()
    cls.check_schema(schema)
    return cls(schema)


def json_type(x: object) -> str:
    """The JSON type name of a parsed value."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "boolean"
    return {int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(type(x), type(x).__name__)


def key_path(path) -> str:
    """A JSON location as the error messages write it: `gpus[1].slots[0]` (empty for the document itself)."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def first_error(package: str, name: str, doc: object) -> str | None:
    """`key '<path>': <what is wrong>` for the most relevant error of `doc` against the schema, or None if valid."""
    from jsonschema.exceptions import best_match

    err = best_match(validator(package, name).iter_errors(doc))
    if err is None:
        return None
    message = err.message
    if err.validator == "type":
        wanted = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        message = f"expected {' or '.join(map(str, wanted))}, got {json_type(err.instance)} {_short(err.instance, 40)}"
    alternatives = err.validator_value if err.validator in ("anyOf", "oneOf") else None
    if alternatives and all(isinstance(a, dict) and a.get("required") for a in alternatives):
        message = "expected the keys " + " or ".join(", ".join(a["required"]) for a in alternatives)
    message = message if len(message) <= 200 else message[:197] + "..."
    where = key_path(err.absolute_path)
    return f"key '{where}': {message}" if where else message
