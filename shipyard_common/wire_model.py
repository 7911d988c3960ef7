"""The base of every JSON model on the wire: camelCase field names like Determined's /api/v1,
snake_case in Python. Shared by the master's API and the agent."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Wire(BaseModel):
    """Unknown fields are ignored: what a newer peer adds must not break an older one."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def to_wire(self) -> dict[str, object]:
        """The JSON object as sent: camelCase names, JSON-ready values."""
        return self.model_dump(mode="json", by_alias=True)


class StrictWire(Wire):
    """Unknown fields are refused with their name: for requests, where a typo must not be ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
