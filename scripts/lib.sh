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
  ensure_packages rustc-web cargo-web rust-web-src rust-web-llvm
  WASM_CARGO=(env RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 /usr/bin/cargo)
  WASM_BUILD_STD=(-Zbuild-std=std,panic_abort)
}

# wasm_cargo ARGS...: runs cargo for wasm32 with the toolchain found above.
wasm_cargo() {
  "${WASM_CARGO[@]}" "$@" --target wasm32-unknown-unknown "${WASM_BUILD_STD[@]}" --target-dir target/wasm
}
