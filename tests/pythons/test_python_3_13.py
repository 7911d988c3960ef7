"""The agent and the harness on Python 3.13 (tests/pythons/__init__.py says what runs and why).

The agent's integration tests run on 3.9 only (tests/pythons/__init__.py)."""

from tests.pythons import version_tests

test_the_agent_package_runs, test_the_agent_and_harness_tests_pass = version_tests("3.13", with_master=False)
