#!/usr/bin/env bash
# Builds portachat's container image for one target, with docker or podman (whichever works here).
#   bash scripts/build_image.sh TARGET [--base IMAGE] [--cann VERSION] [--tag NAME] [--dry-run] [-- ENGINE_ARGS...]
#   TARGET      cpu | cuda | rocm | dcu (Hygon: docker/rocm.Containerfile on a DTK base) | ascend
#   --base      the image to build FROM (default: the vendor's published base, docker/plan.py)
#   --cann      the CANN version of an --base whose tag does not say it (Ascend)
#   --tag       the image's name (default portachat:TARGET)
#   --dry-run   print the plan (Containerfile, base, torch/CANN/ROCm/DTK pairs, build arguments, the
#               command) and build nothing; needs no engine
#   -- ARGS     passed to `docker build` / `podman build` as they are (e.g. -v DIR:DIR for local wheels)
# The engine: $PORTACHAT_CONTAINER_ENGINE if set, else podman, else a docker whose daemon answers.
# Running the images (devices, mounts, API key): README.md, "Container images".
# 中文：构建指定目标的容器镜像；--dry-run 只打印计划（基础镜像、版本配对、构建参数），说明见 README.zh-CN.md「容器镜像」。
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
usage() { sed -n '2,14p' "$0"; }
target="" base="" cann="" tag="" dry_run=0
engine_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --dry-run) dry_run=1 ;;
    --base|--cann|--tag)
      [ $# -ge 2 ] || { echo "[image] $1 needs a value" >&2; exit 2; }
      case "$1" in --base) base="$2" ;; --cann) cann="$2" ;; --tag) tag="$2" ;; esac
      shift ;;
    --) shift; engine_args=("$@"); break ;;
    -*) echo "[image] unknown option $1 (valid: --base, --cann, --tag, --dry-run, --help)" >&2; exit 2 ;;
    *) [ -z "$target" ] || { echo "[image] one TARGET only (got $target and $1)" >&2; exit 2; }
       target="$1" ;;
  esac
  shift
done
if [ -z "$target" ]; then
  echo "[image] give a TARGET: cpu, cuda, rocm, dcu or ascend (bash scripts/build_image.sh --help)" >&2
  exit 2
fi
python="${PYTHON:-python3}"
plan=$("$python" docker/plan.py "$target" "$base" --cann "$cann") || exit 2
eval "$plan"  # DEFAULT_BASE FILE BASE PAIRS ARGS (an array)
tag="${tag:-portachat:$target}"

engine="${PORTACHAT_CONTAINER_ENGINE:-}"
why=""
if [ -z "$engine" ]; then
  if command -v podman >/dev/null 2>&1; then
    engine=podman
  elif command -v docker >/dev/null 2>&1; then
    if docker info >/dev/null 2>&1; then engine=docker; else why="docker is installed but its daemon does not answer (docker info)"; fi
  fi
elif ! command -v "$engine" >/dev/null 2>&1; then
  why="PORTACHAT_CONTAINER_ENGINE=$engine is not on PATH"
  engine=""
fi
build_args=()
for arg in "${ARGS[@]}"; do build_args+=(--build-arg "$arg"); done
# podman writes OCI images by default, which drop HEALTHCHECK; the docker format keeps it.
format=()
[ "$engine" = podman ] && format=(--format docker)
command=("${engine:-ENGINE}" build "${format[@]}" -f "$FILE" "${build_args[@]}" -t "$tag" "${engine_args[@]}" .)

echo "[image] target: $target ($FILE)"
echo "[image] base: $BASE$([ "$BASE" = "$DEFAULT_BASE" ] && echo " (the default)")"
echo "[image] pairs: $PAIRS"
for arg in "${ARGS[@]}"; do echo "[image] build arg: $arg"; done
echo "[image] engine: ${engine:-none found${why:+ ($why)}}"
if [ "$dry_run" = 1 ]; then
  echo "[image] would run: ${command[*]}"
  exit 0
fi
if [ -z "$engine" ]; then
  echo "[image] no container engine: ${why:-neither podman nor docker is on PATH}. Install podman (apt-get install podman) or docker, or set PORTACHAT_CONTAINER_ENGINE" >&2
  exit 2
fi
echo "[image] running: ${command[*]}"
"${command[@]}"
echo "[image] built $tag; run it as README.md \"Container images\" shows"
