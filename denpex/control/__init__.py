"""Layer 6, the control plane (`denpex server`): store (SQLite | PostgreSQL), ingest (OTLP,
reports), incidents, the REST API, leader election and retention (DESIGN §9).

Heavy dependencies (FastAPI, uvicorn, SQLAlchemy, Alembic, psycopg) are imported by the
modules that need them; importing this package imports none of them.
"""
