"""The sparkeos.postgres data source registered with Spark (the `postgres` server fixture is tests/conftest.py's)."""

from __future__ import annotations

import pytest


@pytest.fixture
def spark_postgres(spark):
    from sparkeos.spark.postgres.datasource import PostgresDataSource

    spark.dataSource.register(PostgresDataSource)
    return spark
