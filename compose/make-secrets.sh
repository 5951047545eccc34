#!/bin/sh
# Writes the secret files that compose/compose.yaml mounts (Docker secrets) into compose/secrets/,
# or into the folder given as the first argument. Passwords and keys are made once and kept: run
# it again and only the two URLs are written anew, from these variables:
#
#   CLOCKQ_DB_HOST     where clockq reaches PostgreSQL   (default: postgres, the compose service)
#   CLOCKQ_REDIS_HOST  where clockq reaches Redis        (default: redis, the compose service)
#
# On a GPU host, copy the control host's folder (the passwords must be the same), then run
#   CLOCKQ_DB_HOST=control.internal CLOCKQ_REDIS_HOST=control.internal compose/make-secrets.sh
# so that its URLs name the control host's published ports. docs/deploy.md has the whole story.
set -eu

dir=${1:-$(dirname "$0")/secrets}
db_host=${CLOCKQ_DB_HOST:-postgres}
redis_host=${CLOCKQ_REDIS_HOST:-redis}

# The folder is the owner's alone; the files in it are readable by the containers' users
# (clockq's uid 10001, postgres, redis, nobody for Prometheus), because Compose bind-mounts
# them as they are.
umask 077
mkdir -p "$dir"
chmod 700 "$dir"

random() {
    # Letters and digits only, so that a password needs no escaping inside a URL.
    LC_ALL=C tr -dc 'A-Za-z0-9' </dev/urandom | head -c "$1"
}

keep_or_make() {  # NAME LENGTH
    if [ ! -s "$dir/$1" ]; then
        random "$2" >"$dir/$1"
        echo "made $dir/$1"
    fi
    chmod 644 "$dir/$1"
}

write() {  # NAME VALUE
    printf '%s' "$2" >"$dir/$1"
    chmod 644 "$dir/$1"
    echo "wrote $dir/$1"
}

keep_or_make postgres_password 32
keep_or_make redis_password 32
keep_or_make secret_key 64
keep_or_make admin_password 20
keep_or_make clockq_metrics_token 40
keep_or_make grafana_admin_password 20

write database_url "postgres://clockq:$(cat "$dir/postgres_password")@$db_host:5432/clockq"
write redis_url "redis://:$(cat "$dir/redis_password")@$redis_host:6379/0"
