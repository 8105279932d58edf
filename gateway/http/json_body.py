"""Request bodies validated with JSON's own types, the way the OpenAPI document (JSON Schema) reads them.

Pydantic's lax mode takes ``false`` or ``"1"`` for an integer and ``"yes"`` for a boolean, which the
document refuses; its strict mode refuses ``2.0`` for an integer, which JSON Schema counts as one. So a body
is validated strictly after every integral number (``2.0``) has become an integer: what the document
accepts, the server accepts, and what it refuses, the server refuses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar, cast

from litestar._signature.types import ExtendedMsgSpecValidationError  # what Litestar renders as a 400
from litestar.plugins.pydantic import PydanticInitPlugin
from litestar.plugins.pydantic.plugins.init import is_pydantic_v2_model_class
from pydantic import BaseModel, ValidationError


def integral_numbers(value: Any) -> Any:
    """``value`` with every float that is a whole number (``2.0``, ``1e3``) an ``int``, at any depth."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: integral_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [integral_numbers(item) for item in value]
    return value


Model = TypeVar("Model", bound=BaseModel)


def validate_json_body(model: type[Model], value: Any) -> Model:
    """``model`` from a decoded JSON body, by JSON's types (pydantic's ValidationError on a mismatch)."""
    return model.model_validate(integral_numbers(value), strict=True)


def _decode(model: type[BaseModel], value: Any) -> BaseModel:
    try:
        return validate_json_body(model, value)
    except ValidationError as exc:
        errors = cast("list[dict[str, Any]]", exc.errors(include_input=False))
        raise ExtendedMsgSpecValidationError(errors=errors) from exc


Decoder = tuple[Callable[[Any], bool], Callable[[Any, Any], Any]]


class JsonTypesPlugin(PydanticInitPlugin):
    """Litestar's pydantic plugin, its body decoder replaced by ``validate_json_body``."""

    @classmethod
    def decoders(cls, validate_strict: bool = False) -> list[Decoder]:
        """Ours first: Litestar uses the first decoder whose predicate takes the type."""
        return [(is_pydantic_v2_model_class, _decode), *super().decoders(validate_strict)]
