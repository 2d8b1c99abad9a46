#!/usr/bin/env bash
# bench/run.sh: scafo-edge side by side with the proxies it replaces, on one
# machine, in one run. See bench/README.md for how to read it.
#
# This script installs, builds and starts things; each proxy's
# configuration is bench/proxyconf's, and the measuring (/proc around each
# window, the load tools' output, per-request figures, medians, the table
# and the JSON) is bench/benchtab, both tested on their own.
#
# Everything it starts listens on 127.0.0.1 only and is stopped on exit.
set -euo pipefail

usage() {
	cat <<'EOF'
Usage: bench/run.sh [flags]

  --quick              3s per cell, 1s warm-up (default 10s and 3s)
  --duration D         measured time per cell (wrk syntax: 10s, 1m)
  --warmup D           unmeasured load before each cell (0 for none)
  --rounds N           run every cell N times, report medians (default 1)
  --proxies LIST       comma list of: direct,scafo-edge,caddy,traefik,nginx,haproxy,
                       go-tls (default: all but go-tls; direct is always run,
                       it is the ceiling; go-tls, opt-in, is the floor of the
                       TLS cells: bench/gotls, a bare Go HTTPS and HTTP/3
                       server with the edge's TLS settings, proxying nothing)
  --cells LIST         comma list of: http-1k,http-1m,https-1k,https-close,
                       h2-1k,h2-1k-1s,h2-1m,h3-1k,h3-close,http-html64k; "all"
                       for every one (default: the four HTTP/1.1 cells; the
                       h2 cells, h2load over TLS, are opt-in: with them a
                       default run passes ten minutes; so are h3-1k and
                       h3-close, HTTP/3 with bench/h3load, scafo-edge, Caddy,
                       Traefik and go-tls only; and http-html64k, compression:
                       a 64 KiB HTML page asked for with Accept-Encoding:
                       gzip, zstd, each proxy with its compression on)
  --connections N      wrk connections (default 64; the h2 and h3 cells set
                       their own)
  --threads N          wrk threads (default 2)
  --workers N          GOMAXPROCS = nginx workers = HAProxy threads
                       (default: the number of CPUs)
  --json               print JSON instead of the Markdown table
  --json-file FILE     also write the JSON to FILE
  --cache DIR          where built binaries live (default
                       ${XDG_CACHE_HOME:-$HOME/.cache}/scafo-bench)
  --no-install         install nothing; skip what is missing
  --retry-builds       try again a Caddy/Traefik build that failed before
  --port-base N        first of the 8 loopback ports used (default 18080)
  --profile DIR        instead of the table: CPU and allocation profiles of
                       scafo-edge (the binary, through its admin listener's
                       /debug/pprof) under the load of each cell of --cells
                       (default http-1k), written to DIR/<cell>/ with a text
                       summary on stdout (bench/pgo.sh merges them)
  --edge-rev REV       build scafo-edge from commit REV, not the working
                       tree (which, when it does not build, gives way to HEAD)
  --edge-bin FILE      measure this scafo-edge binary instead of building one
                       (a build with other flags, e.g. -pgo=off, or a
                       local patch)
  --baseline-rev REV   also measure scafo-edge built from commit REV, as an
                       extra row scafo-edge@<hash> beside scafo-edge in every
                       cell and round: before and after in one run
  --edge-env LIST      comma list of VAR=VALUE set on the scafo-edge row's
                       process only (not the --baseline-rev row's), e.g.
                       GOGC=200,GOMEMLIMIT=256MiB: a runtime setting measured
                       against the same build without it
  --keep               keep the work directory (configs, logs, wrk output)
  -h, --help           this text
EOF
}

BENCH_NAME=run.sh
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# ---------------------------------------------------------------- settings

DURATION=10s
WARMUP=3s
ROUNDS=1
CONNS=64
THREADS=2
WORKERS=$(nproc)
PROXIES=direct,scafo-edge,caddy,traefik,nginx,haproxy
CELLS=http-1k,http-1m,https-1k,https-close
CELLS_GIVEN=0
JSON=0
JSON_FILE=
INSTALL=1
RETRY_BUILDS=0
PORT_BASE=18080
PROFILE_DIR=
EDGE_REV=
EDGE_BIN_FLAG=
BASELINE_REV=
EDGE_ENV=
KEEP=0
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/scafo-bench

while (($#)); do
	case $1 in
	--quick) DURATION=3s WARMUP=1s ;;
	--duration) DURATION=$2; shift ;;
	--warmup) WARMUP=$2; shift ;;
	--rounds) ROUNDS=$2; shift ;;
	--proxies) PROXIES=$2; shift ;;
	--cells) CELLS=$2 CELLS_GIVEN=1; shift ;;
	--connections) CONNS=$2; shift ;;
	--threads) THREADS=$2; shift ;;
	--workers) WORKERS=$2; shift ;;
	--json) JSON=1 ;;
	--json-file) JSON_FILE=$2; shift ;;
	--cache) CACHE=$2; shift ;;
	--no-install) INSTALL=0 ;;
	--retry-builds) RETRY_BUILDS=1 ;;
	--port-base) PORT_BASE=$2; shift ;;
	--profile) PROFILE_DIR=$2; shift ;;
	--edge-rev) EDGE_REV=$2; shift ;;
	--edge-bin) EDGE_BIN_FLAG=$2; shift ;;
	--baseline-rev) BASELINE_REV=$2; shift ;;
	--edge-env) EDGE_ENV=$2; shift ;;
	--keep) KEEP=1 ;;
	-h | --help) usage; exit 0 ;;
	*) echo "run.sh: unknown flag $1" >&2; usage >&2; exit 2 ;;
	esac
	shift
