"""Pure decision cores: no I/O, no clock, no database, no provider."""
