"""Alembic environment: runs migrations on the connection `Database.upgrade` hands over."""

from typing import cast

from alembic import context
from sqlalchemy import create_engine
from sqlmodel import SQLModel

from controlplane.store import models  # noqa: F401  (registers the tables)
from controlplane.store.db import engine_url

config = context.config
target_metadata = SQLModel.metadata


def run() -> None:
    conn = config.attributes.get("connection")
    if conn is not None:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(engine_url(cast(str, config.get_main_option("sqlalchemy.url"))))
    with engine.begin() as connection:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run()
