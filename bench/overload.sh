#!/usr/bin/env bash
# bench/overload.sh: what one slow application does to the other
# applications behind the same proxy, for scafo-edge, Caddy, Traefik, nginx
# and HAProxy, each in its default configuration, and HAProxy with a
# per-server maxconn and a queue. See "Overload: one slow application" in
# bench/README.md for how to read it.
#
# This script installs, builds, configures and starts things (as
# bench/run.sh does); the applications, the load and the measuring are
# bench/overload, tested on its own.
#
# Everything it starts listens on 127.0.0.1, all load comes from
# 127.0.0.0/8, and every process it starts is stopped on exit.
set -euo pipefail

usage() {
	cat <<'EOF'
Usage: bench/overload.sh [flags]

  --quick              shorter windows: baseline 2s, window 5s, recovery
                       wait 15s (default 3s, 8s, 30s)
  --window D           how long fast.test is measured under the load
                       (default 8s; longer than a proxy's header or idle
                       timeout shows what its timeouts firing cost)
  --load-at-sink       aim each row's load (held, idle, nat, natheld, slow)
                       at a bare net/http server (bench/overload sink)
                       instead of the proxy, fast.test still measured
                       through the proxy: what the load costs this box by
                       itself, the floor the proxy's own row is measured
                       against
  --proxies LIST       comma list of: scafo-edge,caddy,traefik,nginx,haproxy,
                       haproxy-queue (default: all)
  --rows LIST          comma list of rows, KIND:N[@ADDRS][/EVERY]:
                         held:N     N requests to slow.test, each on its own
                                    HTTP/1.1 connection, held until released
                         idle:N     N keep-alive connections to fast.test,
                                    one request each, then silence
                         h2:N       N held requests as HTTP/2 streams, 100
                                    to a connection, over TLS (scafo-edge,
                                    Caddy and Traefik only)
                         h3:N       the same as HTTP/3 streams over QUIC
                                    (scafo-edge and Caddy, which serve it by
                                    default)
                         nat:N      N keep-alive connections to fast.test,
                                    each asking once a second until the
                                    end: browsers behind one NAT, on an
                                    otherwise idle proxy
                         natheld:N  held:N and, beside it, nat:4000 from
                                    an address of its own (127.0.2.1), in
                                    place before the held requests come:
                                    an office NAT during an attack
                         slow:N     N connections trickling their request
                                    headers, a byte a second (slowloris),
                                    reopened when the proxy ends one
                       @A: from A client addresses, 127.0.0.2 onwards
                       (default one, 127.0.0.1; natheld: the held
                       load's, not its NAT's); /EVERY (nat, natheld's
                       NAT and slow): a request or a header byte every
                       EVERY instead of every second
                       (slow:19000@16/100ms: a fast trickle, not in
                       "all"). Default:
                       held:2000,held:9900,held:12500,held:12500@8,
                       held:30000@8,idle:19000,idle:50000@8,nat:4000,
                       slow:19000@16
                       "all" adds natheld:30000@8,h2:2000,h2:12500,
                       h2:30000,h3:30000
  --edge-bin FILE      measure this scafo-edge binary instead of building one
  --edge-args "ARGS"   extra flags for scafo-edge serve (word-split), e.g.
                       "--max-conns 8000"; the table names them
  --edge-rev REV       build scafo-edge from commit REV, not the working tree
  --workers N          GOMAXPROCS = nginx workers = HAProxy threads
                       (default: the number of CPUs)
  --haproxy-server-maxconn N   the haproxy-queue row's per-server maxconn
                       (default 1000)
  --haproxy-queue-timeout D    its "timeout queue" (default 5s)
  --nginx-worker-connections N nginx's worker_connections (default 4096,
                       bench/run.sh's)
  --json               print JSON instead of the Markdown table
  --json-file FILE     also write the JSON to FILE
  --cache DIR          where built binaries live (default
                       ${XDG_CACHE_HOME:-$HOME/.cache}/scafo-bench, shared
                       with bench/run.sh)
  --no-install         install nothing; skip what is missing
  --retry-builds       try again a Caddy/Traefik build that failed before
  --port-base N        first of the loopback ports used (default 18280;
                       it uses N..N+4 and N+10..N+10+upstreams)
  --keep               keep the work directory (configs, logs, results)
  -h, --help           this text
EOF
}

