#!/usr/bin/env bash
# bench/run.sh: scafo-edge side by side with the proxies it replaces, on one
# machine, in one run (issue 8). See bench/README.md for how to read it.
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
  --proxies LIST       comma list of: direct,scafo-edge,caddy,traefik,nginx,haproxy
                       (default: all; direct is always run, it is the ceiling)
  --cells LIST         comma list of: http-1k,http-1m,https-1k,https-close,
                       h2-1k,h2-1k-1s,h2-1m,h3-1k; "all" for every one
                       (default: the four HTTP/1.1 cells; the h2 cells, h2load
                       over TLS, are opt-in: with them a default run passes
                       ten minutes; so is h3-1k, HTTP/3 with bench/h3load,
                       scafo-edge and Caddy only)
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
                       the edge's request path under the http-1k load,
                       written to DIR with a text summary on stdout
  --edge-rev REV       build scafo-edge from commit REV, not the working
                       tree (which, when it does not build, gives way to HEAD)
  --baseline-rev REV   also measure scafo-edge built from commit REV, as an
                       extra row scafo-edge@<hash> beside scafo-edge in every
                       cell and round: before and after in one run
  --keep               keep the work directory (configs, logs, wrk output)
  -h, --help           this text
EOF
}

# ---------------------------------------------------------------- settings

DURATION=10s
WARMUP=3s
ROUNDS=1
CONNS=64
THREADS=2
WORKERS=$(nproc)
PROXIES=direct,scafo-edge,caddy,traefik,nginx,haproxy
CELLS=http-1k,http-1m,https-1k,https-close
JSON=0
JSON_FILE=
INSTALL=1
RETRY_BUILDS=0
PORT_BASE=18080
PROFILE_DIR=
EDGE_REV=
BASELINE_REV=
KEEP=0
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/scafo-bench
CADDY_VERSION=v2.11.9
TRAEFIK_MODULE=github.com/traefik/traefik/v3
TRAEFIK_VERSION=v3.7.9

while (($#)); do
	case $1 in
	--quick) DURATION=3s WARMUP=1s ;;
	--duration) DURATION=$2; shift ;;
	--warmup) WARMUP=$2; shift ;;
	--rounds) ROUNDS=$2; shift ;;
	--proxies) PROXIES=$2; shift ;;
	--cells) CELLS=$2; shift ;;
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
	--baseline-rev) BASELINE_REV=$2; shift ;;
	--keep) KEEP=1 ;;
	-h | --help) usage; exit 0 ;;
	*) echo "run.sh: unknown flag $1" >&2; usage >&2; exit 2 ;;
	esac
	shift
done
[[ $CELLS == all ]] && CELLS=http-1k,http-1m,https-1k,https-close,h2-1k,h2-1k-1s,h2-1m,h3-1k

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLK_TCK=$(getconf CLK_TCK)

# Ports, all on 127.0.0.1.
UP_PORT=$PORT_BASE              # upstream, plain
UP_TLS_PORT=$((PORT_BASE + 1))  # upstream, TLS (direct HTTPS ceiling)
PX_PORT=$((PORT_BASE + 2))      # proxy, plain
PX_TLS_PORT=$((PORT_BASE + 3))  # proxy, TLS
ADMIN_PORT=$((PORT_BASE + 4))   # scafo-edge admin, edgeprof pprof
HOST=localhost                  # the one routed host; also the TLS name

log() { printf '%s\n' "run.sh: $*" >&2; }
die() { log "$*"; exit 1; }

has() { [[ ,$1, == *,$2,* ]]; }

# ------------------------------------------------------- processes, cleanup

WORK=$(mktemp -d "${TMPDIR:-/tmp}/scafo-bench.XXXXXX")
chmod 755 "$WORK" # nginx workers may run as another user
STARTED=()         # every pid this script started

