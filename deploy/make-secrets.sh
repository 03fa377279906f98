#!/bin/sh
# Make ./secrets/ for docker-compose.yml (and deploy/compose.replicated.yml) once: random passwords and the URLs built from them.
# The folder is yours alone (0700); its files are 0644 so that the containers' own users
# (dtask, postgres, redis), whose ids are not yours, can read them where Compose mounts them
# (/run/secrets/, where dtask reads its settings). No secret is an environment variable or a
# command-line argument.
set -eu
cd "$(dirname "$0")/.."
umask 077
mkdir -p secrets
chmod 700 secrets
if [ -e secrets/postgres_password ]; then
  echo "secrets/ exists already: remove it first to make new ones" >&2
  exit 1
fi
random() { python3 -c 'import secrets; print(secrets.token_urlsafe(24))'; }
postgres=$(random); owner=$(random); app=$(random); redis=$(random); flower=$(random)
replication=$(random)
printf '%s' "$postgres" > secrets/postgres_password
printf '%s' "$owner" > secrets/dtask_owner_password
printf '%s' "$app" > secrets/dtask_app_password
# migrations run as the owner of dtask's tables; every other service as dtask_app (no DDL)
printf 'postgresql+psycopg://dtask_owner:%s@postgres:5432/dtask' "$owner" > secrets/owner_database_url
printf 'postgresql+psycopg://dtask_app:%s@postgres:5432/dtask' "$app" > secrets/app_database_url
printf 'redis://:%s@redis:6379/0' "$redis" > secrets/broker_url
printf 'requirepass %s\nappendonly yes\n' "$redis" > secrets/redis.conf
printf 'admin:%s' "$flower" > secrets/flower_auth
# deploy/compose.replicated.yml: both PostgreSQL hosts (libpq takes the one that takes writes),
# the broker found through three sentinels (the master's name is DTASK_SENTINEL_MASTER there)
printf '%s' "$replication" > secrets/replication_password
hosts='host=postgres-primary:5432&host=postgres-replica:5432&target_session_attrs=read-write'
printf 'postgresql+psycopg://dtask_owner:%s@/dtask?%s' "$owner" "$hosts" > secrets/replicated_owner_database_url
printf 'postgresql+psycopg://dtask_app:%s@/dtask?%s' "$app" "$hosts" > secrets/replicated_app_database_url
sentinel() { printf 'sentinel://:%s@redis-sentinel-%s:26379/0' "$redis" "$1"; }
printf '%s;%s;%s' "$(sentinel 1)" "$(sentinel 2)" "$(sentinel 3)" > secrets/replicated_broker_url
# masterauth: a primary demoted by the sentinels follows the new one with the same password
printf 'requirepass %s\nmasterauth %s\nappendonly yes\nreplica-announce-ip %s\n' \
  "$redis" "$redis" redis-primary > secrets/redis_primary.conf
printf 'requirepass %s\nmasterauth %s\nappendonly yes\nreplica-announce-ip %s\nreplicaof redis-primary 6379\n' \
  "$redis" "$redis" redis-replica > secrets/redis_replica.conf
printf 'port 26379\nsentinel resolve-hostnames yes\nsentinel announce-hostnames yes\nsentinel monitor dtask redis-primary 6379 2\nsentinel auth-pass dtask %s\nsentinel down-after-milliseconds dtask 5000\nsentinel failover-timeout dtask 60000\n' \
  "$redis" > secrets/sentinel.conf
chmod 644 secrets/*
echo "made secrets/ (Flower: user admin, password in secrets/flower_auth)"
