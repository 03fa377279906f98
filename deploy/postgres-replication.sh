#!/bin/sh
# The primary's first start (docker-entrypoint-initdb.d, deploy/compose.replicated.yml): a role
# the standby streams WAL as, and the line of pg_hba.conf that lets it in with a password.
set -eu
SECRETS="${DTASK_SECRETS_DIR:-/run/secrets}"
# the password reaches psql through its environment, not its command line (ps shows that)
DTASK_REPLICATION_PASSWORD="$(cat "$SECRETS/replication_password")" \
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
\getenv password DTASK_REPLICATION_PASSWORD
CREATE ROLE replicator REPLICATION LOGIN PASSWORD :'password';
SQL
echo "host replication replicator all scram-sha-256" >> "$PGDATA/pg_hba.conf"