done
[[ $CELLS == all ]] && CELLS=http-1k,http-1m,https-1k,https-close,h2-1k,h2-1k-1s,h2-1m,h3-1k,h3-close,http-html64k
# --profile profiles the http-1k load unless told which.
[[ -n $PROFILE_DIR ]] && ((!CELLS_GIVEN)) && CELLS=http-1k

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLK_TCK=$(getconf CLK_TCK)

# Ports, all on 127.0.0.1.
UP_PORT=$PORT_BASE              # upstream, plain
UP_TLS_PORT=$((PORT_BASE + 1))  # upstream, TLS (direct HTTPS ceiling)
PX_PORT=$((PORT_BASE + 2))      # proxy, plain
PX_TLS_PORT=$((PORT_BASE + 3))  # proxy, TLS
ADMIN_PORT=$((PORT_BASE + 4))   # scafo-edge admin (and its /debug/pprof)
HOST=localhost                  # the one routed host; also the TLS name

# ------------------------------------------------------- processes, cleanup
# start, stop_tree, the cleanup on exit, installing and building: bench/lib.sh.

work_dir scafo-bench

# ------------------------------------------------------------- the tools

command -v go >/dev/null || die "Go is needed (the version go.mod names) to build scafo-edge and the upstream"
WRK=$(need wrk) || die "wrk is needed (Debian package wrk)"
CURL=$(need curl) || die "curl is needed (Debian package curl)"
OPENSSL=$(need openssl) || die "openssl is needed (Debian package openssl)"
# h2load (nghttp2's load generator) only for the h2 cells: wrk speaks no h2.
H2LOAD=
if [[ ,$CELLS, == *,h2-* ]]; then
	H2LOAD=$(need h2load nghttp2-client) || die "h2load is needed for the h2 cells (Debian package nghttp2-client)"
fi
mkdir -p "$CACHE"

log "building the upstream, bench/benchtab and bench/proxyconf"
(cd "$REPO" && go build -o "$CACHE/bench-upstream" ./bench/upstream) || die "build bench/upstream failed"
(cd "$REPO" && go build -o "$WORK/benchtab" ./bench/benchtab) || die "build bench/benchtab failed"
(cd "$REPO" && go build -o "$WORK/proxyconf" ./bench/proxyconf) || die "build bench/proxyconf failed"
PROXYCONF=$WORK/proxyconf
BENCHTAB=$WORK/benchtab
PROC_TOOL=$BENCHTAB
# scafo-edge: the working tree, or --edge-rev, or --edge-bin (edge_build,
# bench/lib.sh); a working tree mid-edit gives way to the newest of HEAD …
# HEAD~5 that builds, and the table says which.
EDGE_PKG=./cmd/scafo-edge EDGE_OUT=$CACHE/scafo-edge

# bench/h3load (HTTP/3 over quic-go, the stack scafo-edge and Caddy serve it
# with) only for the h3 cells: built from this checkout, once per run.
H3LOAD=
if [[ ,$CELLS, == *,h3-* ]]; then
	log "building bench/h3load"
	(cd "$REPO" && go build -o "$WORK/h3load" ./bench/h3load) || die "build bench/h3load failed"
	H3LOAD=$WORK/h3load
fi

# bench/gotls, the go-tls row (--proxies go-tls only): the floor of the TLS
# cells, built from this checkout like the upstream.
GOTLS_BIN=
if has "$PROXIES" go-tls && [[ -z $PROFILE_DIR ]]; then
	log "building bench/gotls"
	(cd "$REPO" && go build -o "$CACHE/bench-gotls" ./bench/gotls) || die "build bench/gotls failed"
	GOTLS_BIN=$CACHE/bench-gotls
fi

edge_build
# --edge-env: runtime settings (GOGC, GOMEMLIMIT, GODEBUG) for the
# scafo-edge row alone, so the --baseline-rev row is the same build without
# them; the table's version line names them.
EDGE_ENV_VARS=()
if [[ -n $EDGE_ENV ]]; then
	IFS=, read -ra EDGE_ENV_VARS <<<"$EDGE_ENV"
	for kv in "${EDGE_ENV_VARS[@]}"; do
		[[ $kv =~ ^[A-Za-z_][A-Za-z0-9_]*=.+$ ]] || die "--edge-env: $kv is not VAR=VALUE"
	done
	EDGE_VERSION+=" with $EDGE_ENV"
