#!/usr/bin/env bash
# The installed package as a service author gets it (issue 33): installs the
# build into a scratch prefix, checks what is installed (only <dpactor/...>
# headers, none including CAF, Gloo, libtorch, nlohmann-json or spdlog; no
# SSL_CTX_* symbol defined by the library), then builds tests/consumer
# against the prefix with find_package(dpactor) alone and runs it.
#
#   check.sh SOURCE_DIR BUILD_DIR [GENERATOR]
set -euo pipefail
source_dir=$1
build_dir=$2
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT

cmake --install "$build_dir" --prefix "$prefix" >/dev/null
include="$prefix/include"
if found=$(find "$include" -mindepth 1 -not -path "$include/dpactor" -not -path "$include/dpactor/*" | head -5) &&
  [ -n "$found" ]; then
  echo "FAILED: installed outside include/dpactor/: $found"; exit 1
fi
if grep -n -E '^\s*#\s*include\s*[<"](caf|gloo|torch|ATen|c10|nlohmann|spdlog|fmt|boost|openssl|cblas|toml)' -r "$include/dpactor"; then
  echo "FAILED: a public header includes a dependency's header (above)"; exit 1
fi
if grep -n -E '^\s*#\s*include\s*"' -r "$include/dpactor"; then
  echo "FAILED: a public header includes a header of the repository's folders (above)"; exit 1
fi
echo "installed headers: $(cd "$include" && find dpactor -name '*.hpp' | sort | tr '\n' ' ')"
library=$(find "$prefix" -name 'libdpactor.so.*' -type f | head -1)
[ -n "$library" ] || { echo "FAILED: no libdpactor.so installed"; exit 1; }
if nm -D --defined-only "$library" | grep -E ' SSL_CTX_'; then
  echo "FAILED: $library defines libssl's symbols (above)"; exit 1
fi
echo "nm -D --defined-only $(basename "$library"): no SSL_CTX_* ($(nm -D --defined-only "$library" | wc -l) symbols)"

cmake -S "$source_dir/tests/consumer" -B "$prefix/consumer-build" -G "${3:-Ninja}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer-build" >/dev/null
mkdir -p "$prefix/scratch"
"$prefix/consumer-build/consumer" "$source_dir/configs/mlp.cfg" "$source_dir/tests/data/tls" "$prefix/scratch"
