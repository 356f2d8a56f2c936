#!/usr/bin/env bash
# A local PostgreSQL server for trying `sql` storage, started from the system's binaries
# (Debian/Ubuntu: apt-get install postgresql). Works as root too: PostgreSQL refuses to run
# as root, so there the server runs as the `postgres` system user.
#
#   eval "$(examples/decoupled/postgres.sh start /var/tmp/trinity-pg)"   # exports TRINITY_BUFFER_URL
#   examples/decoupled/postgres.sh stop /var/tmp/trinity-pg
#
# It listens on 127.0.0.1 only (port 5433 unless PGPORT is set), keeps everything in the
# folder given, and creates the database `rl` owned by user `trinity` with a random password.
# The URL needs the driver: pip install -e ".[postgres]".
set -euo pipefail
action=${1:?usage: postgres.sh start|stop FOLDER}
root=$(realpath -m "${2:?usage: postgres.sh start|stop FOLDER}")
port=${PGPORT:-5433}
# Debian keeps the server's programs beside each other under /usr/lib/postgresql/<version>/bin.
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$bin" ] || bin=$(dirname "$(command -v pg_ctl || echo /missing/pg_ctl)")
for program in initdb pg_ctl psql createdb; do
    [ -x "$bin/$program" ] || { echo "PostgreSQL not found ($program): apt-get install postgresql" >&2; exit 1; }
done
as_server=()
if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    as_server=(runuser -u postgres --)
fi
case $action in
start)
    if [ ! -d "$root/data" ]; then
        mkdir -p "$root"
        [ ${#as_server[@]} -eq 0 ] || chown postgres "$root"
        password=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
        "${as_server[@]}" sh -c "umask 077; echo '$password' > '$root/password'"
        "${as_server[@]}" "$bin/initdb" -D "$root/data" -U trinity --pwfile="$root/password" \
            --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 >/dev/null
    fi
    if ! "${as_server[@]}" "$bin/pg_ctl" -D "$root/data" status >/dev/null; then
        "${as_server[@]}" "$bin/pg_ctl" -D "$root/data" -l "$root/server.log" -w start \
            -o "-h 127.0.0.1 -p $port -k $root" >/dev/null
    fi
    "${as_server[@]}" "$bin/psql" -h "$root" -p "$port" -U trinity -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = 'rl'" | grep -q 1 ||
        "${as_server[@]}" "$bin/createdb" -h "$root" -p "$port" -U trinity rl
    password=$("${as_server[@]}" cat "$root/password")
    echo "export TRINITY_BUFFER_URL=postgresql+psycopg://trinity:$password@127.0.0.1:$port/rl"
    ;;
stop)
    "${as_server[@]}" "$bin/pg_ctl" -D "$root/data" -m fast -w stop >/dev/null
    ;;
*)
    echo "usage: postgres.sh start|stop FOLDER" >&2
    exit 2
    ;;
esac