BENCH_NAME=overload.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# ---------------------------------------------------------------- settings

BASELINE=3s
WINDOW=8s
RECOVERY=30s
RAMP=60s
PROXIES=scafo-edge,caddy,traefik,nginx,haproxy,haproxy-queue
ROWS=held:2000,held:9900,held:12500,held:12500@8,held:30000@8,idle:19000,idle:50000@8,nat:4000,slow:19000@16
H2_ROWS=h2:2000,h2:12500,h2:30000,h3:30000
JSON=0
JSON_FILE=
INSTALL=1
RETRY_BUILDS=0
PORT_BASE=18280
EDGE_REV=
EDGE_BIN_FLAG=
EDGE_ARGS=
WORKERS=$(nproc)
HAPROXY_SERVER_MAXCONN=1000
HAPROXY_QUEUE_TIMEOUT=5s
NGINX_WORKER_CONNECTIONS=4096
UPSTREAMS=4 # processes of the applications, sharing their ports
KEEP=0
LOAD_AT_SINK=0
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/scafo-bench

while (($#)); do
	case $1 in
	--quick) BASELINE=2s WINDOW=5s RECOVERY=15s RAMP=45s ;;
	--window) WINDOW=$2; shift ;;
	--load-at-sink) LOAD_AT_SINK=1 ;;
	--proxies) PROXIES=$2; shift ;;
	--rows) ROWS=$2; shift ;;
	--edge-bin) EDGE_BIN_FLAG=$2; shift ;;
	--edge-args) EDGE_ARGS=$2; shift ;;
	--edge-rev) EDGE_REV=$2; shift ;;
	--workers) WORKERS=$2; shift ;;
	--haproxy-server-maxconn) HAPROXY_SERVER_MAXCONN=$2; shift ;;
	--haproxy-queue-timeout) HAPROXY_QUEUE_TIMEOUT=$2; shift ;;
	--nginx-worker-connections) NGINX_WORKER_CONNECTIONS=$2; shift ;;
	--json) JSON=1 ;;
	--json-file) JSON_FILE=$2; shift ;;
	--cache) CACHE=$2; shift ;;
	--no-install) INSTALL=0 ;;
	--retry-builds) RETRY_BUILDS=1 ;;
	--port-base) PORT_BASE=$2; shift ;;
	--keep) KEEP=1 ;;
	-h | --help) usage; exit 0 ;;
	*) echo "overload.sh: unknown flag $1" >&2; usage >&2; exit 2 ;;
	esac
	shift
done
[[ $ROWS == all ]] && ROWS=held:2000,held:9900,held:12500,held:12500@8,held:30000@8,idle:19000,idle:50000@8,nat:4000,natheld:30000@8,slow:19000@16,$H2_ROWS

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Ports, all on 127.0.0.1.
FAST_PORT=$PORT_BASE           # fast.test's application
SLOW_PORT=$((PORT_BASE + 1))   # slow.test's application
PX_PORT=$((PORT_BASE + 2))     # proxy, plain HTTP
PX_TLS_PORT=$((PORT_BASE + 3)) # proxy, TLS (h2 rows)
ADMIN_PORT=$((PORT_BASE + 4))  # scafo-edge admin: /healthz, /metrics
SINK_PORT=$((PORT_BASE + 5))   # --load-at-sink: where the load goes
CTRL_BASE=$((PORT_BASE + 10))  # the application processes' /stats, /release
FAST_HOST=fast.test
SLOW_HOST=slow.test

# ------------------------------------------------------- processes, cleanup
# start, stop_tree, the cleanup on exit, installing and building: bench/lib.sh,
# as bench/run.sh does them, into the same cache: a run of either reuses
# what the other built.

