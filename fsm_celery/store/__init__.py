"""PostgreSQL (or SQLite for the embedded demo) through SQLAlchemy Core."""
