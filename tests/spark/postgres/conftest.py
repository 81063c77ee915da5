"""A real PostgreSQL server for the sparkeos.postgres tests, and the data source registered with Spark."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.postgres import PostgresServer


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A server that can prepare transactions, shared by the session; a test that crashes it starts it again."""
    with PostgresServer(max_prepared_transactions=20) as server:
        server.add_password_user()
        yield server


@pytest.fixture
def spark_postgres(spark):
    from sparkeos.spark.postgres.datasource import PostgresDataSource

    spark.dataSource.register(PostgresDataSource)
    return spark