work_dir scafo-overload

# ------------------------------------------------------------- the tools

command -v go >/dev/null || die "Go is needed (the version go.mod names) to build scafo-edge and bench/overload"
CURL=$(need curl) || die "curl is needed (Debian package curl)"
OPENSSL=$(need openssl) || die "openssl is needed (Debian package openssl)"
mkdir -p "$CACHE"

log "building bench/overload and bench/proxyconf"
(cd "$REPO" && go build -o "$WORK/overload" ./bench/overload) || die "build bench/overload failed"
(cd "$REPO" && go build -o "$WORK/proxyconf" ./bench/proxyconf) || die "build bench/proxyconf failed"
PROXYCONF=$WORK/proxyconf
OVERLOAD=$WORK/overload
PROC_TOOL=$OVERLOAD

# Every process stays well below the descriptor limit: the load goes in
# processes of at most PER_PROC connections.
FD_LIMIT=$(ulimit -n)
[[ $FD_LIMIT == unlimited ]] && FD_LIMIT=1048576
PER_PROC=$((FD_LIMIT / 5))
((PER_PROC > 4000)) && PER_PROC=4000
((PER_PROC >= 100)) || die "ulimit -n is $FD_LIMIT: too few descriptors for the load processes"

# scafo-edge: the working tree, or --edge-rev, or --edge-bin (edge_build,
# bench/lib.sh); a working tree mid-edit gives way to the newest of HEAD …
# HEAD~5 that builds.
EDGE_PKG=./cmd/scafo-edge EDGE_OUT=$CACHE/scafo-edge-overload
EDGE_BIN='' EDGE_NOTE='' EDGE_VERSION=''

if has "$PROXIES" scafo-edge; then
	edge_build
	[[ -n $EDGE_ARGS ]] && EDGE_VERSION+=" with $EDGE_ARGS"
fi
read -r -a EDGE_ARGV <<<"$EDGE_ARGS"

check_ports "$FAST_PORT" "$SLOW_PORT" "$PX_PORT" "$PX_TLS_PORT" "$ADMIN_PORT" "$SINK_PORT" $(seq "$CTRL_BASE" $((CTRL_BASE + UPSTREAMS - 1)))

# One self-signed ECDSA P-256 certificate for both hosts (h2 rows; Caddy,
# Traefik); scafo-edge runs --tls internal and issues its own.
make_cert "$FAST_HOST" "DNS:$FAST_HOST,DNS:$SLOW_HOST,IP:127.0.0.1"

# ---------------------------------------------------------------- configs
# Each proxy as bench/run.sh configures it (bench/proxyconf writes both),
# with two hosts, fast.test and slow.test, on two applications, and nothing
# added for overload: no connection, request or queue limit that the proxy
# does not have by default, nor run.sh's pool sizes (no -tuned). The one
# exception is the haproxy-queue row (haproxy-queue.cfg). nginx and HAProxy
# get no TLS listener: the h2 rows are not theirs.

# write_config PROXY: PROXY's configuration files in WORK.
write_config() {
	"$PROXYCONF" -dir "$WORK" -addr "127.0.0.1:$PX_PORT" -tls-addr "127.0.0.1:$PX_TLS_PORT" \
		-route "fast=$FAST_HOST=127.0.0.1:$FAST_PORT" -route "slow=$SLOW_HOST=127.0.0.1:$SLOW_PORT" \
		-workers "$WORKERS" -plain-only nginx,haproxy -nginx-worker-connections "$NGINX_WORKER_CONNECTIONS" \
		-haproxy-server-maxconn "$HAPROXY_SERVER_MAXCONN" -haproxy-queue-timeout "$HAPROXY_QUEUE_TIMEOUT" "$1" ||
		die "bench/proxyconf could not write $1's configuration"
}

# ------------------------------------------------------------ the proxies

CADDY_BIN='' TRAEFIK_BIN='' NGINX_BIN='' HAPROXY_BIN=''
declare -A SKIP=() # proxy -> why it is not run
declare -A VERSION=()
VERSION[go]=$(go env GOVERSION)

