"""Made-up passwords never start with `-` (`det user login admin --password -abc` would read it as an
option: a local cluster's random admin password did, about once in 64 starts)."""

from __future__ import annotations

import secrets

import pytest

from shipyard_common import passwords


def test_a_password_starting_with_a_dash_is_drawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = iter(["-starts-with-dash", "-again", "fine-one"])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: next(drawn))
    assert passwords.generate(12) == "fine-one"


def test_passwords_are_long_random_and_never_start_with_a_dash() -> None:
    made = {passwords.generate(15) for _ in range(2000)}
    assert len(made) == 2000 and all(len(p) == 20 and not p.startswith("-") for p in made)
