"""Persistence: SQLAlchemy tables, queries and Alembic migrations (SQLite and PostgreSQL)."""