fi

# --baseline-rev: a second scafo-edge, from commit BASELINE_REV, measured as
# its own row (BASELINE, "scafo-edge@<short hash>") right after scafo-edge,
# so before and after see the same machine. Built as the edge is
# (git archive, plain go build) and kept in CACHE per commit and Go version:
# a commit does not change, so comparing against it again costs nothing.
BASELINE='' BASELINE_BIN=''
if [[ -n $BASELINE_REV ]]; then
	[[ -z $PROFILE_DIR ]] || die "--baseline-rev adds a row to the table; --profile makes none"
	hash=$(cd "$REPO" && git rev-parse -q --verify "$BASELINE_REV^{commit}") ||
		die "--baseline-rev $BASELINE_REV: not a commit of $REPO"
	BASELINE=scafo-edge@$(cd "$REPO" && git rev-parse --short "$hash")
	dir=$CACHE/scafo-edge-$hash-$(go env GOVERSION)
	if [[ ! -x $dir/scafo-edge ]]; then
		log "building ./cmd/scafo-edge from commit $BASELINE_REV ($BASELINE) into $dir"
		mkdir -p "$dir"
		# A subshell, so SRC stays the edge's; build beside, then rename, so an
		# interrupted build leaves nothing the next run would take as built.
		if ! ( export_rev "$hash" "$WORK/src-baseline" && cd "$SRC" &&
			go build -o "$dir/scafo-edge.tmp" ./cmd/scafo-edge ) 2>"$WORK/baseline-build.log"; then
			die "--baseline-rev $BASELINE_REV does not build: $(grep -v '^#' "$WORK/baseline-build.log" | head -2 | tr '\n' ' ')"
		fi
		mv "$dir/scafo-edge.tmp" "$dir/scafo-edge"
	fi
	BASELINE_BIN=$dir/scafo-edge
fi

check_ports "$UP_PORT" "$UP_TLS_PORT" "$PX_PORT" "$PX_TLS_PORT" "$ADMIN_PORT"

# A certificate already held: self-signed ECDSA P-256 for localhost (what
# the edge's internal CA issues too), so no handshake pays for a bigger key.
make_cert "$HOST" "DNS:$HOST,IP:127.0.0.1"
cat "$WORK/cert.pem" "$WORK/key.pem" >"$WORK/bundle.pem"

start "$WORK/upstream.log" "$CACHE/bench-upstream" -addr "127.0.0.1:$UP_PORT" \
	-tls-addr "127.0.0.1:$UP_TLS_PORT" -cert "$WORK/cert.pem" -key "$WORK/key.pem"
UP_PID=$PID

# wait_ok URL SIZE PID: until URL answers 200 with SIZE bytes, while PID lives.
wait_ok() {
	local url=$1 size=$2 pid=$3 out deadline=$((SECONDS + 30))
	while ((SECONDS < deadline)); do
		out=$("$CURL" -sk -o /dev/null -w '%{http_code} %{size_download}' --max-time 5 "$url" 2>/dev/null) || true
		[[ $out == "200 $size" ]] && return 0
		kill -0 "$pid" 2>/dev/null || return 1
		sleep 0.1
	done
	log "$url: last answer '$out', wanted '200 $size'"
	return 1
}
wait_ok "http://127.0.0.1:$UP_PORT/1k" 1024 "$UP_PID" || die "the upstream did not start: $(tail -3 "$WORK/upstream.log")"

# ---------------------------------------------------------------- configs

# write_config PROXY: PROXY's configuration files in WORK, written by
# bench/proxyconf, which writes bench/overload.sh's too: the one route,
# HOST to the upstream, and the fairness settings (-tuned, HAProxy's
# maxconn 4096; bench/README.md, "Fairness").
write_config() {
	"$PROXYCONF" -dir "$WORK" -addr "127.0.0.1:$PX_PORT" -tls-addr "127.0.0.1:$PX_TLS_PORT" \
		-route "up=$HOST=127.0.0.1:$UP_PORT" -workers "$WORKERS" -tuned -haproxy-maxconn 4096 "$1" ||
		die "bench/proxyconf could not write $1's configuration"
}

# ------------------------------------------------------------ the proxies

CADDY_BIN='' TRAEFIK_BIN='' NGINX_BIN='' HAPROXY_BIN=''
declare -A SKIP=()   # proxy -> why it is not run
declare -A VERSION=()
VERSION[wrk]=$("$WRK" -v 2>&1 | head -1 | awk '{print $2}') || true
[[ -n $H2LOAD ]] && VERSION[h2load]=$("$H2LOAD" --version 2>&1 | head -1 | sed 's/.*nghttp2\///')
[[ -n $H3LOAD ]] && VERSION[h3load]="quic-go $(go version -m "$H3LOAD" 2>/dev/null | awk '$1 == "dep" && $2 == "github.com/quic-go/quic-go" && !v { v = $3 } END { print v }')"
VERSION[direct]="bench/upstream (Go $(go env GOVERSION | sed 's/^go//'))"

