"""The agent and the harness on Python 3.9 (tests/pythons/__init__.py says what runs and why)."""

from tests.pythons import version_tests

test_the_agent_package_runs, test_the_agent_and_harness_tests_pass = version_tests("3.9")
