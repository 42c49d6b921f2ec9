#!/bin/sh
# The root step of every portachat image (docker/*.Containerfile): what scripts/setup.sh needs from the
# system when the vendor's base lacks it, the non-root user, and the PORTACHAT_HOME volume's directory.
#   PORTACHAT_SYSTEM_NEEDS  python (>= 3.10 with venv), bwrap (the code sandbox), cc (portachat's CPU
#                           kernels; the CPU image only). Each is installed only when missing, so a base
#                           that already has them (a CANN or DTK image's own Python) is left as it is.
set -eu
needs="${PORTACHAT_SYSTEM_NEEDS:-python bwrap}"
has() {
  case "$1" in
    python) python3 -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null ;;
    bwrap) command -v bwrap >/dev/null 2>&1 ;;
    cc) command -v cc >/dev/null 2>&1 ;;
    *) echo "[image] unknown need '$1' (valid: python bwrap cc)" >&2; exit 2 ;;
  esac
}
missing=""
for need in $needs; do has "$need" || missing="$missing $need"; done
if [ -n "$missing" ]; then
  echo "[image] installing what the base lacks:$missing"
  if command -v apt-get >/dev/null 2>&1; then  # Debian, Ubuntu (NVIDIA, ROCm, most CANN and DTK bases)
    pkgs=$(echo "$missing" | sed 's/python/python3 python3-venv/; s/bwrap/bubblewrap/; s/cc/gcc libc6-dev/')
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $pkgs
    rm -rf /var/lib/apt/lists/*
  elif command -v dnf >/dev/null 2>&1 || command -v yum >/dev/null 2>&1; then  # openEuler, CentOS
    pkgs=$(echo "$missing" | sed 's/python/python3/; s/bwrap/bubblewrap/; s/cc/gcc glibc-devel/')
    "$(command -v dnf || command -v yum)" install -y $pkgs
  else
    echo "[image] the base has no apt-get, dnf or yum to install:$missing; use a base that has them" >&2
    exit 2
  fi
fi
# The user the server runs as. Vendor groups give it the devices: Ascend's /dev/davinci* belong to
# HwHiAiUser, ROCm's /dev/kfd and /dev/dri to video and render (the host's ids are passed with --group-add).
if ! id portachat >/dev/null 2>&1; then
  useradd --create-home --uid 10001 --user-group --shell /bin/sh portachat
fi
for group in HwHiAiUser video render; do
  if getent group "$group" >/dev/null 2>&1; then usermod -aG "$group" portachat; fi
done
home=$(getent passwd portachat | cut -d: -f6)
mkdir -p /data /opt/portachat "$home/.cache"
chown portachat:portachat /data /opt/portachat "$home/.cache"
