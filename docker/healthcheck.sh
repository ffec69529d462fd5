#!/usr/bin/env bash
# docker/healthcheck.sh, installed in the images as spillway-healthcheck: the HEALTHCHECK.
# GET /healthz on the worker's metrics endpoint with bash's /dev/tcp (the slim runtime image has
# no curl or wget). Exit 0: healthy (HTTP 200), 1: not.
#
#   spillway-healthcheck [PORT [HOST]]
#
# Without PORT: the effective metrics.port / metrics.bind of `spillway config -c CONF` (CONF =
# $SPILLWAY_HEALTHCHECK_CONF, default /etc/spillway/worker.conf; the SPILLWAY_* environment of the
# container applies as it does to the worker; metrics.health_port instead when it is set), else $SPILLWAY_METRICS_PORT, else 9464. A bind
# address of 0.0.0.0 / :: is asked on loopback. metrics.port = 0 (metrics off) has no endpoint to
# ask: reported healthy, with a message, rather than marking every such container unhealthy.
set -u
port=${1:-}
host=${2:-}
if [ -z "$port" ]; then
  conf=${SPILLWAY_HEALTHCHECK_CONF:-/etc/spillway/worker.conf}
  if command -v spillway >/dev/null 2>&1 && [ -r "$conf" ] &&
     eff=$(spillway config -c "$conf" 2>/dev/null); then
    # lines: "key = value # source"; an empty value leaves "#" in the value's place
    port=$(printf '%s\n' "$eff" | awk '$1 == "metrics.port" && $3 != "#" { print $3; exit }')
    # metrics.health_port, when set, is the port no scraper can crowd (README, Metrics)
    hport=$(printf '%s\n' "$eff" | awk '$1 == "metrics.health_port" && $3 != "#" { print $3; exit }')
    case "$port:${hport:-0}" in
      0:* | *:0) ;;
      *) port=$hport ;;
    esac
    [ -n "$host" ] || host=$(printf '%s\n' "$eff" | awk '$1 == "metrics.bind" && $3 != "#" { print $3; exit }')
  fi
  port=${port:-${SPILLWAY_METRICS_PORT:-9464}}
fi
case "$port" in
  '' | *[!0-9]*) echo "unhealthy: metrics port '$port' is not a number"; exit 1 ;;
esac
if [ "$port" -eq 0 ]; then
  echo "metrics.port = 0: no /healthz endpoint, not checked"
  exit 0
fi
case "$host" in
  '' | 0.0.0.0 | '*') host=127.0.0.1 ;;
  '::' | '[::]') host=::1 ;;
esac
if ! exec 3<>"/dev/tcp/$host/$port"; then
  echo "unhealthy: cannot connect to $host:$port"
  exit 1
fi 2>/dev/null
printf 'GET /healthz HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n' "$host" >&3
status=""
IFS= read -r -t 4 status <&3 || true
status=${status%$'\r'}
# drain the rest (headers, "ok"): the server closes after it (HTTP/1.0), so this ends at once
while IFS= read -r -t 1 _ <&3; do :; done
exec 3>&-
case "$status" in
  "HTTP/"*" 200"*) echo "healthy: $status"; exit 0 ;;
esac
echo "unhealthy: GET http://$host:$port/healthz: ${status:-no answer}"
exit 1