# proxy_bin (bench/lib.sh): the binary and VERSION, or SKIP and why.
for p in scafo-edge caddy traefik; do
	if has "$PROXIES" "$p" && proxy_bin "$p"; then
		write_config "$p"
	fi
done
if has "$PROXIES" nginx && proxy_bin nginx; then
	VERSION[nginx]+=" (worker_connections $NGINX_WORKER_CONNECTIONS)"
	write_config nginx
fi
if has "$PROXIES" haproxy || has "$PROXIES" haproxy-queue; then
	if proxy_bin haproxy; then
		VERSION[haproxy-queue]="${VERSION[haproxy]} (server maxconn $HAPROXY_SERVER_MAXCONN, timeout queue $HAPROXY_QUEUE_TIMEOUT)"
		write_config haproxy # haproxy.cfg and haproxy-queue.cfg
	else
		SKIP[haproxy-queue]=${SKIP[haproxy]}
	fi
fi
for p in "${!SKIP[@]}"; do log "$p: skipped: ${SKIP[$p]}"; done

# start_proxy NAME TLS: starts NAME (TLS=1: also its HTTPS listener, for
# the h2 rows) and sets PID.
start_proxy() {
	local name=$1 tls=$2 logf=$WORK/$1.log state
	case $name in
	scafo-edge)
		state=$(mktemp -d "$WORK/edge-state.XXXXXX")
		local mode=(--tls off)
		((tls)) && mode=(--tls internal --https-addr "127.0.0.1:$PX_TLS_PORT")
		start "$logf" env GOMAXPROCS="$WORKERS" "$EDGE_BIN" serve --routes-file "$WORK/routes.json" \
			"${mode[@]}" --http-addr "127.0.0.1:$PX_PORT" --admin-addr "127.0.0.1:$ADMIN_PORT" \
			--state-dir "$state" --handover=false --access-log=false "${EDGE_ARGV[@]}"
		;;
	caddy)
		start "$logf" env GOMAXPROCS="$WORKERS" XDG_DATA_HOME="$WORK/caddy-data" \
			XDG_CONFIG_HOME="$WORK/caddy-config" "$CADDY_BIN" run --config "$WORK/caddy.json"
		;;
	traefik)
		start "$logf" env GOMAXPROCS="$WORKERS" "$TRAEFIK_BIN" \
			--entryPoints.plain.address="127.0.0.1:$PX_PORT" \
			--entryPoints.tls.address="127.0.0.1:$PX_TLS_PORT" \
			--providers.file.filename="$WORK/traefik.yml" --log.level=ERROR \
			--global.checkNewVersion=false --global.sendAnonymousUsage=false
		;;
	nginx)
		start "$logf" "$NGINX_BIN" -p "$WORK/nginx" -e "$WORK/nginx/error.log" -c "$WORK/nginx/nginx.conf"
		;;
	haproxy)
		start "$logf" "$HAPROXY_BIN" -db -f "$WORK/haproxy.cfg"
		;;
	haproxy-queue)
		start "$logf" "$HAPROXY_BIN" -db -f "$WORK/haproxy-queue.cfg"
		;;
	esac
	return 0
}

# start_apps: the applications, UPSTREAMS processes sharing fast.test's and
# slow.test's ports, each with its control address; sets APP_PIDS and
# CONTROL. Fresh for every row: nothing held from the last one.
start_apps() {
	local i
	APP_PIDS=() CONTROL=
	for ((i = 0; i < UPSTREAMS; i++)); do
		start "$WORK/app-$i.log" "$OVERLOAD" upstream -fast-addr "127.0.0.1:$FAST_PORT" \
			-slow-addr "127.0.0.1:$SLOW_PORT" -control-addr "127.0.0.1:$((CTRL_BASE + i))" -max-hold 3m
		APP_PIDS+=("$PID")
		CONTROL+=${CONTROL:+,}127.0.0.1:$((CTRL_BASE + i))
	done
	for ((i = 0; i < UPSTREAMS; i++)); do
		wait_ok "http://127.0.0.1:$((CTRL_BASE + i))/stats" '' "${APP_PIDS[$i]}" || return 1
	done
}

