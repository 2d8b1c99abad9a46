# shellcheck shell=bash
# bench/lib.sh: the shell bench/run.sh and bench/overload.sh share, sourced
# by both (not run on its own): logging, starting and stopping processes,
# installing Debian packages, building and caching Caddy and Traefik, and
# building scafo-edge from the working tree or a commit. Both scripts
# install and build into the same cache, so a run of either reuses what the
# other built.
#
# What it reads from the script that sources it:
#   BENCH_NAME     the script's name, for log lines ("run.sh")
#   REPO           this checkout
#   WORK           the work directory (work_dir makes it)
#   KEEP           1: keep WORK on exit (--keep)
#   CACHE          where built binaries live (--cache)
#   INSTALL        0: install and build nothing (--no-install)
#   RETRY_BUILDS   1: try again a build that failed before (--retry-builds)
#   PROC_TOOL      once built, a bench helper with a "tree PID" subcommand
#                  (bench/benchtab, bench/overload)
#   EDGE_PKG, EDGE_OUT, EDGE_REV, EDGE_BIN_FLAG   for edge_build

CADDY_VERSION=v2.11.9
TRAEFIK_MODULE=github.com/traefik/traefik/v3
TRAEFIK_VERSION=v3.7.9

log() { printf '%s\n' "$BENCH_NAME: $*" >&2; }
die() { log "$*"; exit 1; }

has() { [[ ,$1, == *,$2,* ]]; }

# ------------------------------------------------------- processes, cleanup

# work_dir PREFIX: WORK, a new directory ${TMPDIR:-/tmp}/PREFIX.XXXXXX,
# removed on exit (unless --keep), when every process started by start is
# stopped, Ctrl-C included.
work_dir() {
	WORK=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
	chmod 755 "$WORK" # nginx workers may run as another user
	STARTED=()         # every pid this script started
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}

cleanup() {
	local p
	for p in "${STARTED[@]}"; do stop_tree "$p"; done
	if ((KEEP)); then log "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}

# start LOG CMD... runs CMD in the background; its pid is in $PID.
start() {
	local logf=$1; shift
	"$@" >"$logf" 2>&1 &
	PID=$!
	STARTED+=("$PID")
}

# proc_tree PID prints PID and all its descendants (PROC_TOOL reads /proc;
# before it is built, PID alone).
proc_tree() {
	if [[ -x ${PROC_TOOL:-} ]]; then "$PROC_TOOL" tree "$1"; else echo "$1"; fi
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

# check_ports PORT...: dies if any of them is in use on 127.0.0.1.
check_ports() {
	local p
	for p in "$@"; do
		if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			die "port $p is in use on 127.0.0.1; pick other ports with --port-base"
		fi
	done
}

# make_cert CN SAN: a self-signed ECDSA P-256 certificate (what the edge's
# internal CA issues too, so no handshake pays for a bigger key) for CN with
# subjectAltName SAN, in WORK/cert.pem and WORK/key.pem.
make_cert() {
	"$OPENSSL" req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
		-subj "/CN=$1" -addext "subjectAltName=$2" \
		-keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null || die "openssl could not make a certificate"
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

# caddy_build: Caddy CADDY_VERSION built into CACHE/caddy-VERSION/bin by go
# install, once.
caddy_build() {
	go_install "caddy-$CADDY_VERSION" caddy "github.com/caddyserver/caddy/v2/cmd/caddy@$CADDY_VERSION"
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

# proxy_bin NAME: the binary of NAME (scafo-edge, as edge_build left it;
# caddy and traefik, built once; nginx and haproxy, from Debian) in
# EDGE_BIN, CADDY_BIN, TRAEFIK_BIN, NGINX_BIN or HAPROXY_BIN, and its
# version in VERSION[NAME]; when there is none, SKIP[NAME] says why and it
# returns 1. VERSION and SKIP are the script's associative arrays.
# shellcheck disable=SC2034 # what it sets is read by the sourcing script
proxy_bin() {
	local why
	case $1 in
	scafo-edge)
		if [[ -n $EDGE_BIN ]]; then VERSION[$1]=$EDGE_VERSION; return 0; fi
		SKIP[$1]=$EDGE_NOTE
		;;
	caddy)
		if CADDY_BIN=$(caddy_build); then VERSION[$1]=$(go_mod_version "$CADDY_BIN"); return 0; fi
		SKIP[$1]="Caddy $CADDY_VERSION did not build from the Go module proxy"
		;;
	traefik)
		if TRAEFIK_BIN=$(traefik_build); then VERSION[$1]=$TRAEFIK_VERSION; return 0; fi
		why=$(grep -v '^go: downloading' "$CACHE/traefik-$TRAEFIK_VERSION/failed.log" 2>/dev/null | tail -3 | tr -s ' \t\n' ' ' | cut -c1-200) || true
		SKIP[$1]="Traefik $TRAEFIK_VERSION did not build: $why; see $CACHE/traefik-$TRAEFIK_VERSION/failed.log"
		;;
	nginx)
		if NGINX_BIN=$(need nginx); then VERSION[$1]=$("$NGINX_BIN" -v 2>&1 | sed 's/.*nginx\///'); return 0; fi
		SKIP[$1]="nginx is not installed and could not be"
		;;
	haproxy)
		if HAPROXY_BIN=$(need haproxy); then VERSION[$1]=$("$HAPROXY_BIN" -v 2>&1 | awk 'NR==1 {print $3}'); return 0; fi
		SKIP[$1]="HAProxy is not installed and could not be"
		;;
	*) die "proxy_bin: unknown proxy $1" ;;
	esac
	return 1
}

# ------------------------------------------------------------- scafo-edge

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

# edge_build: scafo-edge, built from the working tree into EDGE_OUT, or from
# --edge-rev, or taken as built from --edge-bin; sets EDGE_BIN and
# EDGE_VERSION (what the table names), or, when nothing builds, EDGE_NOTE
# (why). Other people may be mid-edit in the working tree: when it does not
# build, the newest of the last six commits that builds is measured
# instead, and EDGE_VERSION says which.
edge_build() {
	SRC=$REPO
	EDGE_BIN='' EDGE_NOTE='' EDGE_VERSION=''
	if [[ -n $EDGE_BIN_FLAG ]]; then
		[[ -z $EDGE_REV ]] || die "--edge-bin and --edge-rev exclude each other"
		[[ -x $EDGE_BIN_FLAG ]] || die "--edge-bin $EDGE_BIN_FLAG: not an executable file"
		EDGE_VERSION="--edge-bin $EDGE_BIN_FLAG"
	elif [[ -n $EDGE_REV ]]; then
		export_rev "$EDGE_REV" || die "--edge-rev $EDGE_REV: git archive failed"
		EDGE_VERSION=$(cd "$REPO" && git rev-parse --short "$EDGE_REV")
	else
		EDGE_VERSION="$(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$REPO" && git diff --quiet HEAD -- . 2>/dev/null || echo '+dirty')"
	fi
	local rev
	if [[ -n $EDGE_BIN_FLAG ]]; then
		EDGE_BIN=$EDGE_BIN_FLAG
	elif log "building $EDGE_PKG from ${EDGE_REV:+commit $EDGE_REV of }$REPO" && build_edge; then
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
	return 0
}