# Profile mode needs none of the other proxies.
if [[ -z $PROFILE_DIR ]]; then
	# proxy_bin (bench/lib.sh): the binary and VERSION, or SKIP and why.
	# Caddy gets caddy-h3.json beside caddy.json (its TLS server also
	# lists h3), nginx and HAProxy an h2 file each (their TLS listener
	# offers h2): separate files, so the other cells run the configuration
	# they always have.
	if has "$PROXIES" scafo-edge && proxy_bin scafo-edge; then
		write_config scafo-edge
	fi
	if [[ -n $BASELINE ]]; then
		VERSION[$BASELINE]="--baseline-rev $BASELINE_REV"
		write_config scafo-edge
	fi
	for p in caddy traefik nginx haproxy; do
		if has "$PROXIES" "$p" && proxy_bin "$p"; then
			write_config "$p"
		fi
	done
	[[ -n $GOTLS_BIN ]] && VERSION[go-tls]="bench/gotls (Go $(go env GOVERSION | sed 's/^go//'), $(go version -m "$GOTLS_BIN" 2>/dev/null | awk '$1 == "dep" && $2 == "github.com/quic-go/quic-go" { print "quic-go " $3 }'))"
fi
for p in "${!SKIP[@]}"; do log "$p: skipped: ${SKIP[$p]}"; done

# start_proxy NAME TLS [H2 [H3 [ENC]]]: starts NAME (TLS=1: with its HTTPS
# listener; H2=1: offering h2 on it; H3=1: serving HTTP/3 on its UDP side;
# ENC=1: with its compression on, the compression cell's variant of its
# configuration, which bench/proxyconf writes beside the usual one, so every
# other cell runs the configuration it always has. scafo-edge compresses by
# default (--compress), in every cell: only a request that asks for it, as
# the other cells' do not, is compressed)
# and sets PID. scafo-edge, Caddy and Traefik offer h2 on TLS in every cell;
# nginx and HAProxy only in the h2 cells. scafo-edge's --http3 is on by
# default; the h3 cells name it; Caddy and Traefik get h3 only in them.
start_proxy() {
	local name=$1 tls=$2 h2=${3:-0} h3=${4:-0} enc=${5:-0} logf=$WORK/$1.log state
	case $name in
	scafo-edge | scafo-edge@*)
		# The --baseline-rev row: the same command, another build.
		local bin=$EDGE_BIN vars=("${EDGE_ENV_VARS[@]}")
		[[ $name == scafo-edge ]] || bin=$BASELINE_BIN vars=()
		state=$(mktemp -d "$WORK/edge-state.XXXXXX")
		local mode=(--tls off)
		((tls)) && mode=(--tls internal --https-addr "127.0.0.1:$PX_TLS_PORT")
		((h3)) && mode+=(--http3)
		start "$logf" env GOMAXPROCS="$WORKERS" "${vars[@]}" "$bin" serve --routes-file "$WORK/routes.json" \
			"${mode[@]}" --http-addr "127.0.0.1:$PX_PORT" --admin-addr "127.0.0.1:$ADMIN_PORT" \
			--state-dir "$state" --access-log=false
		;;
	caddy)
		local conf=caddy.json
		((h3)) && conf=caddy-h3.json
		((enc)) && conf=caddy-encode.json
		start "$logf" env GOMAXPROCS="$WORKERS" XDG_DATA_HOME="$WORK/caddy-data" \
			XDG_CONFIG_HOME="$WORK/caddy-config" "$CADDY_BIN" run --config "$WORK/$conf"
		;;
	traefik)
		# HTTP/3 on the UDP side of the TLS entry point, with the same
		# certificate (the file provider's default one).
		local http3=() conf=traefik.yml
		((h3)) && http3=(--entryPoints.tls.http3=true)
		((enc)) && conf=traefik-compress.yml
		start "$logf" env GOMAXPROCS="$WORKERS" "$TRAEFIK_BIN" \
			--entryPoints.plain.address="127.0.0.1:$PX_PORT" \
			--entryPoints.tls.address="127.0.0.1:$PX_TLS_PORT" "${http3[@]}" \
			--providers.file.filename="$WORK/$conf" --log.level=ERROR \
			--global.checkNewVersion=false --global.sendAnonymousUsage=false
		;;
	nginx)
		local conf=nginx.conf
		((h2)) && conf=nginx-h2.conf
		((enc)) && conf=nginx-gzip.conf
		start "$logf" "$NGINX_BIN" -p "$WORK/nginx" -e "$WORK/nginx/error.log" -c "$WORK/nginx/$conf"
		;;
	haproxy)
		local conf=haproxy.cfg
		((h2)) && conf=haproxy-h2.cfg
		((enc)) && conf=haproxy-gzip.cfg
		start "$logf" "$HAPROXY_BIN" -db -f "$WORK/$conf"
		;;
	go-tls)
		# The floor: TLS cells only (run_cell), the bench's certificate,
		# HTTP/3 on the UDP side in the h3 cells as the edge does.
		local h3flag=()
		((h3)) && h3flag=(-h3)
		start "$logf" env GOMAXPROCS="$WORKERS" "$GOTLS_BIN" -addr "127.0.0.1:$PX_TLS_PORT" \
			-cert "$WORK/cert.pem" -key "$WORK/key.pem" "${h3flag[@]}"
		;;
	esac
	return 0
}

