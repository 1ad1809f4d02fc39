#!/usr/bin/env bash
# Make the secrets compose.yaml mounts: a private CA with certificates for the API,
# etcd and Redis, random passwords, a sample key and an admin token for /metrics.
# Idempotent: an existing file is kept. Needs openssl.
#   secrets.sh [DIR]    (default: secrets/ beside this script)
set -euo pipefail
out=${1:-"$(dirname "$0")/secrets"}
mkdir -p "$out" && chmod 700 "$out" && cd "$out"
umask 077

random() { head -c 32 /dev/urandom | base64 | tr -d '/+=\n' | head -c 40; }
keep() { [ -s "$1" ]; }

keep ca.pem || openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -days 825 -subj "/CN=canary compose CA" -keyout ca-key.pem -out ca.pem 2>/dev/null

issue() {  # name host
  keep "$1.pem" && return
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$2" \
    -keyout "$1-key.pem" -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=DNS:%s,DNS:localhost,IP:127.0.0.1\n' "$2" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 825 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
issue api control-plane
issue etcd etcd
issue redis redis

for name in etcd_password etcd_root_password redis_password postgres_password admin_token; do
  keep "$name" || random > "$name"
done
keep sample_keys || echo "k1:$(head -c 32 /dev/urandom | base64)" > sample_keys
keep database_url ||
  echo "postgresql+psycopg://canary:$(cat postgres_password)@postgres:5432/canary" > database_url
echo "secrets in $(pwd)"
