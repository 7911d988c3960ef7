"""Domain services: what the API and the loops call to change the record."""
