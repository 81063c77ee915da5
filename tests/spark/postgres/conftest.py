"""The sparkeos.postgres data source registered with Spark (the `postgres` server fixture is tests/conftest.py's)."""

from __future__ import annotations

import pytest


@pytest.fixture
def spark_postgres(spark):
    from sparkeos.spark.postgres.datasource import PostgresDataSource

    spark.dataSource.register(PostgresDataSource)
    return spark


@pytest.fixture(autouse=True)
def no_prepared_transactions_of_earlier_tests(request):
    """Each test starts on a server without prepared transactions, so that one left by an earlier test (a query
    stopped between its decision and its commits, whose restart never ran: a test that failed, or one re-run after
    Spark's "Python worker failed to connect back") is not counted against it. Tests still check that they leave
    none of their own."""
    if "postgres" in request.fixturenames:
        from support.postgres import roll_back_prepared_transactions

        roll_back_prepared_transactions(request.getfixturevalue("postgres"))
