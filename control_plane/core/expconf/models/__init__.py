"""The pydantic models of the experiment config, one module per section (``base`` holds what they
are all made of; ``experiment`` the whole config and its typed accessor for stored rows)."""
