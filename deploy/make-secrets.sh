#!/bin/sh
# Make ./secrets/ for docker-compose.yml once: random passwords and the URLs built from them.
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
printf '%s' "$postgres" > secrets/postgres_password
printf '%s' "$owner" > secrets/dtask_owner_password
printf '%s' "$app" > secrets/dtask_app_password
# migrations run as the owner of dtask's tables; every other service as dtask_app (no DDL)
printf 'postgresql+psycopg://dtask_owner:%s@postgres:5432/dtask' "$owner" > secrets/owner_database_url
printf 'postgresql+psycopg://dtask_app:%s@postgres:5432/dtask' "$app" > secrets/app_database_url
printf 'redis://:%s@redis:6379/0' "$redis" > secrets/broker_url
printf 'requirepass %s\nappendonly yes\n' "$redis" > secrets/redis.conf
printf 'admin:%s' "$flower" > secrets/flower_auth
chmod 644 secrets/*
echo "made secrets/ (Flower: user admin, password in secrets/flower_auth)"
