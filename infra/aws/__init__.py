"""The AWS stack of `det deploy aws`: infra/aws/program.py."""
