"""The agent and the harness on Python 3.13 (tests/pythons/__init__.py says what runs and why).

The agent's integration tests run on the agent hosts' Pythons (3.9, 3.10) only."""

from tests.pythons import version_tests

test_the_agent_package_runs, test_the_agent_and_harness_tests_pass = version_tests("3.13", with_master=False)
