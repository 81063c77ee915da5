"""The `sparkeos.postgres` sink: rows into a PostgreSQL table, exactly once through prepared transactions."""

SHORT_NAME = "sparkeos.postgres"
