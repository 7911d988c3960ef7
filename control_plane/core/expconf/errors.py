"""How a refused config says why: one ``FieldError`` per problem, all of them in ``ConfigInvalid``."""

from dataclasses import dataclass

__all__ = ["ConfigInvalid", "FieldError"]


@dataclass(frozen=True)
class FieldError:
    """One problem in a config. ``path`` is dotted with list indices in brackets
    (``searcher.max_length``, ``bind_mounts[0].host_path``); ``""`` means the whole document."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path or '(config)'}: {self.reason}"


class ConfigInvalid(Exception):
    """The config was refused; ``errors`` lists every problem found, not just the first."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = list(errors)
        super().__init__(str(self))

    def __str__(self) -> str:
        n = len(self.errors)
        lines = [f"invalid experiment configuration ({n} error{'s' if n != 1 else ''}):"]
        lines += [f"  {e}" for e in self.errors]
        return "\n".join(lines)
