#!/bin/sh
# The images' entry point (docker/*.Containerfile): the vendor's environment, then the command.
# `portachat serve` listens on every interface of the container (--host 0.0.0.0, unless --host is given),
# so it requires an API key: $PORTACHAT_API_KEY (comma-separated keys) or --api-key. Without one it stops
# here and says how to set it. Any other command (portachat doctor, bash, python3 scripts/...) runs as given.
set -eu
# CANN (Ascend) and DTK (Hygon) put their libraries on the search paths through these scripts.
for env_script in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/cann/set_env.sh /opt/dtk/env.sh; do
  if [ -f "$env_script" ]; then
    set +u
    . "$env_script" >/dev/null 2>&1 || true
    set -u
  fi
done
if [ "${1:-}" = portachat ] && [ "${2:-}" = serve ]; then
  shift 2
  host=0 port=0 key=0
  for arg in "$@"; do
    case "$arg" in
      --host|--host=*) host=1 ;;
      --port|--port=*) port=1 ;;
      --api-key|--api-key=*) key=1 ;;
    esac
  done
  if [ "$key" = 0 ] && [ -z "${PORTACHAT_API_KEY:-}" ]; then
    echo "portachat image: error: portachat serve listens on 0.0.0.0 in this container, so it requires an API key: run the container with -e PORTACHAT_API_KEY=<key> (clients then send 'Authorization: Bearer <key>')" >&2
    echo "portachat 镜像：错误：容器内的 portachat serve 监听 0.0.0.0，因此必须设置 API 密钥：运行容器时加 -e PORTACHAT_API_KEY=<密钥>（客户端发送 'Authorization: Bearer <密钥>'）" >&2
    exit 2
  fi
  [ "$host" = 1 ] || set -- --host 0.0.0.0 "$@"
  [ "$port" = 1 ] || set -- --port "${PORTACHAT_PORT:-8000}" "$@"
  set -- portachat serve "$@"
fi
exec "$@"
