"""agent_bootstrap/agent/runtime/harness_libs.py without Docker or pip: the probe's answer, the pip
command for another Python, the directory keyed by the pins, and pip's failure as one readable
error (a fake `pip` that fails). The real install runs in tests/docker/test_harness_libs.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent_bootstrap.agent.pins import agent_constraints
from agent_bootstrap.agent.runtime import harness_libs


@pytest.mark.parametrize(("text", "expected"), [("3.9\n", (3, 9)), ("warning: x\n3.12\n", (3, 12)),
                                                ("", None), ("Python 3\n", None)])
def test_the_probe_answer_is_the_image_pythons_version(text: str, expected: tuple[int, int] | None) -> None:
    assert harness_libs.parse_version(text) == expected


def test_the_directory_and_pins_follow_the_images_python(tmp_path: Path) -> None:
    libs = harness_libs.HarnessLibs(tmp_path, ["requests", "tenacity", "boto3"])
    old, new = libs.path_for((3, 9)), libs.path_for((3, 12))
    assert old.name.startswith("py3.9-") and new.name.startswith("py3.12-") and old != new
    # urllib3 is pinned per Python (botocore needs 1.26 on 3.9): each directory gets its own.
    assert agent_constraints((3, 9))["urllib3"] != agent_constraints((3, 12))["urllib3"]
    cmd = harness_libs.pip_command((3, 9), old, tmp_path / "c.txt", libs.requirements)
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"]
    assert cmd[cmd.index("--python-version") + 1] == "3.9" and "--only-binary=:all:" in cmd
    assert harness_libs.HarnessLibs(tmp_path, ["requests"]).path_for((3, 9)) != old  # other requirements


def test_a_failed_pip_is_one_readable_error_and_leaves_nothing(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ERROR: No matching distribution found for boto3==1.42.97' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(harness_libs.sys, "executable", str(fake))
    libs = harness_libs.HarnessLibs(tmp_path / "libs", ["boto3"])
    with pytest.raises(harness_libs.HarnessLibsUnavailable, match="Python 3.10 failed: ERROR: No matching"):
        libs.ensure((3, 10))
    assert list((tmp_path / "libs").iterdir()) == []
