# Stand-ins for the outside world of docs/deploy.md's recipes, sourced by the script
# tests/tests/deploy_recipe.rs runs (docs/deploy.md "How these recipes are tested"
# lists what each one replaces). Set by the test:
#   RECIPE_SCRATCH   a scratch directory: logs, the local Worker's secrets, map.sed
#   RECIPE_ROOT      where /opt/floodgate, /etc/floodgate, /etc/systemd/system and
#                    /etc/caddy are mapped to (map.sed rewrites the paths and ports)
#   RECIPE_API_PORT  the loopback port the "deployed" Worker (wrangler dev) listens on
#   RECIPE_CADDY_HTTP_PORT  Caddy's plain-HTTP port (its redirect)
#   RECIPE_REPO      the repository (scripts/wrangler)
# Every process started here runs in its own session; its id goes to
# $RECIPE_SCRATCH/pids, and the test ends each group.

recipe_map() { sed -f "$RECIPE_SCRATCH/map.sed" "$1"; }

# recipe_wait_port PORT SECONDS LOG: until 127.0.0.1:PORT accepts a connection.
recipe_wait_port() {
  for _ in $(seq $(($2 * 10))); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "(stand-in) nothing listens on $1 after $2 s; $3:" >&2
  tail -40 "$3" >&2
  return 1
}

# recipe_spawn LOG COMMAND...: COMMAND in its own session, in the background.
recipe_spawn() {
  local log=$1
  shift
  setsid "$@" >"$log" 2>&1 </dev/null &
  echo $! >>"$RECIPE_SCRATCH/pids"
}

wrangler() {
  case "$1" in
    login)
      echo "(stand-in) wrangler login: nothing to sign in to locally"
      ;;
    secret)
      [ "$2" = put ] || { echo "(stand-in) wrangler secret $2: not mapped" >&2; return 2; }
      local value
      value=$(cat)
      printf '%s\t%s\n' "$3" "$value" >>"$RECIPE_SCRATCH/secrets"
      echo "(stand-in) secret $3 kept for the local Worker (${*:4})"
      ;;
    deploy)
      shift
      # the real checks: configuration, environment, build command and bundle
      "$RECIPE_REPO/scripts/wrangler" deploy --dry-run --outdir "$RECIPE_SCRATCH/bundle" "$@" || return 1
      local args=() skip="" a
      for a in "$@"; do
        if [ -n "$skip" ]; then skip=""; continue; fi
        case "$a" in
          --route | --routes) skip=1 ;;
          --route=* | --routes=*) ;;
          *) args+=("$a") ;;
        esac
      done
      local vars=() k v
      while IFS=$'\t' read -r k v; do vars+=(--var "$k:$v"); done <"$RECIPE_SCRATCH/secrets"
      recipe_spawn "$RECIPE_SCRATCH/worker.log" "$RECIPE_REPO/scripts/wrangler" dev "${args[@]}" "${vars[@]}" \
        --local --ip 127.0.0.1 --port "$RECIPE_API_PORT" --persist-to "$RECIPE_SCRATCH/wrangler-state"
      recipe_wait_port "$RECIPE_API_PORT" 180 "$RECIPE_SCRATCH/worker.log"
      echo "(stand-in) deployed: wrangler dev $* (without the route) on 127.0.0.1:$RECIPE_API_PORT"
      ;;
    tail)
      echo "(stand-in) wrangler tail: what the local Worker logged"
      cat "$RECIPE_SCRATCH/worker.log"
      ;;
    *)
      "$RECIPE_REPO/scripts/wrangler" "$@"
      ;;
  esac
}

apt-get() {
  [ "$1" = install ] || { echo "(stand-in) apt-get $1: not mapped" >&2; return 2; }
  shift
  local p
  for p in "$@"; do
    case "$p" in -*) continue ;; esac
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || {
      echo "(stand-in) $p is not installed (scripts/test installs it)" >&2
      return 1
    }
    echo "(stand-in) $p is installed"
  done
}

