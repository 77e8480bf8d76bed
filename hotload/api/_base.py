"""Pydantic plumbing shared by the API models: camelCase on the wire, snake_case in Python."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Base of every API object part.

    Fields are snake_case in Python and camelCase in Kubernetes; unknown fields are
    refused (``extra='forbid'``) so a typo in an object is an error, not a silent
    default. Docstrings become the CRD's schema descriptions.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_assignment=True,
    )

    def to_k8s(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, unset optionals left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ApiStatusModel(ApiModel):
    """Status parts tolerate fields they do not know: an older client reading a newer server."""

    model_config = ConfigDict(extra="ignore")
