"""The base of every model read from a file (config, machine specs, scenarios):
frozen once validated, and an unknown field is an error, not silently ignored."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
