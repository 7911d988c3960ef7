"""The record: SQLAlchemy models, the engine and sessions, and Alembic migrations."""
