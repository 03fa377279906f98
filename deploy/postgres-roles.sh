#!/bin/sh
# PostgreSQL's first start (docker-entrypoint-initdb.d): the roles dtask runs as. dtask_owner
# owns dtask's tables (it runs `dtask migrate`); dtask_app, which every worker, beat, Flower
# and API process uses, may read and write rows but not change the schema. The superuser
# `postgres` is for the operator only.
set -eu
SECRETS="${DTASK_SECRETS_DIR:-/run/secrets}"
# the passwords reach psql through its environment, not its command line (ps shows that)
DTASK_OWNER_PASSWORD="$(cat "$SECRETS/dtask_owner_password")" \
DTASK_APP_PASSWORD="$(cat "$SECRETS/dtask_app_password")" \
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v db="$POSTGRES_DB" <<'SQL'
\getenv owner DTASK_OWNER_PASSWORD
\getenv app DTASK_APP_PASSWORD
CREATE ROLE dtask_owner LOGIN PASSWORD :'owner';
CREATE ROLE dtask_app LOGIN PASSWORD :'app';
REVOKE ALL ON DATABASE :"db" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"db" TO dtask_owner, dtask_app;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA public TO dtask_owner;
GRANT USAGE ON SCHEMA public TO dtask_app;
ALTER DEFAULT PRIVILEGES FOR ROLE dtask_owner IN SCHEMA public
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO dtask_app;
ALTER DEFAULT PRIVILEGES FOR ROLE dtask_owner IN SCHEMA public
  GRANT USAGE, SELECT ON SEQUENCES TO dtask_app;
SQL
