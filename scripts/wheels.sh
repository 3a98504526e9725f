#!/usr/bin/env bash
# wheels.sh: Python wheels of the client that carry the static pspnode
# binary, one per platform, so that `pip install pspnode-*.whl` gives a
# working binary (the client finds it in its package, pspnode/bin/).
#
#   scripts/wheels.sh DIST GOOS/GOARCH...   (make dist: every platform)
#   scripts/wheels.sh DIST host             (make wheel: this machine's)
#
# Each wheel is built from a copy of clients/python with dist/'s binary of
# that platform in pspnode/bin/, by pip with no index and no build
# isolation (Debian's python3-pip, python3-setuptools, python3-wheel), and
# is tagged py3-none-PLATFORM: the binary is Go's, static (CGO off), so
# one wheel serves every Python 3 of the platform.
set -euo pipefail
dist=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-/usr/bin/python3}  # Debian's, with pip, setuptools and wheel
mkdir -p "$dist"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# platform is the wheel's platform tag for GOOS/GOARCH.
platform() {
  case $1 in
    linux/amd64) echo manylinux2014_x86_64 ;;
    linux/arm64) echo manylinux2014_aarch64 ;;
    darwin/arm64) echo macosx_11_0_arm64 ;;
    darwin/amd64) echo macosx_10_12_x86_64 ;;
    windows/amd64) echo win_amd64 ;;
    *) echo "wheels.sh: no wheel platform tag for $1" >&2; return 1 ;;
  esac
}

for p in "$@"; do
  if [ "$p" = host ]; then
    p="$(go env GOOS)/$(go env GOARCH)"
  fi
  os=${p%/*}; arch=${p#*/}; ext=
  [ "$os" = windows ] && ext=.exe
  bin="$dist/pspnode-$os-$arch$ext"
  if [ ! -x "$bin" ]; then
    CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags "${LDFLAGS:--s -w}" -o "$bin" "$root/cmd/pspnode"
  fi
  src="$work/$os-$arch"
  rm -rf "$src"
  cp -r "$root/clients/python" "$src"
  rm -rf "$src/build" "$src"/*.egg-info "$src/pspnode/bin"
  mkdir -p "$src/pspnode/bin"
  cp "$bin" "$src/pspnode/bin/pspnode$ext"
  chmod 0755 "$src/pspnode/bin/pspnode$ext"
  PSPNODE_WHEEL_PLATFORM=$(platform "$p") PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$py" -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w "$dist" "$src"
done
ls "$dist"/*.whl
