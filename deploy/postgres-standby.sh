#!/bin/sh
# The standby of deploy/compose.replicated.yml: on its first start, a copy of the primary
# (pg_basebackup -R writes the primary's address, and so the replication password, into the
# standby's own data folder, 0700); then a hot standby streaming from it, until promoted
# (docs/deployment.md).
set -eu
SECRETS="${DTASK_SECRETS_DIR:-/run/secrets}"
PRIMARY_PORT="${DTASK_PRIMARY_PORT:-5432}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  until pg_isready -q -h "$DTASK_PRIMARY_HOST" -p "$PRIMARY_PORT" -U replicator; do sleep 1; done
  # the password reaches pg_basebackup through its environment, not its command line
  PGPASSWORD="$(cat "$SECRETS/replication_password")" pg_basebackup -h "$DTASK_PRIMARY_HOST" \
    -p "$PRIMARY_PORT" -U replicator -D "$PGDATA" -R -X stream -c fast
  chmod 700 "$PGDATA"
fi
exec postgres
