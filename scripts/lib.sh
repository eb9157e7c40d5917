# Shared helpers for scripts/run, scripts/test and scripts/bench. Sourced, not run.
# They install what is missing on a fresh Debian/Ubuntu machine that has Rust, Node
# and git: Debian packages (redis-server, redis-tools, the wasm toolchain).

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

_apt_updated=""
# ensure_packages PKG...: installs the Debian packages that are not installed yet.
ensure_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing ${missing[*]}"
  if [ -z "$_apt_updated" ]; then
    as_root apt-get update -qq
    _apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The Redis server and its tools (redis-cli, redis-benchmark).
ensure_redis() {
  command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null && return 0
  ensure_packages redis-server redis-tools
}

# ensure_wasm_toolchain: a way to build Rust for wasm32-unknown-unknown.
# Prefers a rustup toolchain that already has the target; otherwise Debian's
# rustc-web/cargo-web with rust-web-src (std built from source with -Zbuild-std)
# and rust-lld from rust-web-llvm. Sets WASM_CARGO (a command prefix).
ensure_wasm_toolchain() {
  if command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    WASM_CARGO=(cargo)
    WASM_BUILD_STD=()
    return 0
  fi
  ensure_packages rustc-web cargo-web rust-web-src rust-web-llvm lld-22
  WASM_CARGO=(env RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 /usr/bin/cargo)
  WASM_BUILD_STD=(-Zbuild-std=std,panic_abort)
}

# wasm_cargo ARGS...: runs cargo for wasm32 with the toolchain found above.
wasm_cargo() {
  "${WASM_CARGO[@]}" "$@" --target wasm32-unknown-unknown "${WASM_BUILD_STD[@]}" --target-dir target/wasm
}

# Tools installed from the crate registry by version, cached across runs.
TOOLS="${FLOODGATE_TOOLS:-$HOME/.cache/floodgate/tools}"

# ensure_cargo_tool CRATE VERSION BIN [OPT_LEVEL]: installs CRATE@VERSION's BIN into
# $TOOLS unless present. Neither crate is published prebuilt on a registry this
# machine reaches. They only transform a few files per build, so they are built
# light: opt-level 1 (wasm-bindgen) or 0 (worker-build, which only runs the others),
# and only the binary used. A lock per crate lets scripts/run's two build chains ask
# for the same tool at once: the second waits, then finds it installed.
ensure_cargo_tool() {
  mkdir -p "$TOOLS"
  (
    flock 9
    if [ -x "$TOOLS/bin/$3" ] && "$TOOLS/bin/$3" --version 2>/dev/null | grep -qF "$2"; then exit 0; fi
    say "installing $1 $2 (once; cached in $TOOLS)"
    local light=(env CARGO_PROFILE_RELEASE_OPT_LEVEL="${4:-1}" CARGO_PROFILE_RELEASE_DEBUG=false
      CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16)
    "${light[@]}" cargo install --quiet --root "$TOOLS" "$1" --version "$2" --bin "$3" --locked 2>/dev/null \
      || "${light[@]}" cargo install --quiet --root "$TOOLS" "$1" --version "$2" --bin "$3"
  ) 9>"$TOOLS/.lock-$1"
}

# ensure_wasm_bindgen: wasm-bindgen-cli at the version Cargo.lock pins (the Worker's
# and the dashboard's bundles).
ensure_wasm_bindgen() { ensure_cargo_tool wasm-bindgen-cli 0.2.130 wasm-bindgen; }

# ensure_worker_node: the Worker's npm tooling (edge/worker/package.json): wrangler,
# miniflare, esbuild, binaryen's wasm-opt and the Node 22 they run on.
ensure_worker_node() {
  (cd edge/worker && { [ -d node_modules/wrangler ] || npm ci --no-audit --no-fund --loglevel=error; })
}

# ensure_worker_toolchain: everything to build the Worker and run it in workerd:
# the wasm32 toolchain, worker-build, wasm-bindgen-cli at the version Cargo.lock
# pins, and (npm, edge/worker) wrangler, miniflare, esbuild, wasm-opt, Node 22.
# None of them downloads anything at run time.
ensure_worker_toolchain() {
  ensure_wasm_toolchain
  ensure_wasm_bindgen
  ensure_cargo_tool worker-build 0.8.7 worker-build 0
  ensure_worker_node
  if [ "${WASM_CARGO[0]}" = env ] && [ ! -d /usr/lib/rustlib/wasm32-unknown-unknown/lib ]; then
    # worker-build looks for the target's libdir in the sysroot; std is built from source
    as_root mkdir -p /usr/lib/rustlib/wasm32-unknown-unknown/lib
  fi
}

# worker_env: the environment worker-build runs in.
worker_env() {
  local w="$PWD/edge/worker/node_modules/.bin"
  local common=(WASM_BINDGEN_BIN="$TOOLS/bin/wasm-bindgen" WASM_OPT_BIN="$w/wasm-opt" ESBUILD_BIN="$w/esbuild"
    WRANGLER_SEND_METRICS=false CLOUDFLARE_CF_FETCH_ENABLED=false)
  if [ "${WASM_CARGO[0]}" = env ]; then
    echo env PATH="/usr/bin:$PATH" RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
      CARGO_UNSTABLE_BUILD_STD=std,panic_abort "${common[@]}"
  else
    echo env "${common[@]}"
  fi
}

# inputs_hash PATH...: one hash over the build inputs under PATHs (sources, manifests,
# lock files, scripts; never build output or node_modules) and the toolchain
# versions: equal hashes mean an output built from them is up to date.
inputs_hash() {
  {
    find "$@" -type f \( -name '*.rs' -o -name '*.toml' -o -name '*.lock' -o -name '*.lua' \
      -o -name '*.mjs' -o -name '*.js' -o -name '*.css' -o -name '*.json' -o -name '*.sh' \) \
      -not -path '*/node_modules/*' -not -path '*/target/*' -not -path '*/build/*' -print0 \
      | sort -z | xargs -0 sha256sum
    rustc --version 2>/dev/null || true
    "${WASM_CARGO[@]}" --version 2>/dev/null || true
  } | sha256sum | cut -c1-16
}

# build_once NAME STAMP HASH OUTPUT... -- COMMAND...: runs COMMAND unless STAMP holds
# HASH and every OUTPUT exists (then says what it skipped); records HASH after a
# successful build. `scripts/run` uses it so a built tree starts in seconds.
build_once() {
  local name=$1 stamp=$2 hash=$3
  shift 3
  local outputs=() fresh=1
  while [ "$1" != -- ]; do outputs+=("$1"); shift; done
  shift
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ] || fresh=""
  for o in "${outputs[@]}"; do [ -e "$o" ] || fresh=""; done
  if [ -n "$fresh" ]; then
    say "skipped $name: its inputs are unchanged since $(date -u -r "$stamp" '+%Y-%m-%d %H:%M UTC')"
    return 0
  fi
  rm -f "$stamp"
  "$@"
  mkdir -p "$(dirname "$stamp")"
  echo "$hash" >"$stamp"
}