stop_apps() {
	local p
	for p in "${APP_PIDS[@]}"; do stop_tree "$p"; done
	APP_PIDS=()
}

# wait_ok URL HOST PID [CURL-FLAGS...]: until URL (with Host: HOST, if
# any) answers 200, while PID lives, at most 30 s.
wait_ok() { wait_status 200 "$@"; }

# wait_status CODE URL HOST PID [CURL-FLAGS...]: wait_ok for another status.
wait_status() {
	local want=$1 url=$2 host=$3 pid=$4 out deadline=$((SECONDS + 30))
	shift 4
	local hdr=()
	[[ -n $host ]] && hdr=(-H "Host: $host")
	while ((SECONDS < deadline)); do
		out=$("$CURL" -sk -o /dev/null -w '%{http_code}' --max-time 5 "${hdr[@]}" "$@" "$url" 2>/dev/null) || true
		[[ $out == "$want" ]] && return 0
		kill -0 "$pid" 2>/dev/null || return 1
		sleep 0.1
	done
	log "$url ($host): last answer '$out', wanted $want"
	return 1
}

# ---------------------------------------------------------------- one row

RESULTS=$WORK/results.jsonl
: >"$RESULTS"

# row PROXY SPEC STATUS NOTE: a row without figures, and why.
row() {
	local note=${4//\\/\\\\}
	note=${note//\"/\\\"}
	note=$(printf '%s' "$note" | tr '\000-\037' ' ')
	printf '{"proxy":"%s","row":"%s","status":"%s","note":"%s","recovery_s":-1}\n' "$1" "$2" "$3" "$note" >>"$RESULTS"
}

run_row() {
	local proxy=$1 spec=$2 kind=${2%%:*} tls=0 pid why
	if [[ -n ${SKIP[$proxy]:-} ]]; then
		row "$proxy" "$spec" skipped "${SKIP[$proxy]}"
		return
	fi
	if [[ $kind == h2 ]]; then
		case $proxy in
		scafo-edge | caddy | traefik) tls=1 ;;
		*)
			row "$proxy" "$spec" n/a "the h2 rows are run for scafo-edge, Caddy and Traefik only"
			return ;;
		esac
	fi
	if [[ $kind == h3 ]]; then
		case $proxy in
		scafo-edge | caddy) tls=1 ;;
		*)
			row "$proxy" "$spec" n/a "the h3 rows are run for scafo-edge and Caddy only (the others do not serve HTTP/3 by default)"
			return ;;
		esac
	fi
	log "$proxy $spec"
	if ! start_apps; then
		row "$proxy" "$spec" failed "the applications did not start: $(tail -1 "$WORK/app-0.log")"
		stop_apps
		return
	fi
	start_proxy "$proxy" "$tls"
	pid=$PID
	local ok=1 tlsflags=(--resolve "$FAST_HOST:$PX_TLS_PORT:127.0.0.1" --resolve "$SLOW_HOST:$PX_TLS_PORT:127.0.0.1")
	if ((tls)); then
		# The h2 rows ask fast.test over HTTPS too: a proxy serving TLS may
		# redirect plain HTTP there (scafo-edge does).
		wait_ok "https://$FAST_HOST:$PX_TLS_PORT/" '' "$pid" --http2 "${tlsflags[@]}" || ok=0
		((ok)) && { wait_ok "https://$SLOW_HOST:$PX_TLS_PORT/ping" '' "$pid" --http2 "${tlsflags[@]}" || ok=0; }
	else
		wait_ok "http://127.0.0.1:$PX_PORT/" "$FAST_HOST" "$pid" || ok=0
		((ok)) && { wait_ok "http://127.0.0.1:$PX_PORT/ping" "$SLOW_HOST" "$pid" || ok=0; }
	fi
	if ((!ok)); then
		why=$(grep -v '^\s*$' "$WORK/$proxy.log" 2>/dev/null | tail -1 | cut -c1-200)
		log "$proxy $spec: not serving: $why"
		row "$proxy" "$spec" failed "not serving: $why"
		stop_tree "$pid"
		stop_apps
		return
	fi
	local label=$proxy
	((LOAD_AT_SINK)) && label="$proxy, load at a bare net/http server"
	local flags=(-results "$RESULTS" -proxy "$label" -spec "$spec" -pid "$pid"
		-addr "127.0.0.1:$PX_PORT" -control "$CONTROL" -self "$OVERLOAD"
		-baseline "$BASELINE" -window "$WINDOW" -recovery "$RECOVERY" -ramp "$RAMP"
		-per-proc "$PER_PROC" -timeout 10s)
	((tls)) && flags+=(-tls-addr "127.0.0.1:$PX_TLS_PORT")
	local sink_pid=
	if ((LOAD_AT_SINK)); then
		start "$WORK/sink.log" env GOMAXPROCS="$WORKERS" "$OVERLOAD" sink -addr "127.0.0.1:$SINK_PORT"
		sink_pid=$PID
		flags+=(-load-addr "127.0.0.1:$SINK_PORT")
		wait_status 404 "http://127.0.0.1:$SINK_PORT/" '' "$sink_pid" ||
			die "the sink did not start: $(tail -1 "$WORK/sink.log")"
	fi
	[[ $proxy == scafo-edge ]] && flags+=(-admin "http://127.0.0.1:$ADMIN_PORT")
	# In the background and waited for, so that Ctrl-C reaches the trap at
	# once; the trap stops it and its load processes.
	"$OVERLOAD" row "${flags[@]}" &
	local row_pid=$!
	STARTED+=("$row_pid")
	wait "$row_pid" || row "$proxy" "$spec" failed "bench/overload row failed (see the log above)"
	[[ -n $sink_pid ]] && stop_tree "$sink_pid"
	stop_tree "$pid"
	stop_apps
	return 0
}