cleanup() {
	local p
	for p in "${STARTED[@]}"; do stop_tree "$p"; done
	if ((KEEP)); then log "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start LOG CMD... runs CMD in the background; its pid is in $PID.
start() {
	local logf=$1; shift
	"$@" >"$logf" 2>&1 &
	PID=$!
	STARTED+=("$PID")
}

# proc_tree PID prints PID and all its descendants.
proc_tree() {
	local root=$1
	local -A parent=()
	local f line rest pid
	for f in /proc/[0-9]*/stat; do
		read -r line 2>/dev/null <"$f" || continue
		pid=${f#/proc/}; pid=${pid%/stat}
		rest=${line##*) }
		set -- $rest
		parent[$pid]=$2
	done
	local -A keep=([$root]=1)
	local changed=1
	while ((changed)); do
		changed=0
		for pid in "${!parent[@]}"; do
			if [[ -z ${keep[$pid]:-} && -n ${keep[${parent[$pid]}]:-} ]]; then
				keep[$pid]=1; changed=1
			fi
		done
	done
	printf '%s\n' "${!keep[@]}"
}

# stop_tree PID: SIGTERM, then SIGKILL for whatever of its tree is left
# after 5 s. Only processes this script started, and their children.
stop_tree() {
	local pid=$1 pids i
	kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
	pids=$(proc_tree "$pid")
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	for i in $pids; do kill -KILL "$i" 2>/dev/null || true; done
	wait "$pid" 2>/dev/null || true
}

# ---------------------------------------------------------- /proc figures

# cpu_ticks PIDS...: utime+stime summed (clock ticks), all threads included.
cpu_ticks() {
	local sum=0 line rest pid
	for pid in "$@"; do
		read -r line 2>/dev/null <"/proc/$pid/stat" || continue
		rest=${line##*) }
		set -- $rest
		sum=$((sum + ${12} + ${13}))
	done
	echo "$sum"
}

# status_kib FIELD PIDS...: a kB field of /proc/PID/status, summed.
status_kib() {
	local field=$1 sum=0 k v pid
	shift
	for pid in "$@"; do
		while read -r k v _; do
			[[ $k == "$field:" ]] && sum=$((sum + v))
		done 2>/dev/null <"/proc/$pid/status" || true
	done
	echo "$sum"
}

# ctx_switches PIDS...: voluntary + involuntary context switches of every
# thread: how often the proxy went to sleep or was preempted.
ctx_switches() {
	local sum=0 k v pid f
	for pid in "$@"; do
		for f in /proc/"$pid"/task/*/status; do
			while read -r k v; do
				case $k in voluntary_ctxt_switches: | nonvoluntary_ctxt_switches:) sum=$((sum + v)) ;; esac
			done 2>/dev/null <"$f" || true
		done
	done
	echo "$sum"
}

# rw_syscalls PIDS...: read- and write-family syscalls (syscr+syscw of
# /proc/PID/io). recv/send/epoll are not counted, so this compares Go
# programs with each other (they read and write sockets with read/write),
# not with nginx or HAProxy.
rw_syscalls() {
	local sum=0 k v pid
	for pid in "$@"; do
		while read -r k v; do
			case $k in syscr: | syscw:) sum=$((sum + v)) ;; esac
		done 2>/dev/null <"/proc/$pid/io" || true
	done
	echo "$sum"
}

# ------------------------------------------------------------ installing

APT_UPDATED=0
apt_install() {
	((INSTALL)) || return 1
	local sudo=()
	if ((EUID != 0)); then
		command -v sudo >/dev/null || { log "not root and no sudo: cannot install $*"; return 1; }
		sudo=(sudo -n)
	fi
	log "installing from Debian: $*"
	if ((!APT_UPDATED)); then
		"${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 || return 1
		APT_UPDATED=1
	fi
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 \
		install -y -qq --no-install-recommends "$@" >&2
}

# find_bin NAME: the path of NAME, also looking in sbin (nginx and haproxy
# live there and a non-root PATH lacks it).
find_bin() {
	command -v "$1" 2>/dev/null && return 0
	local d
	for d in /usr/sbin /sbin /usr/local/sbin; do
		[[ -x $d/$1 ]] && { echo "$d/$1"; return 0; }
	done
	return 1
}

# need NAME [PACKAGE]: the path of a Debian-packaged tool, installed if missing.
need() {
	local p
	p=$(find_bin "$1") && { echo "$p"; return 0; }
	apt_install "${2:-$1}" || return 1
	find_bin "$1"
}

# cached_build NAME BINARY DIR SPEC STEP: DIR/bin/BINARY, built once by
# STEP DIR SPEC (run in a subshell, its output kept in DIR/build.log). A
# failed build is remembered in DIR/failed.log with its reason and not tried
# again unless --retry-builds.
cached_build() {
	local name=$1 bin=$2 dir=$3 spec=$4 step=$5
	if [[ -x $dir/bin/$bin ]]; then echo "$dir/bin/$bin"; return 0; fi
	if [[ -f $dir/failed.log ]] && ((!RETRY_BUILDS)); then
		log "$name: skipped: building $spec failed earlier (see $dir/failed.log; --retry-builds to try again):"
		grep -v '^go: downloading' "$dir/failed.log" | tail -5 | sed 's/^/    /' >&2
		return 1
	fi
	((INSTALL)) || { log "$name: not built and --no-install given"; return 1; }
	mkdir -p "$dir"
	log "$name: building $spec into $dir (first run only; several minutes)"
	if ("$step" "$dir" "$spec") >"$dir/build.log" 2>&1; then
		rm -f "$dir/failed.log"
		echo "$dir/bin/$bin"
		return 0
	fi
	mv "$dir/build.log" "$dir/failed.log"
	log "$name: skipped: building $spec failed:"
	grep -v '^go: downloading' "$dir/failed.log" | tail -5 | sed 's/^/    /' >&2
	return 1
}

# go_install DIR BINARY MODULE/CMD@VERSION: a Go command built into
# CACHE/DIR/bin by go install, once (cached_build).
go_install() {
	cached_build "$1" "$2" "$CACHE/$1" "$3" go_install_step
}

go_install_step() {
	# Run outside the repository so its go.mod plays no part.
	cd "$1" && GOBIN=$1/bin GOFLAGS='' go install "$2"
}

# go_mod_version BINARY: the main module version a Go binary was built from
# (Caddy's own "version" says "unknown" when built by go install).
go_mod_version() {
	# awk reads to the end: quitting early would fail the pipeline (SIGPIPE
	# under pipefail) and, through set -e, the whole run.
	go version -m "$1" 2>/dev/null | awk '$1 == "mod" && !v { v = $3 } END { print v }'
}

# traefik_build: Traefik TRAEFIK_VERSION built into CACHE/traefik-VERSION/bin,
# once (cached_build). go install refuses Traefik (its go.mod has replace
# directives: forked dependencies), but the module downloads, and a go build
# inside its own source tree honours them. One replace points at a nested
# module, ./pkg/config/dynamic/ext, which the module zip leaves out (a zip
# holds one module): it is two empty extension types, written here. Every
# other dependency comes from the module proxy.
traefik_build() {
	cached_build traefik traefik "$CACHE/traefik-$TRAEFIK_VERSION" "$TRAEFIK_MODULE@$TRAEFIK_VERSION" traefik_build_step
}

traefik_build_step() {
	local dir=$1 spec=$2 src=$WORK/traefik-src
	trap 'rm -rf "$src"' EXIT
	# Each step || exit: set -e does not hold inside an if's condition.
	# Outside the repository, so its go.mod plays no part.
	cd "$dir" || exit
	mod=$(GOFLAGS='' go mod download -json "$spec") || { printf '%s\n' "$mod"; exit 1; }
	moddir=$(printf '%s\n' "$mod" | awk -F'"' '$2 == "Dir" { print $4 }')
	[[ -d $moddir ]] || { printf '%s\n' "$mod"; exit 1; }
	# The module cache is read-only: build in a writable copy.
	cp -r "$moddir" "$src" && chmod -R u+w "$src" || exit
	mkdir -p "$src/pkg/config/dynamic/ext" || exit
	printf 'module github.com/traefik/traefik/dynamic/ext\n\ngo 1.24\n' >"$src/pkg/config/dynamic/ext/go.mod" || exit
	printf '%s\n' '// Package ext: the empty extension points of the dynamic configuration.' \
		'package ext' '' 'type HTTP struct{}' '' 'type Router struct{}' >"$src/pkg/config/dynamic/ext/ext.go" || exit
	cd "$src" && mkdir -p "$dir/bin" || exit
	# Beside, then renamed: an interrupted build leaves nothing the next
	# run would take as built.
	CGO_ENABLED=0 GOFLAGS='' go build -trimpath -o "$dir/bin/traefik.tmp" \
		-ldflags "-X github.com/traefik/traefik/v3/pkg/version.Version=$TRAEFIK_VERSION" ./cmd/traefik || exit
	mv "$dir/bin/traefik.tmp" "$dir/bin/traefik"
}

# ------------------------------------------------------------- the tools

command -v go >/dev/null || die "Go is needed (the version go.mod names) to build scafo-edge and the upstream"
WRK=$(need wrk) || die "wrk is needed (Debian package wrk)"
CURL=$(need curl) || die "curl is needed (Debian package curl)"
OPENSSL=$(need openssl) || die "openssl is needed (Debian package openssl)"
# h2load (nghttp2's load generator) only for the h2 cells: wrk speaks no h2.
H2LOAD=
if [[ ,$CELLS, == *,h2-* ]] && [[ -z $PROFILE_DIR ]]; then
	H2LOAD=$(need h2load nghttp2-client) || die "h2load is needed for the h2 cells (Debian package nghttp2-client)"
fi
mkdir -p "$CACHE"

log "building the upstream"
(cd "$REPO" && go build -o "$CACHE/bench-upstream" ./bench/upstream) || die "build bench/upstream failed"
# scafo-edge (or, for --profile, bench/edgeprof) is built from the working
# tree, or from --edge-rev. Other people may be mid-edit in the working tree:
# when it does not build, the newest of the last six commits that builds is
# measured instead, and the table says which.
EDGE_PKG=./cmd/scafo-edge EDGE_OUT=$CACHE/scafo-edge
if [[ -n $PROFILE_DIR ]]; then EDGE_PKG=./bench/edgeprof EDGE_OUT=$CACHE/edgeprof; fi
SRC=$REPO
EDGE_BIN='' EDGE_NOTE='' EDGE_VERSION=''

# export_rev REV [DIR]: REV's tree, with this checkout's bench/ over it, in
# DIR (default WORK/src), which becomes SRC.
export_rev() {
	local dir=${2:-$WORK/src}
	rm -rf "$dir" && mkdir -p "$dir"
	(cd "$REPO" && git archive "$1") | tar -x -C "$dir" || return 1
	rm -rf "$dir/bench" && cp -r "$REPO/bench" "$dir/bench"
	SRC=$dir
}
build_edge() { (cd "$SRC" && go build -o "$EDGE_OUT" "$EDGE_PKG") 2>"$WORK/edge-build.log"; }

# bench/h3load (HTTP/3 over quic-go, the stack scafo-edge and Caddy serve it
# with) only for the h3 cells: built from this checkout, once per run.
H3LOAD=
if [[ ,$CELLS, == *,h3-* ]] && [[ -z $PROFILE_DIR ]]; then
	log "building bench/h3load"
	(cd "$REPO" && go build -o "$WORK/h3load" ./bench/h3load) || die "build bench/h3load failed"
	H3LOAD=$WORK/h3load
fi

if [[ -n $EDGE_REV ]]; then
	export_rev "$EDGE_REV" || die "--edge-rev $EDGE_REV: git archive failed"
	EDGE_VERSION=$(cd "$REPO" && git rev-parse --short "$EDGE_REV")
else
	EDGE_VERSION="$(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$REPO" && git diff --quiet HEAD -- . 2>/dev/null || echo '+dirty')"
fi
log "building $EDGE_PKG from ${EDGE_REV:+commit $EDGE_REV of }$REPO"
if build_edge; then
	EDGE_BIN=$EDGE_OUT
elif [[ -z $EDGE_REV ]] && (cd "$REPO" && git rev-parse -q --verify HEAD >/dev/null 2>&1); then
	# A shared checkout can be mid-edit, and even a commit can lean on a
	# file not yet committed: try HEAD, then up to five commits back.
	log "$EDGE_PKG: the working tree does not build:"
	grep -v '^#' "$WORK/edge-build.log" | head -2 | sed 's/^/    /' >&2
	for rev in HEAD HEAD~1 HEAD~2 HEAD~3 HEAD~4 HEAD~5; do
		(cd "$REPO" && git rev-parse -q --verify "$rev" >/dev/null 2>&1) || break
		log "$EDGE_PKG: building $rev ($(cd "$REPO" && git rev-parse --short "$rev")) instead"
		if export_rev "$rev" && build_edge; then
			EDGE_BIN=$EDGE_OUT
			EDGE_VERSION="$(cd "$REPO" && git rev-parse --short "$rev") ($rev; the working tree did not build)"
			break
		fi
		grep -v '^#' "$WORK/edge-build.log" | head -1 | sed 's/^/    /' >&2
	done
fi
if [[ -z $EDGE_BIN ]]; then
	EDGE_NOTE="build failed: $(grep -v '^#' "$WORK/edge-build.log" | head -1)"
	log "$EDGE_PKG: $EDGE_NOTE"
fi

# --baseline-rev: a second scafo-edge, from commit BASELINE_REV, measured as
# its own row (BASELINE, "scafo-edge@<short hash>") right after scafo-edge,
# so before and after see the same machine (issue 13). Built as the edge is
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
		( export_rev "$hash" "$WORK/src-baseline" && cd "$SRC" &&
			go build -o "$dir/scafo-edge.tmp" ./cmd/scafo-edge ) 2>"$WORK/baseline-build.log" &&
			mv "$dir/scafo-edge.tmp" "$dir/scafo-edge" ||
			die "--baseline-rev $BASELINE_REV does not build: $(grep -v '^#' "$WORK/baseline-build.log" | head -2 | tr '\n' ' ')"
	fi
	BASELINE_BIN=$dir/scafo-edge
fi

for p in "$UP_PORT" "$UP_TLS_PORT" "$PX_PORT" "$PX_TLS_PORT" "$ADMIN_PORT"; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
		die "port $p is in use on 127.0.0.1; pick other ports with --port-base"
	fi
done

# A certificate already held: self-signed ECDSA P-256 for localhost (what
# the edge's internal CA issues too), so no handshake pays for a bigger key.
"$OPENSSL" req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
	-subj "/CN=$HOST" -addext "subjectAltName=DNS:$HOST,IP:127.0.0.1" \
	-keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null || die "openssl could not make a certificate"
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

write_edge_routes() {
	cat >"$WORK/routes.json" <<EOF
{"v": 1, "routes": [{"host": "$HOST", "application": "bench",
  "upstreams": [{"node": "bench", "address": "127.0.0.1:$UP_PORT"}]}]}
EOF
}

# write_caddy_config [h3]: caddy.json, or with h3, caddy-h3.json, whose TLS
# server also lists h3 (Caddy then serves HTTP/3 on the UDP side of its
# HTTPS port). Two files, so the other cells run the configuration they
# always have.
write_caddy_config() {
	local conf=caddy.json protos='"h1", "h2"'
	[[ ${1:-} == h3 ]] && conf=caddy-h3.json protos='"h1", "h2", "h3"'
	# Two servers: Caddy makes every listener of a server TLS once it has a
	# connection policy. Admin API and automatic HTTPS off; logs at ERROR
	# (no access log is configured); idle pool sized for the load.
	local rp
	rp='{"handler": "reverse_proxy", "upstreams": [{"dial": "127.0.0.1:'$UP_PORT'"}],
	     "transport": {"protocol": "http", "keep_alive": {"enabled": true,
	       "max_idle_conns": 256, "max_idle_conns_per_host": 256}}}'
	cat >"$WORK/$conf" <<EOF
{
  "admin": {"disabled": true},
  "logging": {"logs": {"default": {"level": "ERROR"}}},
  "storage": {"module": "file_system", "root": "$WORK/caddy-data"},
  "apps": {
    "tls": {"certificates": {"load_files": [
      {"certificate": "$WORK/cert.pem", "key": "$WORK/key.pem", "tags": ["bench"]}]}},
    "http": {"servers": {
      "plain": {"listen": ["127.0.0.1:$PX_PORT"], "protocols": ["h1"],
        "automatic_https": {"disable": true},
        "routes": [{"match": [{"host": ["$HOST"]}], "handle": [$rp], "terminal": true}]},
      "tls": {"listen": ["127.0.0.1:$PX_TLS_PORT"], "protocols": [$protos],
        "automatic_https": {"disable": true},
        "tls_connection_policies": [{"certificate_selection": {"any_tag": ["bench"]}}],
        "routes": [{"match": [{"host": ["$HOST"]}], "handle": [$rp], "terminal": true}]}
    }}
  }
}
EOF
}

write_traefik_config() {
	# The file provider's dynamic configuration (the static one is the
	# command line, in start_proxy): a router for any host on each entry
	# point, the bench certificate as the default one, so the TLS entry
	# point serves it (and h2, which Traefik offers by ALPN by default).
	# No access log is configured, so none is written.
	cat >"$WORK/traefik.yml" <<EOF
http:
  routers:
    plain: {rule: "PathPrefix(\`/\`)", entryPoints: [plain], service: up}
    tls: {rule: "PathPrefix(\`/\`)", entryPoints: [tls], service: up, tls: {}}
  services:
    up:
      loadBalancer:
        serversTransport: bench
        servers: [{url: "http://127.0.0.1:$UP_PORT"}]
  serversTransports:
    bench: {maxIdleConnsPerHost: 256}
tls:
  stores:
    default:
      defaultCertificate: {certFile: "$WORK/cert.pem", keyFile: "$WORK/key.pem"}
EOF
}

# write_nginx_config [h2]: nginx.conf, or with h2, nginx-h2.conf, whose TLS
# listener also offers h2 by ALPN (the h2 cells). Two files, so the HTTP/1.1
# cells run the configuration they always have.
write_nginx_config() {
	mkdir -p "$WORK/nginx/tmp"
	local user= conf=nginx.conf http2=
	[[ ${1:-} == h2 ]] && conf=nginx-h2.conf http2=' http2'
	((EUID == 0)) && user='user root;'
	# reuseport: otherwise one worker accepts every connection. Buffering
	# off: bodies stream through a 32 KiB buffer, as the Go proxies copy
	# them, instead of spooling a 1 MiB body to a temporary file.
	cat >"$WORK/nginx/$conf" <<EOF
$user
worker_processes $WORKERS;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log error;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000000;
  keepalive_timeout 120s;
  client_body_temp_path $WORK/nginx/tmp/body;
  proxy_temp_path $WORK/nginx/tmp/proxy;
  fastcgi_temp_path $WORK/nginx/tmp/fastcgi;
  uwsgi_temp_path $WORK/nginx/tmp/uwsgi;
  scgi_temp_path $WORK/nginx/tmp/scgi;
  upstream up {
    server 127.0.0.1:$UP_PORT;
    keepalive 256;
    keepalive_requests 100000000;
    keepalive_timeout 120s;
  }
  server {
    listen 127.0.0.1:$PX_PORT reuseport;
    listen 127.0.0.1:$PX_TLS_PORT ssl$http2 reuseport;
    server_name $HOST;
    ssl_certificate $WORK/cert.pem;
    ssl_certificate_key $WORK/key.pem;
    location / {
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_buffering off;
      proxy_buffer_size 32k;
      proxy_buffers 4 32k;
      proxy_busy_buffers_size 64k;
    }
  }
}
EOF
}

# write_haproxy_config [h2]: haproxy.cfg, or with h2, haproxy-h2.cfg, whose
# TLS bind offers h2 before http/1.1 by ALPN (the h2 cells).
write_haproxy_config() {
	local conf=haproxy.cfg alpn=http/1.1
	[[ ${1:-} == h2 ]] && conf=haproxy-h2.cfg alpn=h2,http/1.1
	cat >"$WORK/$conf" <<EOF
global
  nbthread $WORKERS
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 120s
  timeout server 120s
  timeout http-keep-alive 120s
  option http-keep-alive
  option forwardfor
  http-reuse always
frontend bench
  bind 127.0.0.1:$PX_PORT
  bind 127.0.0.1:$PX_TLS_PORT ssl crt $WORK/bundle.pem alpn $alpn
  http-request set-header X-Forwarded-Proto https if { ssl_fc }
  http-request set-header X-Forwarded-Proto http if !{ ssl_fc }
  default_backend up
backend up
  server up 127.0.0.1:$UP_PORT pool-max-conn 256
EOF
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
	if has "$PROXIES" scafo-edge; then
		if [[ -n $EDGE_BIN ]]; then
			VERSION[scafo-edge]=$EDGE_VERSION
			write_edge_routes
		else
			SKIP[scafo-edge]=$EDGE_NOTE
		fi
	fi
	if [[ -n $BASELINE ]]; then
		VERSION[$BASELINE]="--baseline-rev $BASELINE_REV"
		write_edge_routes
	fi
	if has "$PROXIES" caddy; then
		if CADDY_BIN=$(go_install "caddy-$CADDY_VERSION" caddy "github.com/caddyserver/caddy/v2/cmd/caddy@$CADDY_VERSION"); then
			VERSION[caddy]=$(go_mod_version "$CADDY_BIN")
			write_caddy_config
			write_caddy_config h3
		else
			SKIP[caddy]="Caddy $CADDY_VERSION did not build from the Go module proxy"
		fi
	fi
	if has "$PROXIES" traefik; then
		if TRAEFIK_BIN=$(traefik_build); then
			VERSION[traefik]=$TRAEFIK_VERSION
			write_traefik_config
		else
			why=$(grep -v '^go: downloading' "$CACHE/traefik-$TRAEFIK_VERSION/failed.log" 2>/dev/null | tail -3 | tr -s ' \t\n' ' ' | cut -c1-200) || true
			SKIP[traefik]="Traefik $TRAEFIK_VERSION did not build: $why; see $CACHE/traefik-$TRAEFIK_VERSION/failed.log"
		fi
	fi
	if has "$PROXIES" nginx; then
		if NGINX_BIN=$(need nginx); then
			VERSION[nginx]=$("$NGINX_BIN" -v 2>&1 | sed 's/.*nginx\///')
			write_nginx_config
			write_nginx_config h2
		else
			SKIP[nginx]="nginx is not installed and could not be"
		fi
	fi
	if has "$PROXIES" haproxy; then
		if HAPROXY_BIN=$(need haproxy); then
			VERSION[haproxy]=$("$HAPROXY_BIN" -v 2>&1 | awk 'NR==1 {print $3}')
			write_haproxy_config
			write_haproxy_config h2
		else
			SKIP[haproxy]="HAProxy is not installed and could not be"
		fi
	fi
fi
for p in "${!SKIP[@]}"; do log "$p: skipped: ${SKIP[$p]}"; done

# start_proxy NAME TLS [H2 [H3]]: starts NAME (TLS=1: with its HTTPS
# listener; H2=1: offering h2 on it; H3=1: serving HTTP/3 on its UDP side)
# and sets PID. scafo-edge, Caddy and Traefik offer h2 on TLS in every cell;
# nginx and HAProxy only in the h2 cells. scafo-edge's --http3 is on by
# default; the h3 cells name it, Caddy gets h3 only in them.
start_proxy() {
	local name=$1 tls=$2 h2=${3:-0} h3=${4:-0} logf=$WORK/$1.log state
	case $name in
	scafo-edge | scafo-edge@*)
		# The --baseline-rev row: the same command, another build.
		local bin=$EDGE_BIN
		[[ $name == scafo-edge ]] || bin=$BASELINE_BIN
		state=$(mktemp -d "$WORK/edge-state.XXXXXX")
		local mode=(--tls off)
		((tls)) && mode=(--tls internal --https-addr "127.0.0.1:$PX_TLS_PORT")
		((h3)) && mode+=(--http3)
		start "$logf" env GOMAXPROCS="$WORKERS" "$bin" serve --routes-file "$WORK/routes.json" \
			"${mode[@]}" --http-addr "127.0.0.1:$PX_PORT" --admin-addr "127.0.0.1:$ADMIN_PORT" \
			--state-dir "$state" --access-log=false
		;;
	caddy)
		local conf=caddy.json
		((h3)) && conf=caddy-h3.json
		start "$logf" env GOMAXPROCS="$WORKERS" XDG_DATA_HOME="$WORK/caddy-data" \
			XDG_CONFIG_HOME="$WORK/caddy-config" "$CADDY_BIN" run --config "$WORK/$conf"
		;;
	traefik)
		start "$logf" env GOMAXPROCS="$WORKERS" "$TRAEFIK_BIN" \
			--entryPoints.plain.address="127.0.0.1:$PX_PORT" \
			--entryPoints.tls.address="127.0.0.1:$PX_TLS_PORT" \
			--providers.file.filename="$WORK/traefik.yml" --log.level=ERROR \
			--global.checkNewVersion=false --global.sendAnonymousUsage=false
		;;
	nginx)
		local conf=nginx.conf
		((h2)) && conf=nginx-h2.conf
		start "$logf" "$NGINX_BIN" -p "$WORK/nginx" -e "$WORK/nginx/error.log" -c "$WORK/nginx/$conf"
		;;
	haproxy)
		local conf=haproxy.cfg
		((h2)) && conf=haproxy-h2.cfg
		start "$logf" "$HAPROXY_BIN" -db -f "$WORK/$conf"
		;;
	esac
	return 0
}

# ---------------------------------------------------------------- one cell

# cell_spec CELL sets SCHEME, PATH_, SIZE, CLOSE, and for the h2 cells
# (h2load over TLS) H2=1 with H2_CLIENTS connections of H2_STREAMS
# concurrent streams each; for the h3 cells (bench/h3load over QUIC) H3=1,
# with H2_CLIENTS and H2_STREAMS as h3load's -c and -m.
cell_spec() {
	H2=0 H3=0 H2_CLIENTS='' H2_STREAMS=''
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
	*) die "unknown cell $1 (want http-1k, http-1m, https-1k, https-close, h2-1k, h2-1k-1s, h2-1m or h3-1k)" ;;
	esac
}

# to_ms VALUE: wrk's latency ("812.00us", "1.20ms", "2.01s") in ms.
to_ms() {
	awk -v v="$1" 'BEGIN {
		n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
		if (u == "us") n /= 1000; else if (u == "s") n *= 1000; else if (u == "m") n *= 60000
		printf "%.3f", n }'
}

RESULTS=$WORK/results.tsv
: >"$RESULTS"
# row PROXY CELL STATUS RPS P50 P99 CPU_US PEAK_MIB IDLE_MIB ERRORS CTXSW RWSYS UP_CPU_US REQUESTS NOTE
# (ROUND is appended as a 16th column.)
ROUND=1
row() { local IFS=$'\t'; printf '%s\n' "$*	$ROUND" >>"$RESULTS"; }

run_cell() {
	local proxy=$1 cell=$2 url pid pids up_pids wrkout
	cell_spec "$cell"
	local tls=0
	[[ $SCHEME == https ]] && tls=1
	if [[ -n ${SKIP[$proxy]:-} ]]; then
		row "$proxy" "$cell" skipped "" "" "" "" "" "" "" "" "" "" "" "${SKIP[$proxy]}"
		return
	fi
	if ((H2)) && [[ $proxy == direct ]]; then
		# No ceiling to invent: the origin speaks HTTP/1.1 only, so the h2
		# cells have no direct row, and no "× direct".
		row "$proxy" "$cell" n/a "" "" "" "" "" "" "" "" "" "" "" "no h2 row: the upstream speaks HTTP/1.1 only, so the h2 cells have no ceiling and no × direct"
		return
	fi
	if ((H3)); then
		# Only scafo-edge and Caddy serve HTTP/3 here (both on quic-go);
		# the other rows stay in the table and say why they are empty.
		case $proxy in
		direct)
			row "$proxy" "$cell" n/a "" "" "" "" "" "" "" "" "" "" "" "no h3 row: the upstream speaks HTTP/1.1 over TCP only, so the h3 cells have no ceiling and no × direct"
			return ;;
		nginx)
			row "$proxy" "$cell" "no HTTP/3 in this build" "" "" "" "" "" "" "" "" "" "" "" "Debian's nginx ${VERSION[nginx]:-} has no http_v3_module"
			return ;;
		haproxy)
			row "$proxy" "$cell" "no HTTP/3 in this build" "" "" "" "" "" "" "" "" "" "" "" "Debian's HAProxy ${VERSION[haproxy]:-} is built without QUIC (-QUIC)"
			return ;;
		traefik)
			# Not "no HTTP/3 in this build": Traefik v3 has it (quic-go,
			# --entryPoints.<name>.http3), but this bench does not turn it on.
			row "$proxy" "$cell" "HTTP/3 not enabled here" "" "" "" "" "" "" "" "" "" "" "" "this build has HTTP/3 (--entryPoints.<name>.http3), but the bench does not turn it on yet"
			return ;;
		esac
	fi
	log "$proxy $cell"
	if [[ $proxy == direct ]]; then
		pid=$UP_PID
		if ((tls)); then url=https://$HOST:$UP_TLS_PORT$PATH_; else url=http://$HOST:$UP_PORT$PATH_; fi
	else
		start_proxy "$proxy" "$tls" "$H2" "$H3"
		pid=$PID
		if ((tls)); then url=https://$HOST:$PX_TLS_PORT$PATH_; else url=http://$HOST:$PX_PORT$PATH_; fi
	fi
	if ! wait_ok "$url" "$SIZE" "$pid"; then
		local why
		why=$(grep -v '^\s*$' "$WORK/$proxy.log" 2>/dev/null | tail -1 | tr '\t"\\' '   ' | cut -c1-200)
		if [[ $proxy == scafo-edge* ]] && ((tls)); then
			why="--tls internal not available yet: $why"
		fi
		log "$proxy $cell: not serving: $why"
		row "$proxy" "$cell" failed "" "" "" "" "" "" "" "" "" "" "" "$why"
		[[ $proxy != direct ]] && stop_tree "$pid"
		return
	fi
	# h3load: -insecure, as curl -k and wrk (scafo-edge's certificate comes
	# from its internal CA). wait_ok asked over TCP; wait for the UDP side too.
	local h3args=(-c "$H2_CLIENTS" -m "$H2_STREAMS" -insecure -timeout 10s -json)
	if ((H3)); then
		local h3ok=0 i
		for ((i = 0; i < 50; i++)); do
			if "$H3LOAD" -url "$url" -c 1 -m 1 -d 200ms -insecure -timeout 2s -json 2>/dev/null |
				tail -1 | grep -q '"requests":[1-9].*"errors":0,"non2xx":0'; then
				h3ok=1; break
			fi
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.2
		done
		if ((!h3ok)); then
			local why
			why=$("$H3LOAD" -url "$url" -c 1 -m 1 -d 1s -insecure -timeout 2s 2>&1 | grep -v '^\s*$' | tail -1 | tr '\t"\\' '   ' | cut -c1-200)
			log "$proxy $cell: no HTTP/3 answer: $why"
			row "$proxy" "$cell" failed "" "" "" "" "" "" "" "" "" "" "" "no HTTP/3 answer on UDP $PX_TLS_PORT: $why"
			stop_tree "$pid"
			return
		fi
	fi
	pids=$(proc_tree "$pid")
	local idle_kib
	idle_kib=$(status_kib VmRSS $pids)

	local wrkargs=(-t "$THREADS" -c "$CONNS" --latency --timeout 10s)
	((CLOSE)) && wrkargs+=(-H 'Connection: close')
	# h2load: h2 only (no http/1.1 fallback, so a proxy that does not
	# offer h2 fails the cell rather than measuring HTTP/1.1). Its own
	# --warm-up-time would fall inside the CPU window, so the warm-up is a
	# run of its own, as with wrk. --log-file: per-request times, for the
	# percentiles h2load does not print.
	local h2args=(-t "$THREADS" -c "$H2_CLIENTS" -m "$H2_STREAMS" --npn-list=h2)
	if [[ $WARMUP != 0 && $WARMUP != 0s ]]; then
		if ((H2)); then
			"$H2LOAD" "${h2args[@]}" -D "$WARMUP" "$url" >/dev/null 2>&1 || true
		elif ((H3)); then
			# A run of its own, as for h2load: h3load's -warmup would fall
			# inside the CPU window.
			"$H3LOAD" -url "$url" "${h3args[@]}" -d "$WARMUP" >/dev/null 2>&1 || true
		else
			"$WRK" "${wrkargs[@]}" -d "$WARMUP" "$url" >/dev/null 2>&1 || true
		fi
	fi

	local stats0=
	[[ $proxy == direct && $cell == https-close ]] && stats0=$("$CURL" -sk "https://127.0.0.1:$UP_TLS_PORT/stats")
	pids=$(proc_tree "$pid")      # nginx/haproxy may have forked late
	up_pids=$(proc_tree "$UP_PID")
	local c0 u0 s0 r0
	c0=$(cpu_ticks $pids); u0=$(cpu_ticks $up_pids)
	s0=$(ctx_switches $pids); r0=$(rw_syscalls $pids)
	wrkout=$WORK/wrk-$proxy-$cell.txt
	if ((H2)); then
		wrkout=$WORK/h2load-$proxy-$cell.txt
		"$H2LOAD" "${h2args[@]}" -D "$DURATION" --log-file="$WORK/h2load-$proxy-$cell.log" "$url" >"$wrkout" 2>&1 || true
	elif ((H3)); then
		wrkout=$WORK/h3load-$proxy-$cell.txt
		"$H3LOAD" -url "$url" "${h3args[@]}" -d "$DURATION" >"$wrkout" 2>&1 || true
	else
		"$WRK" "${wrkargs[@]}" -d "$DURATION" "$url" >"$wrkout" 2>&1 || true
	fi
	if ((!H2 && !H3)) && grep -q '^ *0 requests in' "$wrkout"; then
		# wrk 4.1 now and then stalls every connection of a TLS
		# Connection: close run; a second run has always gone through.
		log "$proxy $cell: wrk measured no request; running it once more"
		c0=$(cpu_ticks $pids); u0=$(cpu_ticks $up_pids)
		s0=$(ctx_switches $pids); r0=$(rw_syscalls $pids)
		"$WRK" "${wrkargs[@]}" -d "$DURATION" "$url" >"$wrkout" 2>&1 || true
	fi
	local c1 u1 s1 r1 peak_kib
	c1=$(cpu_ticks $pids); u1=$(cpu_ticks $up_pids)
	s1=$(ctx_switches $pids); r1=$(rw_syscalls $pids)
	peak_kib=$(status_kib VmHWM $pids)
	[[ $proxy != direct ]] && stop_tree "$pid"

	local note=''
	if [[ -n $stats0 ]]; then
		# wrk keeps each connection's TLS session, so its new connections
		# resume: say how many did (the other servers issue tickets too).
		note=$(printf '%s\n%s\n' "$stats0" "$("$CURL" -sk "https://127.0.0.1:$UP_TLS_PORT/stats")" | awk -F'[:,}]' '
			NR == 1 { t0 = $2; r0 = $4 } NR == 2 { t = $2 - t0; r = $4 - r0 }
			END { if (t > 0) printf "%.0f%% of the new TLS connections resumed a session (so the handshakes measured are mostly resumptions)", 100 * r / t }')
	fi
	local rps reqs p50 p99 errors
	if ((H2)); then
		# "finished in 3.00s, 15000.00 req/s, ..." and "requests: N total,
		# N started, N done, N succeeded, N failed, N errored, N timeout":
		# failed counts the errored (connection-level) ones and non-2xx/3xx.
		# Latencies: the 3rd column of the log, µs from a request's start to
		# the end of its response, sorted, read at 50% and 99%.
		read -r rps reqs errors < <(awk '
			/^finished in/ { rps = $4 }
			/^requests:/ { for (i = 2; i < NF; i++) { if ($(i + 1) ~ /^done/) done = $i; if ($(i + 1) ~ /^failed/) failed = $i } }
			END { printf "%s %s %d\n", rps ? rps : "0", done ? done : "0", failed }' "$wrkout")
		read -r p50 p99 < <(cut -f3 "$WORK/h2load-$proxy-$cell.log" 2>/dev/null | sort -n | awk '
			{ t[NR] = $1 }
			END { if (NR) printf "%.3f %.3f\n", t[int((NR - 1) * 0.50) + 1] / 1000, t[int((NR - 1) * 0.99) + 1] / 1000; else print "- -" }')
		rm -f "$WORK/h2load-$proxy-$cell.log"
		if ((reqs == 0)); then
			row "$proxy" "$cell" failed "" "" "" "" "" "" "" "" "" "" "" "h2load measured no request: $(grep -v '^\s*$' "$wrkout" | grep -iv '^progress' | tail -1 | tr '\t"\\' '   ' | cut -c1-200)"
			return
		fi
	elif ((H3)); then
		# h3load -json: its last line is one JSON object (requests, errors,
		# non2xx, rps, p50_ms, p99_ms, ...). "requests" counts complete
		# responses whatever their status; errors = errors + non2xx. Its
		# latencies are already in ms (to_ms leaves a bare number alone).
		read -r rps reqs p50 p99 errors < <(tail -1 "$wrkout" | awk '
			function field(k,   m) { if (match($0, "\"" k "\":[-0-9.eE+]+")) { m = substr($0, RSTART + length(k) + 3, RLENGTH - length(k) - 3); return m } return "" }
			/^\{/ { rps = field("rps"); reqs = field("requests"); p50 = field("p50_ms"); p99 = field("p99_ms"); err = field("errors") + field("non2xx") }
			END { printf "%s %s %s %s %d\n", rps != "" ? rps : "0", reqs != "" ? reqs : "0", p50 != "" ? p50 : "-", p99 != "" ? p99 : "-", err }')
		if ((reqs == 0)); then
			row "$proxy" "$cell" failed "" "" "" "" "" "" "" "" "" "" "" "h3load measured no request: $(grep -v '^\s*$' "$wrkout" | tail -1 | tr '\t"\\' '   ' | cut -c1-200)"
			return
		fi
	else
	read -r rps reqs p50 p99 errors < <(awk '
		/Requests\/sec:/ { rps = $2 }
		/ requests in / { reqs = $1 }
		$1 == "50%" { p50 = $2 }
		$1 == "99%" { p99 = $2 }
		/Non-2xx or 3xx responses:/ { err += $NF }
		/Socket errors:/ { gsub(/,/, ""); err += $4 + $6 + $8 + $10 }
		END { printf "%s %s %s %s %d\n", rps ? rps : "0", reqs ? reqs : "0", p50 ? p50 : "-", p99 ? p99 : "-", err }' "$wrkout")
	if ((reqs == 0)); then
		row "$proxy" "$cell" failed "" "" "" "" "" "" "" "" "" "" "" "wrk measured no request: $(tail -1 "$wrkout" | tr '\t"\\' '   ')"
		return
	fi
	fi
	awk -v proxy="$proxy" -v cell="$cell" -v rps="$rps" -v reqs="$reqs" \
		-v p50="$(to_ms "$p50")" -v p99="$(to_ms "$p99")" -v tck="$CLK_TCK" \
		-v c="$((c1 - c0))" -v u="$((u1 - u0))" -v s="$((s1 - s0))" -v r="$((r1 - r0))" \
		-v peak="$peak_kib" -v idle="$idle_kib" -v err="$errors" -v note="$note" -v round="$ROUND" -v direct="$([[ $proxy == direct ]] && echo 1 || echo 0)" '
		BEGIN {
			OFS = "\t"
			cpu = direct ? "" : sprintf("%.1f", c * 1e6 / tck / reqs)
			ctx = direct ? "" : sprintf("%.2f", s / reqs)
			rw = direct ? "" : sprintf("%.2f", r / reqs)
			pk = direct ? "" : sprintf("%.1f", peak / 1024)
			id = direct ? "" : sprintf("%.1f", idle / 1024)
			print proxy, cell, "ok", rps, p50, p99, cpu, pk, id, err, ctx, rw, sprintf("%.1f", u * 1e6 / tck / reqs), reqs, note, round
		}' >>"$RESULTS"
}

# ------------------------------------------------------------------ report

# aggregate: one line per proxy and cell from every round's rows: medians of
# the rates, latencies and per-request costs, the largest peak RSS, errors
# and requests summed, and "× direct" as the median of each round's ratio to
# the direct row of the same round (so a slow patch of the machine, which
# hits both, cancels out). Columns: proxy cell status rps p50 p99 cpu peak
# idle errors ctx rw upstream-cpu requests note ratio rounds-ok.
aggregate() {
	awk -F'\t' -v OFS='\t' '
		function median(list,   n, a, i, j, t) {
			n = split(list, a, " ")
			if (n == 0) return ""
			for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		function add(k, f, v) { if (v != "") L[k, f] = L[k, f] (L[k, f] == "" ? "" : " ") v }
		{
			k = $1 SUBSEP $2
			if (!(k in st)) { order[++n] = k; st[k] = $3; note[k] = $15 }
			if ($3 != "ok") next
			if (st[k] != "ok") note[k] = ""
			st[k] = "ok"; ok[k]++
			if ($15 != "") note[k] = $15
			for (f = 4; f <= 13; f++) if (f != 8 && f != 10) add(k, f, $f)
			if ($8 != "" && (!(k in peak) || $8 + 0 > peak[k] + 0)) peak[k] = $8
			err[k] += $10; reqs[k] += $14
			nr++; rk[nr] = k; rround[nr] = $16; rrps[nr] = $4
			if ($1 == "direct") D[$16, $2] = $4
		}
		END {
			for (i = 1; i <= nr; i++) {
				split(rk[i], pc, SUBSEP)
				if (((rround[i], pc[2]) in D) && D[rround[i], pc[2]] > 0) add(rk[i], "ratio", rrps[i] / D[rround[i], pc[2]])
			}
			for (i = 1; i <= n; i++) {
				k = order[i]; split(k, pc, SUBSEP)
				if (st[k] != "ok") { print pc[1], pc[2], st[k], "", "", "", "", "", "", "", "", "", "", "", note[k], "", 0; continue }
				print pc[1], pc[2], "ok", median(L[k, 4]), median(L[k, 5]), median(L[k, 6]), median(L[k, 7]), peak[k], median(L[k, 9]),
					err[k], median(L[k, 11]), median(L[k, 12]), median(L[k, 13]), reqs[k], note[k], median(L[k, "ratio"]), ok[k]
			}
		}' "$RESULTS"
}

report_markdown() {
	local agg=$WORK/aggregate.tsv
	aggregate >"$agg"
	printf '## scafo-edge benchmark, %s\n\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
	printf '%s CPUs shared by wrk, proxy and upstream; wrk %s: %s threads, %s connections, %s per cell after %s warm-up%s; workers %s (GOMAXPROCS = nginx workers = HAProxy threads).\n' \
		"$(nproc)" "${VERSION[wrk]:-?}" "$THREADS" "$CONNS" "$DURATION" "$WARMUP" \
		"$( ((ROUNDS > 1)) && echo "; medians of $ROUNDS rounds")" "$WORKERS"
	if [[ -n $H2LOAD ]]; then
		printf 'h2 cells: h2load %s, %s threads, h2 only (ALPN), connections × streams as each cell says, same duration and warm-up; p50/p99 from its per-request log; errors are its failed requests.\n' \
			"${VERSION[h2load]:-?}" "$THREADS"
	fi
	if [[ -n $H3LOAD ]]; then
		printf 'h3 cells: bench/h3load (%s), QUIC connections × streams as the cell says, same duration and a separate warm-up run; p50/p99 from its histogram; errors are its errors plus non-2xx responses.\n' \
			"${VERSION[h3load]:-?}"
	fi
	local v='' p
	for p in scafo-edge $BASELINE caddy traefik nginx haproxy; do
		[[ -n ${VERSION[$p]:-} ]] && v+="${v:+, }$p ${VERSION[$p]}"
	done
	printf 'Versions: %s. Ratios within this run are what count; absolute figures move with the machine'"'"'s other load.\n\n' "${v:-none}"
	awk -F'\t' '
		function cellname(c) { return c == "http-1k" ? "HTTP keep-alive 1 KiB" : c == "http-1m" ? "HTTP keep-alive 1 MiB" : c == "https-1k" ? "HTTPS keep-alive 1 KiB" : c == "https-close" ? "HTTPS new connection per request 1 KiB" : c == "h2-1k" ? "h2 (TLS) 1 KiB, 16 conns × 16 streams" : c == "h2-1k-1s" ? "h2 (TLS) 1 KiB, 64 conns × 1 stream" : c == "h2-1m" ? "h2 (TLS) 1 MiB, 16 conns × 4 streams" : c == "h3-1k" ? "HTTP/3 1 KiB, 16 conns × 16 streams" : c }
		function orDash(v, fmt) { return v == "" ? "—" : sprintf(fmt, v) }
		BEGIN {
			print "| cell | proxy | req/s | × direct | p50 ms | p99 ms | CPU µs/req | ctx switches/req | peak RSS MiB | idle RSS MiB | errors |"
			print "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
		}
		{
			if ($15 != "") notes[++nn] = $1 ": " ($3 == "ok" ? "" : $3 ": ") $15
			if ($3 == "n/a") { printf "| %s | %s | — | — | — | — | — | — | — | — | — |\n", cellname($2), $1; next }
			if ($3 != "ok") { printf "| %s | %s | %s | | | | | | | | |\n", cellname($2), $1, $3; next }
			printf "| %s | %s | %.0f | %s | %.2f | %.2f | %s | %s | %s | %s | %s |\n", cellname($2), $1, $4, orDash($16, "%.2f"),
				$5, $6, orDash($7, "%.1f"), orDash($11, "%.2f"), orDash($8, "%.1f"), orDash($9, "%.1f"), $10
		}
		END { if (nn) { print ""; for (j = 1; j <= nn; j++) { if (!(notes[j] in said)) print "- " notes[j]; said[notes[j]] = 1 } } }' "$agg"
	targets_markdown "$agg"
}

# targets_markdown AGGREGATE: scafo-edge (and the --baseline-rev row, the
# same way) against Caddy and nginx, per cell (issue 8's targets: req/s >=
# 1.5x Caddy, CPU/req <= 0.6x Caddy, p99 <= Caddy; stretch: CPU/req <= 2x
# nginx).
targets_markdown() {
	awk -F'\t' -v edges="scafo-edge $BASELINE" '
		$3 == "ok" { R[$1, $2] = $4; P99[$1, $2] = $6; CPU[$1, $2] = $7; if (!($2 in seen)) { seen[$2] = 1; cells[++nc] = $2 } }
		function verdict(ok) { return ok ? "met" : "not met" }
		END {
			ne = split(edges, E, " ")
			for (k = 1; k <= nc; k++) for (m = 1; m <= ne; m++) {
				c = cells[k]; e = E[m]
				if (!((e, c) in R)) continue
				if ((("caddy", c) in R)) {
					line = sprintf("| %s | %s | %.2f (%s) | %.2f (%s) | %.2f (%s) |", c, e,
						R[e, c] / R["caddy", c], verdict(R[e, c] >= 1.5 * R["caddy", c]),
						CPU[e, c] / CPU["caddy", c], verdict(CPU[e, c] <= 0.6 * CPU["caddy", c]),
						P99[e, c] / P99["caddy", c], verdict(P99[e, c] <= P99["caddy", c]))
				} else line = sprintf("| %s | %s | — | — | — |", c, e)
				if ((("nginx", c) in CPU) && CPU["nginx", c] > 0)
					line = line sprintf(" %.2f (%s) |", CPU[e, c] / CPU["nginx", c], verdict(CPU[e, c] <= 2 * CPU["nginx", c]))
				else line = line " — |"
				rows[++nr] = line
			}
			if (!nr) exit
			print ""
			print "scafo-edge against the targets of issue 8 (ratios of this run):"
			print ""
			print "| cell | proxy | req/s × Caddy (≥ 1.5) | CPU/req × Caddy (≤ 0.6) | p99 × Caddy (≤ 1) | CPU/req × nginx (stretch ≤ 2) |"
			print "|---|---|--:|--:|--:|--:|"
			for (i = 1; i <= nr; i++) print rows[i]
		}' "$1"
}

report_json() {
	local versions='' p agg=$WORK/aggregate.tsv
	aggregate >"$agg"
	for p in "${!VERSION[@]}"; do
		versions+="${versions:+, }\"$p\": \"${VERSION[$p]//\"/}\""
	done
	printf '{\n  "date": "%s",\n  "cpus": %s,\n  "settings": {"duration": "%s", "warmup": "%s", "rounds": %s, "connections": %s, "wrk_threads": %s, "workers": %s},\n  "versions": {%s},\n  "results": [\n' \
		"$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "$(nproc)" "$DURATION" "$WARMUP" "$ROUNDS" "$CONNS" "$THREADS" "$WORKERS" "$versions"
	awk -F'\t' '
		function num(v) { return v == "" ? "null" : v + 0 }
		{ n++; L[n] = $0 }
		END {
			for (i = 1; i <= n; i++) {
				split(L[i], f, "\t")
				gsub(/["\\]/, "", f[15])
				printf "    {\"proxy\": \"%s\", \"cell\": \"%s\", \"status\": \"%s\", \"rounds\": %d, \"requests\": %s, \"requests_per_sec\": %s, \"ratio_to_direct\": %s, \"p50_ms\": %s, \"p99_ms\": %s, \"cpu_us_per_request\": %s, \"context_switches_per_request\": %s, \"rw_syscalls_per_request\": %s, \"peak_rss_mib\": %s, \"idle_rss_mib\": %s, \"errors\": %s, \"upstream_cpu_us_per_request\": %s, \"note\": \"%s\"}%s\n",
					f[1], f[2], f[3], f[17], num(f[14]), num(f[4]), num(f[16]), num(f[5]), num(f[6]), num(f[7]), num(f[11]), num(f[12]), num(f[8]), num(f[9]), num(f[10]), num(f[13]), f[15], i < n ? "," : ""
			}
		}' "$agg"
	printf '  ]\n}\n'
}

# ----------------------------------------------------------------- profile

# profile: the edge's request path (bench/edgeprof: edge.Handler and
# backhaul.Proxy wired as the serve command wires them) under the http-1k
# load, with a CPU profile, an allocation profile of the window, and the
# per-request figures /proc gives.
profile() {
	mkdir -p "$PROFILE_DIR"
	[[ -n $EDGE_BIN ]] || die "bench/edgeprof: $EDGE_NOTE"
	write_edge_routes
	start "$WORK/edgeprof.log" env GOMAXPROCS="$WORKERS" "$EDGE_BIN" \
		-addr "127.0.0.1:$PX_PORT" -pprof-addr "127.0.0.1:$ADMIN_PORT" -routes-file "$WORK/routes.json"
	local pid=$PID url=http://$HOST:$PX_PORT/1k pp=http://127.0.0.1:$ADMIN_PORT/debug/pprof
	wait_ok "$url" 1024 "$pid" || die "edgeprof did not start: $(tail -3 "$WORK/edgeprof.log")"
	local secs=${DURATION%s}
	[[ $secs =~ ^[0-9]+$ ]] || die "--profile needs --duration in whole seconds (e.g. 10s)"
	local wrkargs=(-t "$THREADS" -c "$CONNS" --latency --timeout 10s)
	"$WRK" "${wrkargs[@]}" -d "$WARMUP" "$url" >/dev/null 2>&1 || true

	# Window 1: CPU profile, with the /proc figures over the same window.
	log "profiling: CPU for ${secs}s under http-1k load"
	"$CURL" -s -o "$PROFILE_DIR/allocs-before.pprof" "$pp/allocs"
	local c0 s0 r0
	c0=$(cpu_ticks "$pid"); s0=$(ctx_switches "$pid"); r0=$(rw_syscalls "$pid")
	"$CURL" -s -o "$PROFILE_DIR/cpu.pprof" "$pp/profile?seconds=$secs" &
	local curl_pid=$!
	"$WRK" "${wrkargs[@]}" -d "${secs}s" "$url" >"$PROFILE_DIR/wrk.txt" 2>&1 || true
	wait "$curl_pid" || true
	local c1 s1 r1
	c1=$(cpu_ticks "$pid"); s1=$(ctx_switches "$pid"); r1=$(rw_syscalls "$pid")
	"$CURL" -s -o "$PROFILE_DIR/allocs-after.pprof" "$pp/allocs"
	local reqs
	reqs=$(awk '/ requests in / { print $1 }' "$PROFILE_DIR/wrk.txt")
	((reqs > 0)) || die "profile: wrk measured no request: $(cat "$PROFILE_DIR/wrk.txt")"

	{
		printf '## edge request path (%s) under http-1k load (%s connections, %s)\n\n' "$EDGE_VERSION" "$CONNS" "$DURATION"
		grep -E 'Requests/sec|requests in' "$PROFILE_DIR/wrk.txt" | sed 's/^ */    /'
		awk -v c="$((c1 - c0))" -v s="$((s1 - s0))" -v r="$((r1 - r0))" -v n="$reqs" -v tck="$CLK_TCK" 'BEGIN {
			printf "    CPU %.1f µs/request; %.2f context switches/request; %.2f read+write syscalls/request\n\n", c * 1e6 / tck / n, s / n, r / n }'
		printf '### CPU (go tool pprof -top -nodecount=40 %s/cpu.pprof)\n\n```\n' "$PROFILE_DIR"
		go tool pprof -top -nodecount=40 "$EDGE_BIN" "$PROFILE_DIR/cpu.pprof" 2>/dev/null
		printf '```\n\n### CPU, cumulative (-top -cum -nodecount=40)\n\n```\n'
		go tool pprof -top -cum -nodecount=40 "$EDGE_BIN" "$PROFILE_DIR/cpu.pprof" 2>/dev/null
		printf '```\n\n### Allocations in the window (alloc_objects, -base allocs-before)\n\n'
		local objs bytes
		objs=$(go tool pprof -top -nodecount=1 -sample_index=alloc_objects -base "$PROFILE_DIR/allocs-before.pprof" \
			"$EDGE_BIN" "$PROFILE_DIR/allocs-after.pprof" 2>/dev/null | awk '/ total$/ { print $(NF-1) }')
		bytes=$(go tool pprof -top -nodecount=1 -unit=B -sample_index=alloc_space -base "$PROFILE_DIR/allocs-before.pprof" \
			"$EDGE_BIN" "$PROFILE_DIR/allocs-after.pprof" 2>/dev/null | awk '/ total$/ { print $(NF-1) + 0 }')
		awk -v o="${objs:-0}" -v b="${bytes:-0}" -v n="$reqs" 'BEGIN {
			printf "About %.0f objects and %.0f bytes allocated per request (the heap profile is sampled and ends at the last GC).\n\n", o / n, b / n }'
		printf '```\n'
		go tool pprof -top -nodecount=30 -sample_index=alloc_objects -base "$PROFILE_DIR/allocs-before.pprof" \
			"$EDGE_BIN" "$PROFILE_DIR/allocs-after.pprof" 2>/dev/null
		printf '```\n'
	} | tee "$PROFILE_DIR/summary.md"
	stop_tree "$pid"
}

if [[ -n $PROFILE_DIR ]]; then
	profile
	exit 0
fi

# ------------------------------------------------------------------- main

IFS=, read -r -a cell_list <<<"$CELLS"
for cell in "${cell_list[@]}"; do cell_spec "$cell"; done
proxy_list=(direct)
for p in scafo-edge caddy traefik nginx haproxy; do
	has "$PROXIES" "$p" && proxy_list+=("$p")
	# The baseline right after the edge, in every round: same conditions.
	if [[ $p == scafo-edge && -n $BASELINE ]]; then proxy_list+=("$BASELINE"); fi
done
for p in ${PROXIES//,/ }; do
	case $p in direct | scafo-edge | caddy | traefik | nginx | haproxy) ;; *) die "unknown proxy $p" ;; esac
done

for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
	((ROUNDS > 1)) && log "round $ROUND of $ROUNDS"
	for cell in "${cell_list[@]}"; do
		for proxy in "${proxy_list[@]}"; do
			run_cell "$proxy" "$cell"
		done
	done
done

if ((JSON)); then report_json; else report_markdown; fi
if [[ -n $JSON_FILE ]]; then report_json >"$JSON_FILE"; fi