# recipe_start_unit NAME: verifies the installed unit, then runs its ExecStart with
# only its EnvironmentFile's variables (and PATH), as systemd would.
recipe_start_unit() {
  local unit=${1%.service}
  local installed="$RECIPE_ROOT/etc/systemd/system/$unit.service"
  local mapped="$RECIPE_SCRATCH/units/$unit.service"
  mkdir -p "$RECIPE_SCRATCH/units"
  recipe_map "$installed" >"$mapped" || return 1
  local verify
  if ! verify=$(systemd-analyze verify "$mapped" 2>&1) || [ -n "$verify" ]; then
    echo "(stand-in) systemd-analyze verify $unit.service: $verify" >&2
    return 1
  fi
  echo "(stand-in) systemd-analyze verify $unit.service: clean"
  local exec_start env_file port
  exec_start=$(sed -n 's/^ExecStart=//p' "$mapped")
  env_file=$(sed -n 's/^EnvironmentFile=-\{0,1\}//p' "$mapped")
  local env_vars=()
  mapfile -t env_vars < <(grep -E '^[A-Z_][A-Z0-9_]*=' "$env_file")
  # shellcheck disable=SC2086 # ExecStart is split into words, as systemd does
  recipe_spawn "$RECIPE_SCRATCH/$unit.log" env -i PATH=/usr/bin:/bin "${env_vars[@]}" $exec_start
  port=$( { echo "$exec_start"; cat "$env_file"; } | grep -oE '(--listen |FLOODGATE_[A-Z_]*LISTEN=)[0-9.]+:[0-9]+' | head -1 | sed 's/.*://')
  recipe_wait_port "$port" 60 "$RECIPE_SCRATCH/$unit.log"
  echo "(stand-in) $unit started (ExecStart, its EnvironmentFile; no systemd sandbox)"
}

# recipe_caddy: the installed Caddyfile in a real Caddy, with its internal CA
# instead of ACME; curl then trusts that CA.
recipe_caddy() {
  local conf="$RECIPE_SCRATCH/Caddyfile"
  {
    printf '{\n\tadmin off\n\tlocal_certs\n\tskip_install_trust\n\thttp_port %s\n\tstorage file_system %s\n}\n\n' \
      "$RECIPE_CADDY_HTTP_PORT" "$RECIPE_SCRATCH/caddy"
    recipe_map "$RECIPE_ROOT/etc/caddy/Caddyfile"
  } >"$conf"
  caddy validate --adapter caddyfile --config "$conf" >"$RECIPE_SCRATCH/caddy-validate.log" 2>&1 || {
    cat "$RECIPE_SCRATCH/caddy-validate.log" >&2
    return 1
  }
  HOME="$RECIPE_SCRATCH" XDG_DATA_HOME="$RECIPE_SCRATCH" XDG_CONFIG_HOME="$RECIPE_SCRATCH" \
    recipe_spawn "$RECIPE_SCRATCH/caddy.log" caddy run --adapter caddyfile --config "$conf"
  local port=${DASHBOARD_HOST##*:}
  recipe_wait_port "$port" 30 "$RECIPE_SCRATCH/caddy.log"
  local ca="$RECIPE_SCRATCH/caddy/pki/authorities/local/root.crt"
  for _ in $(seq 100); do [ -s "$ca" ] && break; sleep 0.1; done
  export CURL_CA_BUNDLE="$ca"
  echo "(stand-in) caddy runs the installed Caddyfile (internal CA: $ca)"
}

systemctl() {
  case "$1" in
    daemon-reload) echo "(stand-in) systemctl daemon-reload: nothing to reload" ;;
    enable)
      [ "$2" = --now ] || { echo "(stand-in) systemctl enable without --now: not mapped" >&2; return 2; }
      recipe_start_unit "$3"
      ;;
    reload | restart)
      [ "$2" = caddy ] || { echo "(stand-in) systemctl $1 $2: not mapped" >&2; return 2; }
      recipe_caddy
      ;;
    *) echo "(stand-in) systemctl $*: not mapped" >&2; return 2 ;;
  esac
}