# ---------------------------------------------------------------- one cell

# cell_spec CELL sets SCHEME, PATH_, SIZE, CLOSE, and for the h2 cells
# (h2load over TLS) H2=1 with H2_CLIENTS connections of H2_STREAMS
# concurrent streams each; for the h3 cells (bench/h3load over QUIC) H3=1,
# with H2_CLIENTS and H2_STREAMS as h3load's -c and -m; for the compression
# cell ENCODING, the Accept-Encoding its requests send (every other cell's
# send none, so no proxy compresses there).
cell_spec() {
	H2=0 H3=0 H2_CLIENTS='' H2_STREAMS='' ENCODING=''
	case $1 in
	http-1k) SCHEME=http PATH_=/1k SIZE=1024 CLOSE=0 ;;
	http-1m) SCHEME=http PATH_=/1m SIZE=1048576 CLOSE=0 ;;
	https-1k) SCHEME=https PATH_=/1k SIZE=1024 CLOSE=0 ;;
	https-close) SCHEME=https PATH_=/1k SIZE=1024 CLOSE=1 ;;
	# Many streams on few connections: h2's multiplexing.
	h2-1k) SCHEME=https PATH_=/1k SIZE=1024 CLOSE=0 H2=1 H2_CLIENTS=16 H2_STREAMS=16 ;;
	# One stream per connection, as many connections as the wrk cells: the
	# cost of h2 framing alone, against https-1k.
	h2-1k-1s) SCHEME=https PATH_=/1k SIZE=1024 CLOSE=0 H2=1 H2_CLIENTS=64 H2_STREAMS=1 ;;
	# Large bodies through h2 flow control.
	h2-1m) SCHEME=https PATH_=/1m SIZE=1048576 CLOSE=0 H2=1 H2_CLIENTS=16 H2_STREAMS=4 ;;
	# HTTP/3, h2-1k's shape: 16 QUIC connections × 16 streams.
	h3-1k) SCHEME=https PATH_=/1k SIZE=1024 CLOSE=0 H3=1 H2_CLIENTS=16 H2_STREAMS=16 ;;
	# HTTP/3, https-close's shape: as many workers as wrk has connections,
	# each a new QUIC connection per request (load_cmd).
	h3-close) SCHEME=https PATH_=/1k SIZE=1024 CLOSE=1 H3=1 H2_CLIENTS=$CONNS H2_STREAMS=1 ;;
	# Compression: bench/upstream's 64 KiB HTML page (with its
	# Content-Length, uncompressed), asked for as a browser does; each
	# proxy compresses it with its compression on (start_proxy), the
	# direct row does not (the ceiling, and the uncompressed size).
	http-html64k) SCHEME=http PATH_=/html64k SIZE=65536 CLOSE=0 ENCODING='gzip, zstd' ;;
	*) die "unknown cell $1 (want http-1k, http-1m, https-1k, https-close, h2-1k, h2-1k-1s, h2-1m, h3-1k, h3-close or http-html64k)" ;;
	esac
}

RESULTS=$WORK/results.jsonl
: >"$RESULTS"
ROUND=1
# row PROXY CELL STATUS NOTE: a row without figures (skipped, failed, n/a,
# ...) and why, for this round.
row() {
	"$BENCHTAB" row -results "$RESULTS" -proxy "$1" -cell "$2" -round "$ROUND" -status "$3" -note "$4"
}

