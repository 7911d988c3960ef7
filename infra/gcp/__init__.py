"""The GCP stack of `det deploy gcp`: infra/gcp/program.py."""
