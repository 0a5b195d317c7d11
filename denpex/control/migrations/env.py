"""Alembic environment for the control plane's store: always run in-process by
denpex.control.db.migrate() on a connection it passes in (a user never runs Alembic or SQL).
"""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, transaction_per_migration=True)
with context.begin_transaction():
    context.run_migrations()