# load_cmd URL DURATION [LOG]: sets LOAD, the current cell's load command
# (cell_spec) against URL for DURATION, and TOOL, which tool it is (wrk,
# h2load or h3load). LOG, for h2load only, is its per-request log file.
load_cmd() {
	local url=$1 d=$2 logf=${3:-}
	if ((H2)); then
		# h2 only (no http/1.1 fallback, so a proxy that does not offer h2
		# fails the cell rather than measuring HTTP/1.1). --log-file:
		# per-request times, for the percentiles h2load does not print.
		TOOL=h2load
		LOAD=("$H2LOAD" -t "$THREADS" -c "$H2_CLIENTS" -m "$H2_STREAMS" --npn-list=h2 -D "$d")
		[[ -n $logf ]] && LOAD+=(--log-file="$logf")
		LOAD+=("$url")
	elif ((H3)); then
		# -insecure, as curl -k and wrk (scafo-edge's certificate comes from
		# its internal CA).
		TOOL=h3load
		LOAD=("$H3LOAD" -url "$url" -c "$H2_CLIENTS" -m "$H2_STREAMS" -insecure -timeout 10s -json -d "$d")
		# h3-close: a new connection per request, as https-close's wrk
		# makes them: resuming each worker's previous session (wrk's
		# OpenSSL does; the direct https-close row counts it), never
		# 0-RTT, and X25519, the key exchange wrk's OpenSSL 3.0 gets
		# (Go's client would offer X25519MLKEM768 first).
		((CLOSE)) && LOAD+=(-close -resume -curves X25519)
	else
		TOOL=wrk
		LOAD=("$WRK" -t "$THREADS" -c "$CONNS" --latency --timeout 10s -d "$d")
		((CLOSE)) && LOAD+=(-H 'Connection: close')
		[[ -n $ENCODING ]] && LOAD+=(-H "Accept-Encoding: $ENCODING")
		LOAD+=("$url")
	fi
}

# warm_up URL: the unmeasured load before a window, a run of its own (the
# tools' own warm-up options would fall inside the CPU window).
warm_up() {
	[[ $WARMUP == 0 || $WARMUP == 0s ]] && return 0
	load_cmd "$1" "$WARMUP"
	"${LOAD[@]}" >/dev/null 2>&1 || true
}

# wait_h3 URL PID: until a one-request h3load probe of URL succeeds, while
# PID lives; wait_ok asked over TCP, this waits for the UDP side. On failure
# WHY says what the last probe saw.
wait_h3() {
	local url=$1 pid=$2 i
	for ((i = 0; i < 50; i++)); do
		if "$H3LOAD" -url "$url" -c 1 -m 1 -d 200ms -insecure -timeout 2s -json 2>/dev/null |
			tail -1 | grep -q '"requests":[1-9].*"errors":0,"non2xx":0'; then
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.2
	done
	WHY=$("$H3LOAD" -url "$url" -c 1 -m 1 -d 1s -insecure -timeout 2s 2>&1 | grep -v '^\s*$' | tail -1 | cut -c1-200)
	return 1
}

# proxy_url PROXY: the URL of the current cell (cell_spec) on PROXY.
proxy_url() {
	local port=$PX_PORT tls_port=$PX_TLS_PORT
	[[ $1 == direct ]] && port=$UP_PORT tls_port=$UP_TLS_PORT
	if [[ $SCHEME == https ]]; then echo "https://$HOST:$tls_port$PATH_"; else echo "http://$HOST:$port$PATH_"; fi
}

# measure PROXY CELL PID RESULTS DIR [FLAGS...]: one measured window of the
# current cell's load on PID (its whole process tree), appended to RESULTS
# as a row by bench/benchtab; OUT, in DIR, is the load's output.
measure() {
	local proxy=$1 cell=$2 pid=$3 results=$4 dir=$5 url h2log
	shift 5
	url=$(proxy_url "$proxy")
	h2log=$dir/h2load-$proxy-$cell.log
	load_cmd "$url" "$DURATION" "$h2log"
	OUT=$dir/$TOOL-$proxy-$cell.txt
	local flags=(-results "$results" -proxy "$proxy" -cell "$cell" -round "$ROUND" -tool "$TOOL"
		-pid "$pid" -upstream-pid "$UP_PID" -out "$OUT" -clock-ticks "$CLK_TCK" "$@")
	((H2)) && flags+=(-h2load-log "$h2log")
	"$BENCHTAB" measure "${flags[@]}" -- "${LOAD[@]}"
}

# encoding_note URL: the Content-Encoding and body size of one response of
# URL asked for with the cell's Accept-Encoding (not decoded).
encoding_note() {
	local out ce size
	out=$("$CURL" -s -o /dev/null -D - -w 'size=%{size_download}\n' --max-time 5 -H "Accept-Encoding: $ENCODING" "$1" 2>/dev/null | tr -d '\r') || true
	ce=$(awk -F': *' 'tolower($1) == "content-encoding" { print $2 }' <<<"$out")
	size=$(sed -n 's/^size=//p' <<<"$out")
	echo "Accept-Encoding: $ENCODING: Content-Encoding ${ce:-none (identity)}, ${size:-?} bytes of body"
}

