"""Pydantic building blocks every trtflow schema shares: strict models, field-blaming errors, shape dimensions."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class FieldError(ValueError):
    """A model-level check that blames one field (pydantic would otherwise blame the model)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


# A shape dimension: a real positive integer (YAML `true` or 1.0 are not dimensions), within int32.
Dim = Annotated[int, Field(strict=True, ge=1, le=2**31 - 1)]


class StrictModel(BaseModel):
    """Unknown keys are errors: a typo must never be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)
