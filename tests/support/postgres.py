"""A real PostgreSQL server for tests: sparkeos.chaos.postgres's, where clients connect over TCP to 127.0.0.1 with
trust authentication, except the user `PASSWORD_USER`, who must give `PASSWORD`.
"""

from __future__ import annotations

import sparkeos.chaos.postgres

PASSWORD_USER = "sparkeos_password_user"
PASSWORD = "right-password"


class PostgresServer(sparkeos.chaos.postgres.PostgresServer):
    """The tool's server, with a user who must give a password (`PASSWORD_USER`, `add_password_user`)."""

    def __init__(self, max_prepared_transactions: int = 20):
        super().__init__(max_prepared_transactions, hba=(f"host all {PASSWORD_USER} 127.0.0.1/32 scram-sha-256",))

    def add_password_user(self) -> None:
        from psycopg import sql

        with self.connect() as connection:
            connection.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(PASSWORD_USER), sql.Literal(PASSWORD)))


def prepared_transactions(server: PostgresServer, prefix: str = "sparkeos-") -> list[str]:
    """The global ids of prepared transactions starting with ``prefix``, in any database of the server."""
    with server.connect() as connection:
        return [gid for (gid,) in connection.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s) ORDER BY gid", [prefix])]


def roll_back_prepared_transactions(server: PostgresServer) -> list[str]:
    """Roll back every prepared transaction of the server, each in its own database; returns their global ids."""
    import psycopg
    from psycopg import sql

    with server.connect() as connection:
        prepared = connection.execute("SELECT gid, database FROM pg_prepared_xacts ORDER BY gid").fetchall()
    for gid, database in prepared:
        with psycopg.connect(server.url(dbname=database), autocommit=True) as connection:
            connection.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    return [gid for gid, _database in prepared]