run_cell() {
	local proxy=$1 cell=$2 url pid
	cell_spec "$cell"
	local tls=0
	[[ $SCHEME == https ]] && tls=1
	if [[ -n ${SKIP[$proxy]:-} ]]; then
		row "$proxy" "$cell" skipped "${SKIP[$proxy]}"
		return
	fi
	if [[ $proxy == go-tls && $SCHEME != https ]]; then
		row "$proxy" "$cell" n/a "go-tls is the floor of the TLS cells; the direct row is plain HTTP's"
		return
	fi
	if ((H2)) && [[ $proxy == direct ]]; then
		# No ceiling to invent: the origin speaks HTTP/1.1 only, so the h2
		# cells have no direct row, and no "× direct".
		row "$proxy" "$cell" n/a "no h2 row: the upstream speaks HTTP/1.1 only, so the h2 cells have no ceiling and no × direct"
		return
	fi
	if ((H3)); then
		# scafo-edge and Caddy serve HTTP/3 on quic-go, Traefik too (quic-go
		# under its --entryPoints.<name>.http3); the other rows stay in the
		# table and say why they are empty.
		case $proxy in
		direct)
			row "$proxy" "$cell" n/a "no h3 row: the upstream speaks HTTP/1.1 over TCP only, so the h3 cells have no ceiling and no × direct"
			return ;;
		nginx)
			row "$proxy" "$cell" "no HTTP/3 in this build" "Debian's nginx ${VERSION[nginx]:-} has no http_v3_module"
			return ;;
		haproxy)
			row "$proxy" "$cell" "no HTTP/3 in this build" "Debian's HAProxy ${VERSION[haproxy]:-} is built without QUIC (-QUIC)"
			return ;;
		esac
	fi
	log "$proxy $cell"
	url=$(proxy_url "$proxy")
	if [[ $proxy == direct ]]; then
		pid=$UP_PID
	else
		start_proxy "$proxy" "$tls" "$H2" "$H3" "$((${#ENCODING} > 0))"
		pid=$PID
	fi
	if ! wait_ok "$url" "$SIZE" "$pid"; then
		local why
		why=$(grep -v '^\s*$' "$WORK/$proxy.log" 2>/dev/null | tail -1 | cut -c1-200)
		if [[ $proxy == scafo-edge* ]] && ((tls)); then
			why="--tls internal not available yet: $why"
		fi
		log "$proxy $cell: not serving: $why"
		row "$proxy" "$cell" failed "$why"
		[[ $proxy != direct ]] && stop_tree "$pid"
		return
	fi
	if ((H3)) && ! wait_h3 "$url" "$pid"; then
		log "$proxy $cell: no HTTP/3 answer: $WHY"
		row "$proxy" "$cell" failed "no HTTP/3 answer on UDP $PX_TLS_PORT: $WHY"
		stop_tree "$pid"
		return
	fi
	local idle_kib
	idle_kib=$("$BENCHTAB" rss "$pid")
	warm_up "$url"
	# The direct https-close row: wrk keeps each connection's TLS session,
	# so its new connections resume; the upstream counts how many did (the
	# other servers issue tickets too) and the row's note says so.
	local stats=()
	[[ $proxy == direct && $cell == https-close ]] && stats=(-stats-url "https://127.0.0.1:$UP_TLS_PORT/stats")
	# The compression cell: what one response asked for as wrk asks was
	# (its Content-Encoding and body size), the row's note.
	[[ -n $ENCODING ]] && stats+=(-note "$(encoding_note "$url")")
	measure "$proxy" "$cell" "$pid" "$RESULTS" "$WORK" -idle-kib "$idle_kib" "${stats[@]}" ||
		row "$proxy" "$cell" failed "bench/benchtab measure failed (see the log above)"
	[[ $proxy != direct ]] && stop_tree "$pid"
	return 0
}

# ------------------------------------------------------------------ report

# report [--json]: the table (or the JSON) of every round's rows: medians,
# "× direct" per round, the edge's targets (bench/benchtab report).
report() {
	local flags=(-results "$RESULTS" -cpus "$(nproc)" -duration "$DURATION" -warmup "$WARMUP"
		-rounds "$ROUNDS" -connections "$CONNS" -threads "$THREADS" -workers "$WORKERS") p
	for p in "${!VERSION[@]}"; do flags+=(-version "$p=${VERSION[$p]}"); done
	"$BENCHTAB" report "${flags[@]}" "$@"
}

# ----------------------------------------------------------------- profile

# profile: scafo-edge itself, started as the table starts it, under the
# load of each cell of --cells, profiled through its admin listener's
# /debug/pprof (served to loopback): a CPU profile of the measured window,
# allocation profiles at its two ends, and the window's per-request figures
# (bench/benchtab, as in the table). DIR/<cell>/ gets cpu.pprof,
# allocs-before.pprof, allocs-after.pprof, the load's output and
# summary.md; bench/pgo.sh merges the CPU profiles into default.pgo.
profile() {
	[[ -n $EDGE_BIN ]] || die "scafo-edge: $EDGE_NOTE"
	local secs=${DURATION%s} cell
	[[ $secs =~ ^[0-9]+$ ]] || die "--profile needs --duration in whole seconds (e.g. 10s)"
	write_config scafo-edge
	for cell in "${cell_list[@]}"; do profile_cell "$cell" "$secs"; done
}