# ------------------------------------------------------------------- main

proxy_list=()
for p in ${PROXIES//,/ }; do
	case $p in scafo-edge | caddy | traefik | nginx | haproxy | haproxy-queue) ;; *) die "unknown proxy $p" ;; esac
done
for p in scafo-edge caddy traefik nginx haproxy haproxy-queue; do
	has "$PROXIES" "$p" && proxy_list+=("$p")
done
IFS=, read -r -a row_list <<<"$ROWS"
for spec in "${row_list[@]}"; do
	[[ $spec =~ ^(held|idle|h2|h3|nat|natheld|slow):[0-9]+k?(@[0-9]+)?$ || $spec =~ ^(nat|natheld|slow):[0-9]+k?(@[0-9]+)?/[0-9]+(ms|s)$ ]] ||
		die "row $spec: want held:N, idle:N, h2:N, h3:N, nat:N, natheld:N or slow:N, optionally @ADDRESSES, and for nat, natheld and slow /INTERVAL (100ms, 2s)"
done

for spec in "${row_list[@]}"; do
	for proxy in "${proxy_list[@]}"; do
		run_row "$proxy" "$spec"
	done
done

report() {
	local flags=(-results "$RESULTS"
		-setting "baseline=$BASELINE" -setting "window=$WINDOW" -setting "recovery wait=$RECOVERY"
		-setting "cpus=$(nproc)" -setting "workers=$WORKERS" -setting "ulimit -n=$FD_LIMIT"
		-setting "load processes=at most $PER_PROC connections each"
		-setting "applications=$UPSTREAMS processes") p
	for p in "${!VERSION[@]}"; do flags+=(-version "$p=${VERSION[$p]}"); done
	"$OVERLOAD" report "${flags[@]}" "$@"
}
if ((JSON)); then report -json; else report; fi
if [[ -n $JSON_FILE ]]; then report -json >"$JSON_FILE"; fi
