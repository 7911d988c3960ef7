"""Launchers: run a trial's script as several processes (`python -m harness.launch.torch_distributed`)."""