profile_cell() {
	local cell=$1 secs=$2 dir=$PROFILE_DIR/$1 pp=http://127.0.0.1:$ADMIN_PORT/debug/pprof
	cell_spec "$cell"
	local tls=0 url
	[[ $SCHEME == https ]] && tls=1
	mkdir -p "$dir"
	rm -f "$dir/window.jsonl"
	start_proxy scafo-edge "$tls" "$H2" "$H3"
	local pid=$PID
	url=$(proxy_url scafo-edge)
	wait_ok "$url" "$SIZE" "$pid" || die "scafo-edge did not start: $(tail -3 "$WORK/scafo-edge.log")"
	if ((H3)) && ! wait_h3 "$url" "$pid"; then die "scafo-edge: no HTTP/3 answer: $WHY"; fi
	warm_up "$url"

	log "profiling scafo-edge: CPU for ${secs}s under the $cell load"
	"$CURL" -sf -o "$dir/allocs-before.pprof" "$pp/allocs" || die "GET $pp/allocs failed: is pprof served on the admin listener?"
	"$CURL" -sf -o "$dir/cpu.pprof" "$pp/profile?seconds=$secs" &
	local curl_pid=$!
	measure scafo-edge "$cell" "$pid" "$dir/window.jsonl" "$dir" || true
	wait "$curl_pid" || die "GET $pp/profile failed"
	"$CURL" -sf -o "$dir/allocs-after.pprof" "$pp/allocs" || die "GET $pp/allocs failed"
	stop_tree "$pid"
	"$BENCHTAB" window -results "$dir/window.jsonl" >/dev/null ||
		die "profile: $(tail -1 "$dir/window.jsonl")"

	local top=(go tool pprof -top) base=(-base "$dir/allocs-before.pprof" "$EDGE_BIN" "$dir/allocs-after.pprof")
	# shellcheck disable=SC2016 # the backquotes are Markdown's, not the shell's
	{
		printf '## scafo-edge (%s) under the %s load (%s)\n\n' "$EDGE_VERSION" "$cell" "$DURATION"
		grep -E 'Requests/sec| requests in |^finished in|^requests:|^\{' "$OUT" | sed 's/^ */    /'
		"$BENCHTAB" window -results "$dir/window.jsonl"
		printf '\n### CPU (go tool pprof -top -nodecount=40 %s/cpu.pprof)\n\n```\n' "$dir"
		"${top[@]}" -nodecount=40 "$EDGE_BIN" "$dir/cpu.pprof" 2>/dev/null
		printf '```\n\n### CPU, cumulative (-top -cum -nodecount=40)\n\n```\n'
		"${top[@]}" -cum -nodecount=40 "$EDGE_BIN" "$dir/cpu.pprof" 2>/dev/null
		printf '```\n\n### Allocations in the window (alloc_objects, -base allocs-before)\n\n'
		"${top[@]}" -nodecount=1 -sample_index=alloc_objects "${base[@]}" >"$dir/allocs-objects.top" 2>/dev/null
		"${top[@]}" -nodecount=1 -unit=B -sample_index=alloc_space "${base[@]}" >"$dir/allocs-bytes.top" 2>/dev/null
		"$BENCHTAB" allocs -results "$dir/window.jsonl" -objects "$dir/allocs-objects.top" -bytes "$dir/allocs-bytes.top"
		printf '\n```\n'
		"${top[@]}" -nodecount=30 -sample_index=alloc_objects "${base[@]}" 2>/dev/null
		printf '```\n\n'
	} | tee "$dir/summary.md"
}

if [[ -n $PROFILE_DIR ]]; then
	IFS=, read -r -a cell_list <<<"$CELLS"
	for cell in "${cell_list[@]}"; do cell_spec "$cell"; done
	profile
	exit 0
fi

# ------------------------------------------------------------------- main

IFS=, read -r -a cell_list <<<"$CELLS"
for cell in "${cell_list[@]}"; do cell_spec "$cell"; done
proxy_list=(direct)
for p in scafo-edge caddy traefik nginx haproxy go-tls; do
	has "$PROXIES" "$p" && proxy_list+=("$p")
	# The baseline right after the edge, in every round: same conditions.
	if [[ $p == scafo-edge && -n $BASELINE ]]; then proxy_list+=("$BASELINE"); fi
done
for p in ${PROXIES//,/ }; do
	case $p in direct | scafo-edge | caddy | traefik | nginx | haproxy | go-tls) ;; *) die "unknown proxy $p" ;; esac
done

for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
	((ROUNDS > 1)) && log "round $ROUND of $ROUNDS"
	for cell in "${cell_list[@]}"; do
		for proxy in "${proxy_list[@]}"; do
			run_cell "$proxy" "$cell"
		done
	done
done

if ((JSON)); then report -json; else report; fi
if [[ -n $JSON_FILE ]]; then report -json >"$JSON_FILE"; fi
