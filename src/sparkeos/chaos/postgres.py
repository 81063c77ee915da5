"""A PostgreSQL server of its own: Debian's initdb and pg_ctl, a cluster in a temporary directory, on a free port.

`sparkeos chaos` starts one for a job that writes to PostgreSQL, so that it can crash and restart the database
without touching one it did not start. initdb and the server refuse to run as root, so as root the cluster belongs to
the unprivileged `postgres` user and every server command runs through `runuser`. Clients connect over TCP to
127.0.0.1 with trust authentication.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..ports import free_port

SERVER_USER = "postgres"
TRUST_LOCAL = ("local all all trust", "host all all 127.0.0.1/32 trust")


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server programs are installed."""


def postgres_bin() -> Path:
    """The bin directory of the newest PostgreSQL installed from Debian's packages."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parent.parent.name))
    if not found:
        raise PostgresUnavailable("no PostgreSQL server found under /usr/lib/postgresql (apt-get install postgresql)")
    return Path(found[-1]).parent


class PostgresServer:
    """One cluster: ``start``, ``crash`` (pg_ctl stop -m immediate), ``start`` again, ``destroy``. ``hba`` lines go
    before those that trust every local connection."""

    def __init__(self, max_prepared_transactions: int = 20, hba: tuple[str, ...] = ()):
        self.bin = postgres_bin()
        self.root = Path(tempfile.mkdtemp(prefix="sparkeos-postgres-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.max_prepared_transactions = max_prepared_transactions
        self.as_root = os.geteuid() == 0
        self.sockets.mkdir()
        if self.as_root:
            shutil.chown(self.root, SERVER_USER)
            shutil.chown(self.sockets, SERVER_USER)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
        (self.data / "pg_hba.conf").write_text("\n".join((*hba, *TRUST_LOCAL)) + "\n")

    def _run(self, program: str, *args: str) -> subprocess.CompletedProcess:
        command = [str(self.bin / program), *args]
        if self.as_root:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{program} failed: {result.stdout}{result.stderr}{log[-3000:]}")
        return result

    def start(self) -> PostgresServer:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.sockets} "
                   f"-c max_prepared_transactions={self.max_prepared_transactions} -c fsync=off")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "-t", "60", "start")
        return self

    def crash(self) -> None:
        """Stop at once, as a crash would: no checkpoint; prepared transactions survive in the WAL."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self.crash()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, user: str = "postgres", password: str | None = None, dbname: str = "postgres") -> str:
        secret = f":{password}" if password is not None else ""
        return f"postgresql://{user}{secret}@127.0.0.1:{self.port}/{dbname}"

    def connect(self, **kwargs):
        import psycopg

        return psycopg.connect(self.url(), autocommit=True, **kwargs)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.destroy()
