"""The agent and the harness on Python 3.10 (tests/pythons/__init__.py says what runs and why).

The agent's integration tests run on 3.9 (the oldest agent host's Python) here and on 3.11 in the
main suite; 3.10 runs the rest."""

from tests.pythons import version_tests

test_the_agent_package_runs, test_the_agent_and_harness_tests_pass = version_tests("3.10", with_master=False)
