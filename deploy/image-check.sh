#!/usr/bin/env bash
# Build the image from this repository's Dockerfile, unchanged, on a real
# Docker engine for linux/amd64 and linux/arm64; check that each image is
# for its platform, with a static binary for that machine that carries the
# file capability and a state directory 0700 owned by 65532; and run the
# native one to check what the README promises of it: it runs as uid 65532
# with cap_net_bind_service as its only capability, its state volume comes
# up 0700 and owned by 65532, its HEALTHCHECK reaches healthy, it proxies a
# request to a loopback upstream over HTTP and HTTPS, `docker stop` exits
# 0, deploy/upgrade-compose.sh replaces it under load with no request
# refused or failed, and the same script gives up at once on a successor
# that crash-loops, keeping its log. .ci/run calls it; an operator can too:
#
#   sudo deploy/image-check.sh                       # the Dockerfile at the root
#   sudo deploy/image-check.sh --dockerfile OTHER    # another one, same context
#   sudo deploy/image-check.sh --packages-only       # install what it needs, and stop
#   sudo deploy/image-check.sh --upgrades 5          # the upgrade under load 5 times in a row
#
# What it needs, and makes when it is missing (Debian, as root):
#   - Debian's docker.io (dockerd 20.10 with BuildKit, and its docker CLI)
#     and debootstrap, by apt-get. It starts its own dockerd, never the
#     system's: its own data and exec roots and pid file (in the cache),
#     socket, daemon.json (empty) and containerd namespaces, no bridge
#     network and no iptables rules (--bridge=none --iptables=false), so
#     every container and build step uses --network host and the edge
#     serves on 127.0.0.1 (80 and 443, TCP and UDP, and 9180 must be free).
#   - The base images, always made here under their real names and never
#     pulled (whether or not a registry can be reached, so that every
#     machine builds on the same bases): golang:1.26-bookworm is a
#     debootstrapped bookworm with this host's /usr/local/go and CA bundle
#     (the build's `go mod download` and `apt-get` go out through whatever
#     TLS the host trusts); the distroless static-debian12:nonroot is
#     Debian's CA certificates, tzdata and an /etc/passwd and /etc/group
#     with nonroot = 65532, and nothing else.
#   - The buildx and Compose v2 CLI plugins, which Debian 12 does not
#     package: Debian 13 (trixie) does, as binaries that need only libc6
#     2.34 (Debian 12 has 2.36). Their two .debs are fetched with apt from
#     trixie into a private apt state (its own sources, lists and cache:
#     the system's apt is untouched and nothing is installed), which checks
#     their signatures with the archive keyring Debian 12 ships, and
#     unpacked into the cache. (Built from the Go module proxy instead,
#     they were 836 packages to compile on every fresh machine, the largest
#     part of a cold run.) The Dockerfile has no `# syntax=` line, so the
#     engine's own Dockerfile frontend builds it and no frontend image is
#     needed.

# Cache, kept between runs on one machine: ${XDG_CACHE_HOME:-~/.cache}/
# scafo-edge-image-check (SCAFO_EDGE_IMAGE_CHECK_CACHE): the bookworm root
# file system, the plugin binaries, the daemon's data root (base images
# and BuildKit's layer cache, pruned to 3 GB after each passing run), and
# its exec root and pid file, with which a run stops what one that was
# killed left running. Delete it to start cold. The plugins are put in a
# private DOCKER_CONFIG there, so an operator's ~/.docker is untouched.
#
# Cost: the README's "Checking the image" has the numbers, and each run
# ends with a line of its phases' times. Every exit path stops the daemon it
# started and removes what it ran; a failed check exits non-zero with a line
# saying which.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dockerfile=$root/Dockerfile
build_cache=1 packages_only=0 upgrades=1
while [ $# -gt 0 ]; do
	case $1 in
	--dockerfile)
		[ $# -ge 2 ] || { echo "image-check.sh: --dockerfile needs a file (see --help)" >&2; exit 2; }
		dockerfile=$(realpath "$2")
		shift 2
		;;
	--no-build-cache) build_cache=0; shift ;;
	--packages-only) packages_only=1; shift ;;
	--upgrades)
		[[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "image-check.sh: --upgrades needs a count of at least 1 (see --help)" >&2; exit 2; }
		upgrades=$2
		shift 2
		;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "image-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done

# The Debian suite the plugins come from, and the oldest versions the check
# takes from it (upgrade-compose.sh needs Compose's --no-recreate --scale
# and --wait; buildx's docker driver must --load a foreign platform).
PLUGINS_SUITE=trixie
MIN_COMPOSE=2.20 MIN_BUILDX=0.11
GO_IMAGE=golang:1.26-bookworm
DISTROLESS_IMAGE=gcr.io/distroless/static-debian12:nonroot
IMAGE=scafo-edge:image-check
PROJECT=scafo-edge-image-check
# The edge's listeners: privileged ports, so binding them proves the file
# capability, and loopback only, so nothing but this machine reaches them.
HTTP_ADDR=127.0.0.1:80 HTTPS_ADDR=127.0.0.1:443 ADMIN_ADDR=127.0.0.1:9180
# check.localhost may get a certificate (from the internal CA), so HTTP to
# it is redirected to HTTPS; a host under a *.<base> key cannot get one
# (docs/design.md rule 8), so it is proxied over plain HTTP.
HOST=check.localhost HTTP_HOST=plain.http.localhost

cache=${SCAFO_EDGE_IMAGE_CHECK_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/scafo-edge-image-check}
started=$SECONDS
log() { printf '%s image-check: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
fail() {
	log "FAILED: $*"
	exit 1
}
elapsed() { echo "$((SECONDS - ${1:-$started}))s"; }
# mark NAME: the time since the last mark was spent on NAME (or waiting for
# it); every run ends by printing these, so a slower phase shows.
phases=() last_mark=$SECONDS
mark() {
	phases+=("$1 $((SECONDS - last_mark))s")
	last_mark=$SECONDS
}

[ "$(id -u)" = 0 ] || fail "run as root: it installs packages, starts dockerd and debootstraps"
mkdir -p "$cache"
# One run at a time per cache: two daemons on one data root corrupt it.
# Bash cannot open a file close-on-exec, so every child that may outlive
# this script (dockerd and its containerd, the background builds, the
# steps, the upstream and load) is started with 9>&-: one left by a killed
# run would otherwise hold the lock and refuse every later run.
exec 9>"$cache/lock"
flock -n 9 || fail "another image check holds $cache/lock"

run=$(mktemp -d "${TMPDIR:-/tmp}/scafo-edge-image-check.XXXXXX")
# The edge runs as 65532 and reads the routes file from here.
chmod 755 "$run"
# dockerd's exec root is kept in the cache, not in $run: its containerd
# state lets the next daemon find containers that a killed run left
# running (and kill them, as it does on every start without live-restore).
exec_root=$cache/exec
tools=$cache/tools-debian-$PLUGINS_SUITE
rootfs=$cache/bookworm-rootfs
dockerd_pid="" fg_pid="" own_policy=0 bg_pids=() proc_pids=()
export DOCKER_HOST=unix://$run/docker.sock DOCKER_CONFIG=$cache/docker-config DOCKER_BUILDKIT=1

# unmount_under DIR: lazily unmount everything mounted below DIR, deepest
# first: dockerd's default network namespace in its exec root, or the proc
# and sys of a debootstrap that was killed, which rm -rf cannot remove.
unmount_under() {
	awk -v r="${1%/}/" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l
}

# stop_pids SECONDS PID...: TERM each PID, then KILL what still runs after
# SECONDS.
stop_pids() {
	local s=$1 p i alive=()
	shift
	[ $# -gt 0 ] || return 0
	kill -TERM "$@" 2>/dev/null || true
	for ((i = 0; i <= s * 2; i++)); do
		alive=()
		for p; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
		[ ${#alive[@]} -gt 0 ] || return 0
		sleep 0.5
	done
	log "still running after ${s}s, killed: $(ps -o pid=,args= -p "${alive[*]}" 2>/dev/null | cut -c1-100 | paste -sd';' -)"
	kill -KILL "${alive[@]}" 2>/dev/null || true
}

# descendants PID: the pids of PID's children, theirs, and so on.
descendants() {
	local c
	for c in $(ps -o pid= --ppid "$1" 2>/dev/null || true); do
		echo "$c"
		descendants "$c"
	done
}

# step CMD...: run CMD (a long step: a build, a stop, an upgrade) in the
# background and wait for it. Bash runs a trapped TERM or INT only once the
# foreground command has ended, and a docker build can take minutes; a
# signal does interrupt `wait`, so cleanup runs at once and stops CMD and
# everything it started (fg_pid).
step() {
	local rc=0
	"$@" 9>&- &
	fg_pid=$!
	wait "$fg_pid" || rc=$?
	fg_pid=""
	return "$rc"
}

# cleanup runs on every exit: the step in progress, the background builds
# (each in its own process group, so their compilers go too), the upstream
# and load, every container and volume of the private daemon (nothing else
# uses it), the daemon, whose managed containerd stops with it, and any
# mount left under the directories this run used. Every wait is bounded.
cleanup() {
	local rc=$? p tree=()
	set +e
	trap - EXIT INT TERM
	# A trap can run inside a redirected step (docker build >build.log):
	# back to the script's own output.
	exec 1>&7 2>&8
	if [ -n "$fg_pid" ]; then
		# Its children first: once it is gone they are no longer its.
		mapfile -t tree < <(echo "$fg_pid"; descendants "$fg_pid")
		stop_pids 10 "${tree[@]}"
	fi
	for p in "${bg_pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
	stop_pids 10 "${proc_pids[@]}" "${bg_pids[@]}"
	if [ -n "$dockerd_pid" ] && kill -0 "$dockerd_pid" 2>/dev/null; then
		timeout 30 docker ps -aq | xargs -r timeout 30 docker rm -f -v >/dev/null 2>&1
		timeout 30 docker volume ls -q | xargs -r timeout 30 docker volume rm -f >/dev/null 2>&1
		stop_pids 30 "$dockerd_pid"
		cp "$run/dockerd.log" "$cache/last-dockerd.log" 2>/dev/null
	fi
	unmount_under "$exec_root"
	unmount_under "$run"
	unmount_under "$rootfs.tmp"
	# A failed apt-get must not leave every service on the machine barred
	# from starting.
	[ "$own_policy" = 0 ] || rm -f /usr/sbin/policy-rc.d
	wait 2>/dev/null
	rm -rf --one-file-system "$run"
	rm -f "$cache/run-dir" "$cache/background.pids"
	[ "$last_mark" = "$SECONDS" ] || mark "until exit"
	log "phases: $(printf '%s, ' "${phases[@]}" | sed 's/, $//')"
	# For a caller that runs the check in the background (.ci/run).
	[ -z "${SCAFO_EDGE_IMAGE_CHECK_RC_FILE:-}" ] || echo "$rc" >"$SCAFO_EDGE_IMAGE_CHECK_RC_FILE"
	if [ "$rc" = 0 ]; then
		log "passed in $(elapsed)"
	else
		log "exit $rc after $(elapsed); dockerd's log: $cache/last-dockerd.log; build logs: $cache/logs"
	fi
	exit "$rc"
}
exec 7>&1 8>&2
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --------------------------------------------------------------- packages

# install_packages installs what the check runs that this machine lacks.
install_packages() {
	local need=() t apt
	# The docker CLI used is the engine's own (see "dockerd" below).
	{ command -v dockerd && [ -x /usr/bin/docker ]; } >/dev/null || need+=(docker.io)
	command -v debootstrap >/dev/null || need+=(debootstrap)
	command -v curl >/dev/null || need+=(curl)
	command -v flock >/dev/null || need+=(util-linux)
	command -v ss >/dev/null || need+=(iproute2)
	command -v ps >/dev/null || need+=(procps)
	if [ ${#need[@]} -gt 0 ]; then
		log "installing ${need[*]}"
		t=$SECONDS
		# A package's postinst must not start the system's dockerd (with its
		# bridge and iptables rules): policy-rc.d 101 forbids starting services.
		if [ ! -e /usr/sbin/policy-rc.d ]; then
			printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
			chmod 755 /usr/sbin/policy-rc.d
			own_policy=1
		fi
		# Wait for another apt (unattended-upgrades on a fresh machine) rather
		# than fail at once on its lock.
		apt=(apt-get -o DPkg::Lock::Timeout=300)
		DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y --no-install-recommends "${need[@]}" >"$run/apt.log" 2>&1 ||
			{ "${apt[@]}" update >>"$run/apt.log" 2>&1 && DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y --no-install-recommends "${need[@]}" >>"$run/apt.log" 2>&1; } ||
			{ tail -20 "$run/apt.log" >&2; fail "apt-get install ${need[*]}"; }
		[ "$own_policy" = 0 ] || rm -f /usr/sbin/policy-rc.d
		own_policy=0
		log "installed in $(elapsed "$t")"
	fi
}

# --packages-only: .ci/run installs these first, alone, so that its own
# long apt-get (a browser among others) does not hold the dpkg lock while
# this check waits for debootstrap and dockerd.
if [ "$packages_only" = 1 ]; then
	install_packages
	exit 0
fi

command -v go >/dev/null || fail "needs Go (the builder stand-in copies the host's GOROOT): put it on PATH"
goroot=$(go env GOROOT)

# ------------------------------------------------ leftovers of a killed run

# A run that was killed before its cleanup can leave its dockerd (with
# containers), its background builds and its run directory (with mounts).
# Under the lock none of them belongs to a live run; each pid is checked
# to still be what was recorded before it is signalled.
if [ -s "$cache/dockerd.pid" ]; then
	p=$(cat "$cache/dockerd.pid")
	if [ "$(cat "/proc/$p/comm" 2>/dev/null)" = dockerd ]; then
		log "stopping dockerd $p, left by an earlier run"
		stop_pids 30 "$p"
	fi
fi
# Its containerd dies with it (dockerd starts it with a parent-death
# signal); a stale pid file would make the next dockerd take whatever
# process has that pid now for a running containerd.
if [ -s "$exec_root/containerd/containerd.pid" ]; then
	p=$(cat "$exec_root/containerd/containerd.pid")
	[ "$(cat "/proc/$p/comm" 2>/dev/null)" != containerd ] || stop_pids 10 "$p"
fi
rm -f "$cache/dockerd.pid" "$exec_root/containerd/containerd.pid"
if [ -s "$cache/background.pids" ]; then
	while read -r p fn; do
		[ "$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)" = "bash -c $fn " ] || continue
		log "stopping $fn (process group $p), left by an earlier run"
		kill -TERM -- "-$p" 2>/dev/null || true
		stop_pids 10 "$p"
	done <"$cache/background.pids"
	rm -f "$cache/background.pids"
fi
if [ -s "$cache/run-dir" ]; then
	old=$(cat "$cache/run-dir")
	case ${old##*/} in
	scafo-edge-image-check.??????)
		unmount_under "$old"
		rm -rf --one-file-system "$old"
		;;
	esac
fi
echo "$run" >"$cache/run-dir"
unmount_under "$exec_root"
# The plugins of earlier runs' sources (Go module proxy builds included).
for d in "$cache"/tools-*; do [ "$d" = "$tools" ] || rm -rf "$d"; done

# ------------------------------------------------------ background builds

mkdir -p "$cache/logs" "$DOCKER_CONFIG/cli-plugins"

# retry N CMD...: CMD up to N times, 10s apart, so that one network hiccup
# does not turn a cold run red.
retry() {
	local n=$1 i
	shift
	for ((i = 1; ; i++)); do
		"$@" && return 0
		[ "$i" -lt "$n" ] || return 1
		echo "image-check: try $i of $n failed, retrying: $*" >&2
		sleep 10
	done
}

# fetch_tools downloads the buildx and Compose packages of $PLUGINS_SUITE
# for this machine's architecture and unpacks their plugins into $tools,
# made in $tools.tmp and moved into place only when both are there.
fetch_tools() {
	set -euo pipefail
	local d=$tools.tmp arch
	arch=$(dpkg --print-architecture)
	rm -rf "$d"
	mkdir -p "$d/apt/lists/partial" "$d/apt/cache/archives/partial" "$d/debs" "$d/root"
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $PLUGINS_SUITE main" >"$d/apt/sources.list"
	: >"$d/apt/status"
	local apt=(apt-get -o "Dir::Etc::SourceList=$d/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
		-o "Dir::State::Lists=$d/apt/lists" -o "Dir::Cache=$d/apt/cache" -o "Dir::State::status=$d/apt/status"
		-o "APT::Architecture=$arch" -o APT::Architectures= -o Acquire::Languages=none -o APT::Sandbox::User=root)
	retry 3 "${apt[@]}" update
	(cd "$d/debs" && retry 3 "${apt[@]}" download docker-buildx docker-compose)
	local deb
	for deb in "$d"/debs/*.deb; do dpkg-deb -x "$deb" "$d/root"; done
	mv "$d/root/usr/libexec/docker/cli-plugins/docker-buildx" "$d/root/usr/libexec/docker/cli-plugins/docker-compose" "$d/"
	rm -rf "$d/apt" "$d/root"
	mv "$d" "$tools"
}

# make_rootfs debootstraps bookworm once. ca-certificates and tzdata feed
# the distroless stand-in; libcap2-bin is what the Dockerfile installs (its
# apt-get still runs, against Debian's archive).
make_rootfs() {
	set -euo pipefail
	retry 3 debootstrap_once
	# The host's apt settings that its mirror needs (a snapshot's Release
	# files may be past Valid-Until) go with it.
	grep -h -s -E 'Check-Valid-Until|Check-Date' /etc/apt/apt.conf.d/* >"$rootfs.tmp/etc/apt/apt.conf.d/99image-check" || true
	cp "$rootfs.tmp/etc/ssl/certs/ca-certificates.crt" "$rootfs.tmp/etc/ssl/certs/debian-ca-certificates.crt"
	rm -rf "$rootfs.tmp/var/cache/apt/archives"/*.deb "$rootfs.tmp/var/lib/apt/lists"/*_Packages
	mv "$rootfs.tmp" "$rootfs"
}

# debootstrap_once: debootstrap into an empty $rootfs.tmp. What a killed
# or failed one left there goes first: its mounts (proc and sys), then the
# files (--one-file-system: never through a mount that did not go).
debootstrap_once() {
	unmount_under "$rootfs.tmp"
	rm -rf --one-file-system "$rootfs.tmp"
	debootstrap --variant=minbase --include=ca-certificates,tzdata,libcap2-bin \
		bookworm "$rootfs.tmp" http://deb.debian.org/debian
}

# in_background NAME FUNC: FUNC in its own process group, logging to
# $cache/logs/NAME.log; its pid is in bg_pids and bg_NAME, and in
# $cache/background.pids for a later run to stop if this one is killed.
in_background() {
	export -f "${2?}" retry debootstrap_once unmount_under
	export tools rootfs PLUGINS_SUITE
	setsid bash -c "$2" >"$cache/logs/$1.log" 2>&1 9>&- &
	bg_pids+=("$!")
	printf -v "bg_$1" %s "$!"
	echo "$! $2" >>"$cache/background.pids"
}

# wait_for FILE PID WHAT DEADLINE_S: FILE appears while PID runs, else fail
# with the end of its log.
wait_for() {
	local file=$1 pid=$2 what=$3 deadline=$((SECONDS + $4))
	while [ ! -e "$file" ]; do
		if ! kill -0 "$pid" 2>/dev/null && [ ! -e "$file" ]; then
			tail -30 "$cache/logs/$what.log" >&2
			fail "$what failed (log: $cache/logs/$what.log)"
		fi
		[ "$SECONDS" -lt "$deadline" ] || fail "$what not done in $4s (log: $cache/logs/$what.log)"
		sleep 1
	done
}

# The plugins first, before the packages: they need only apt and the
# network, and go on while the packages install and the root file system
# is made.
t_tools=$SECONDS
if [ -d "$tools" ]; then
	log "buildx and Compose: cached in $tools"
	bg_tools=""
else
	log "fetching buildx and Compose from Debian $PLUGINS_SUITE (log: $cache/logs/tools.log)"
	in_background tools fetch_tools
fi

install_packages
mark packages
t_rootfs=$SECONDS
if [ -d "$rootfs" ]; then
	log "bookworm root file system: cached in $rootfs"
	bg_rootfs=""
else
	log "debootstrapping bookworm (log: $cache/logs/rootfs.log)"
	in_background rootfs make_rootfs
fi
# ----------------------------------------------------------------- dockerd

# The docker CLI is the one from the engine's package (Debian's docker.io:
# 20.10, the engine's API), first on PATH for deploy/upgrade-compose.sh
# too, not whatever docker comes first on this machine's PATH: a fresh CI
# machine has only that one, so every machine checks with the same client.
path_docker=$(command -v docker || echo none)
mkdir "$run/bin"
ln -s /usr/bin/docker "$run/bin/docker"
PATH=$run/bin:$PATH
log "starting dockerd ($(dockerd --version)) on $DOCKER_HOST; CLI: /usr/bin/docker ($(docker --version)), not $path_docker on PATH"
# Its own configuration file, empty, so /etc/docker/daemon.json cannot
# clash with the flags, and its own containerd namespaces, so a system
# containerd on the same socket could not mix its containers with these.
printf '{}\n' >"$run/daemon.json"
dockerd --config-file "$run/daemon.json" --data-root "$cache/docker" --exec-root "$exec_root" \
	--pidfile "$cache/dockerd.pid" --host "$DOCKER_HOST" \
	--containerd-namespace "$PROJECT" --containerd-plugins-namespace "$PROJECT-plugins" \
	--bridge=none --iptables=false --ip-masq=false --ip-forward=false \
	--userland-proxy=false >"$run/dockerd.log" 2>&1 9>&- &
dockerd_pid=$!
for ((i = 0; i < 60; i++)); do
	docker version >/dev/null 2>&1 && break
	kill -0 "$dockerd_pid" 2>/dev/null || { tail -20 "$run/dockerd.log" >&2; fail "dockerd exited"; }
	sleep 0.5
done
docker version >/dev/null 2>&1 || fail "dockerd did not answer on $DOCKER_HOST in 30s"
# Left by a run that was killed before its cleanup.
docker ps -aq | xargs -r docker rm -f -v >/dev/null
docker volume ls -q | xargs -r docker volume rm -f >/dev/null

# The edge's listeners must be free, now that any left over are gone and
# before minutes of building: TCP 80, 443 and 9180 and UDP 443 (HTTP/3),
# on 127.0.0.1 or on every address.
busy=$(ss -Hlntu | awk -v tcp=" ${HTTP_ADDR##*:} ${HTTPS_ADDR##*:} ${ADMIN_ADDR##*:} " -v udp="${HTTPS_ADDR##*:}" '{
	a = $5; sub(/%[^:]*:/, ":", a); port = a; sub(/.*:/, "", port); host = substr(a, 1, length(a) - length(port) - 1)
	if (host !~ /^(127\.0\.0\.1|0\.0\.0\.0|\*|\[::\]|\[::ffff:127\.0\.0\.1\])$/) next
	if (($1 == "tcp" && index(tcp, " " port " ")) || ($1 == "udp" && port == udp)) print $1 " " a
}' | paste -sd, -)
[ -z "$busy" ] || fail "something already uses the edge's addresses ($busy): stop it first"
# The images are built for both platforms the fleet's boxes run; the one
# of this machine's own is the one run.
NATIVE=$(docker version -f '{{.Server.Arch}}')
ARCHES=("$NATIVE")
for arch in amd64 arm64; do [ "$arch" = "$NATIVE" ] || ARCHES+=("$arch"); done
[ ${#ARCHES[@]} = 2 ] || fail "the engine is linux/$NATIVE: the image is built for linux/amd64 and linux/arm64, and one of them must be this machine's to run it"
mark dockerd

# The upstream and load generator, from this checkout, with the host's Go;
# built as .ci/run warms its cache (CGO_ENABLED=0 -trimpath), so that there
# the standard library is compiled already.
step env CGO_ENABLED=0 go build -C "$root" -trimpath -o "$run/imagecheck" ./deploy/imagecheck || fail "go build ./deploy/imagecheck"
mark "imagecheck helper"

# ------------------------------------------------------------- base images

# has_image NAME KEY: NAME exists, made from inputs that hash to KEY.
has_image() { [ "$(docker image inspect -f '{{index .Config.Labels "scafo-edge.image-check"}}' "$1" 2>/dev/null)" = "$2" ]; }

[ -z "${bg_rootfs:-}" ] || { wait_for "$rootfs" "$bg_rootfs" rootfs 900; log "bookworm debootstrapped in $(elapsed "$t_rootfs")"; }
mark "bookworm rootfs"

key=$( (cat "$rootfs/etc/debian_version"; go version; sha256sum /etc/ssl/certs/ca-certificates.crt) | sha256sum | cut -c1-16)
if ! has_image "$GO_IMAGE" "$key"; then
	log "making $GO_IMAGE: bookworm, $(go version | cut -d' ' -f3) from $goroot, the host's CA bundle"
	install -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
	# As the real image: Go in /usr/local/go, GOPATH /go, this toolchain
	# only. A step: a GOROOT takes a while to import.
	import_go() {
		tar -c -C "$rootfs" --exclude=./usr/local/go . -C "$(dirname "$goroot")" --transform "s,^\./$(basename "$goroot"),./usr/local/go," "./$(basename "$goroot")" |
			docker import --change "LABEL scafo-edge.image-check=$key" \
				--change 'ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
				--change 'ENV GOPATH=/go' --change 'ENV GOTOOLCHAIN=local' --change 'WORKDIR /go' - "$GO_IMAGE" >/dev/null
	}
	step import_go || fail "importing $GO_IMAGE"
fi

# load_image TAG ARCH DIR CONFIG: docker load an image for linux/ARCH of
# one layer, DIR's files, whose config is CONFIG (JSON). docker import on
# this engine stamps every image with the daemon's own architecture, and
# the build for the other one must find its base under that platform, or
# BuildKit would go to the registry for it.
load_image() {
	local a=$run/archive-$2 diff
	rm -rf "$a"
	mkdir -p "$a"
	tar -c -C "$3" --numeric-owner -f "$a/layer.tar" .
	diff=$(sha256sum "$a/layer.tar" | cut -d' ' -f1)
	printf '{"architecture":"%s","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}\n' "$2" "$4" "$diff" >"$a/config.json"
	printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":["layer.tar"]}]\n' "$1" >"$a/manifest.json"
	tar -c -C "$a" manifest.json config.json layer.tar | docker load >/dev/null
	rm -rf "$a"
}

# The distroless stand-in, once per platform (its files are the same for
# both: no binary in it), tagged $DISTROLESS_IMAGE-ARCH; each build tags
# its platform's as $DISTROLESS_IMAGE first.
key=$( (cat "$rootfs/etc/debian_version"; sha256sum "$rootfs/etc/ssl/certs/debian-ca-certificates.crt") | sha256sum | cut -c1-16)
for arch in "${ARCHES[@]}"; do
	has_image "$DISTROLESS_IMAGE-$arch" "$key" && continue
	log "making $DISTROLESS_IMAGE for linux/$arch: CA certificates, tzdata, passwd and group with nonroot 65532"
	d=$run/distroless
	if [ ! -d "$d" ]; then
		mkdir -p "$d/etc/ssl/certs" "$d/usr/share" "$d/tmp" "$d/home/nonroot" "$d/root" "$d/var/lib"
		cp "$rootfs/etc/ssl/certs/debian-ca-certificates.crt" "$d/etc/ssl/certs/ca-certificates.crt"
		cp -a "$rootfs/usr/share/zoneinfo" "$d/usr/share/"
		cp "$rootfs/etc/os-release" "$d/etc/"
		printf '%s\n' root:x:0:0:root:/root:/sbin/nologin nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin \
			nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin >"$d/etc/passwd"
		printf '%s\n' root:x:0: nobody:x:65534: tty:x:5: staff:x:50: nonroot:x:65532: >"$d/etc/group"
		chmod 1777 "$d/tmp"
		chmod 700 "$d/root" "$d/home/nonroot"
		chown 65532:65532 "$d/home/nonroot"
	fi
	load_image "$DISTROLESS_IMAGE-$arch" "$arch" "$d" "$(printf '{"User":"65532","WorkingDir":"/home/nonroot","Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],"Labels":{"scafo-edge.image-check":"%s"}}' "$key")"
	[ "$(docker image inspect -f '{{.Os}}/{{.Architecture}}' "$DISTROLESS_IMAGE-$arch")" = "linux/$arch" ] ||
		fail "the distroless stand-in for linux/$arch loaded as $(docker image inspect -f '{{.Os}}/{{.Architecture}}' "$DISTROLESS_IMAGE-$arch")"
done
mark "base images"

[ -z "${bg_tools:-}" ] || { wait_for "$tools" "$bg_tools" tools 900; log "buildx and Compose fetched in $(elapsed "$t_tools")"; }
ln -sf "$tools/docker-buildx" "$DOCKER_CONFIG/cli-plugins/docker-buildx"
ln -sf "$tools/docker-compose" "$DOCKER_CONFIG/cli-plugins/docker-compose"
# version_at_least HAVE WANT: dotted version HAVE is WANT or later.
version_at_least() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]; }
buildx_version=$(docker buildx version | awk '{ print $2 }')
compose_version=$(docker compose version --short)
version_at_least "${buildx_version#v}" "$MIN_BUILDX" || fail "buildx $buildx_version from $PLUGINS_SUITE is older than $MIN_BUILDX"
version_at_least "${compose_version#v}" "$MIN_COMPOSE" || fail "Compose $compose_version from $PLUGINS_SUITE is older than $MIN_COMPOSE"

# ------------------------------------------------------------------- build

mark "plugins (buildx, Compose)"
log "docker: $(docker version -f 'client {{.Client.Version}}, engine {{.Server.Version}}'), $(docker buildx version)"

check() { log "ok: $*"; }

# Through the buildx plugin, as Docker 23 and later build (`docker build`
# is buildx there): the plugin the README asks operators to install is the
# one that builds here, on the daemon's own BuildKit (buildx's docker
# driver, which loads the image into the daemon). Once per platform, the
# native one first and tagged $IMAGE (the one run below), the other
# $IMAGE-ARCH: cross-compiled by the Dockerfile's builder, never run here,
# so what is checked of it is what a build decides: its platform, user,
# state directory, and its binary's machine, linking and capability.
no_cache=()
[ "$build_cache" = 1 ] || no_cache=(--no-cache)
build_times=()
for arch in "${ARCHES[@]}"; do
	tag=$IMAGE
	[ "$arch" = "$NATIVE" ] || tag=$IMAGE-$arch
	docker tag "$DISTROLESS_IMAGE-$arch" "$DISTROLESS_IMAGE"
	log "building $dockerfile for linux/$arch with docker buildx build, as the README says (with --network host: this daemon has no bridge)"
	t=$SECONDS
	step docker buildx build --load "${no_cache[@]}" --platform "linux/$arch" --network host --build-arg VERSION=image-check \
		-f "$dockerfile" -t "$tag" "$root" >"$cache/logs/build-$arch.log" 2>&1 ||
		{ tail -30 "$cache/logs/build-$arch.log" >&2; fail "docker buildx build --platform linux/$arch (log: $cache/logs/build-$arch.log)"; }
	build_times+=("linux/$arch $(elapsed "$t")")
	size=$(docker image inspect -f '{{.Size}}' "$tag")
	log "built $tag for linux/$arch in $(elapsed "$t"): $((size / 1000)) kB"
	mark "build linux/$arch"

	platform=$(docker image inspect -f '{{.Os}}/{{.Architecture}}' "$tag")
	[ "$platform" = "linux/$arch" ] || fail "$tag is for $platform, want linux/$arch"
	user=$(docker image inspect -f '{{.Config.User}}' "$tag")
	[ "$user" = nonroot:nonroot ] || fail "$tag: USER is '$user', want nonroot:nonroot"
	# The image's file system, as a container made from it has it (and a
	# new named volume copies its directory). (stderr: this daemon warns
	# that IPv4 forwarding is off, as meant, and that an arm64 image does
	# not match the host: it is never started.)
	c=$(docker create "$tag" 2>/dev/null)
	docker export -o "$run/fs.tar" "$c"
	docker rm -v "$c" >/dev/null
	entry=$(tar -tv --numeric-owner -f "$run/fs.tar" var/lib/scafo-edge/ 2>/dev/null | head -n 1 || true)
	read -r mode owner _ <<<"$entry"
	{ [ "$mode" = drwx------ ] && [ "$owner" = 65532/65532 ]; } ||
		fail "$tag: /var/lib/scafo-edge in the image is '${mode:-missing} ${owner:-}', want drwx------ 65532/65532 (it holds certificate keys)"
	bin=$("$run/imagecheck" binary -path scafo-edge -arch "$arch" <"$run/fs.tar" 2>&1) || fail "$tag: $bin"
	rm -f "$run/fs.tar"
	check "$tag is linux/$arch, USER $user, /var/lib/scafo-edge $mode $owner; $bin"
done
docker tag "$DISTROLESS_IMAGE-$NATIVE" "$DISTROLESS_IMAGE"
size=$(docker image inspect -f '{{.Size}}' "$IMAGE")
mark "image checks"

"$run/imagecheck" upstream -addr 127.0.0.1:0 -addr-file "$run/upstream.addr" 9>&- &
proc_pids+=("$!")
for ((i = 0; i < 50; i++)); do [ -e "$run/upstream.addr" ] && break; sleep 0.1; done
upstream=$(cat "$run/upstream.addr") || fail "the loopback upstream did not start"
cat >"$run/routes.json" <<EOF
{"v": 1, "routes": [
  {"host": "$HOST", "application": "image-check", "upstreams": [{"node": "check", "address": "$upstream"}]},
  {"host": "*.${HTTP_HOST#*.}", "application": "image-check-http", "upstreams": [{"node": "check", "address": "$upstream"}]}
]}
EOF
chmod 644 "$run/routes.json"
edge_env=(-e SCAFO_EDGE_ROUTES_FILE=/etc/scafo-edge/routes.json -e SCAFO_EDGE_TLS=internal
	-e "SCAFO_EDGE_HTTP_ADDR=$HTTP_ADDR" -e "SCAFO_EDGE_HTTPS_ADDR=$HTTPS_ADDR" -e "SCAFO_EDGE_ADMIN_ADDR=$ADMIN_ADDR")

# wait_healthy NAME SECONDS: the container's HEALTHCHECK says healthy.
wait_healthy() {
	local s deadline=$((SECONDS + $2))
	while s=$(docker inspect -f '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}' "$1"); [ "$s" != "running healthy" ]; do
		case $s in running*) ;; *) docker logs "$1" 2>&1 | tail -20 >&2; fail "$1 is $s" ;; esac
		[ "$SECONDS" -lt "$deadline" ] || { docker logs "$1" 2>&1 | tail -20 >&2; fail "$1 not healthy in $2s: $s"; }
		sleep 1
	done
}

# through: a request through the edge reaches the upstream (HTTP and HTTPS).
through() {
	local body
	body=$(curl -fsS --max-time 10 -H "Host: $HTTP_HOST" "http://$HTTP_ADDR/through") || fail "HTTP request through the edge failed"
	[[ $body == "image-check upstream: GET /through (Host: $HTTP_HOST)"* ]] || fail "HTTP through the edge answered '$body'"
	body=$(curl -fsS --max-time 10 -k --resolve "$HOST:443:127.0.0.1" "https://$HOST/through") || fail "HTTPS request through the edge failed"
	[[ $body == "image-check upstream: GET /through (Host: $HOST)"* ]] || fail "HTTPS through the edge answered '$body'"
}

log "running $IMAGE (--network host, a new named volume, the edge on 127.0.0.1:80, :443, :9180)"
docker run -d --name scafo-edge-check --network host --stop-timeout 35 \
	-v scafo-edge-check-state:/var/lib/scafo-edge -v "$run/routes.json:/etc/scafo-edge/routes.json:ro" \
	"${edge_env[@]}" "$IMAGE" >/dev/null 2>"$run/run.err" || fail "docker run: $(cat "$run/run.err")"
t=$SECONDS
wait_healthy scafo-edge-check 90
check "HEALTHCHECK healthy $(elapsed "$t") after start"
pid=$(docker inspect -f '{{.State.Pid}}' scafo-edge-check)
status=$(cat "/proc/$pid/status")
uid=$(awk '/^Uid:/ {print $2, $3, $4, $5}' <<<"$status")
[ "$uid" = "65532 65532 65532 65532" ] || fail "the edge runs as uid $uid, want 65532"
check "runs as uid 65532"
# Bit 10 is CAP_NET_BIND_SERVICE: permitted and effective hold it alone,
# from the file capability (the bounding set is Docker's default).
for set in CapInh CapPrm CapEff CapAmb; do
	v=$(awk -v s="$set:" '$1 == s {print $2}' <<<"$status")
	want=0000000000000400
	case $set in CapInh | CapAmb) want=0000000000000000 ;; esac
	[ "$v" = "$want" ] || fail "$set is $v, want $want (cap_net_bind_service only)"
done
check "capabilities: cap_net_bind_service only (CapPrm = CapEff = 0x400), bound $HTTP_ADDR and $HTTPS_ADDR as 65532"
vol=$(docker volume inspect -f '{{.Mountpoint}}' scafo-edge-check-state)
[ "$(stat -c '%a %u:%g' "$vol")" = "700 65532:65532" ] || fail "the named volume is $(stat -c '%a %u:%g' "$vol"), want 700 65532:65532"
check "the named volume came up 700 65532:65532"
through
check "a request through the edge reaches the loopback upstream over HTTP and HTTPS"
# A request in flight when docker stop sends SIGTERM must be answered.
curl -fsS --max-time 30 -H "Host: $HTTP_HOST" "http://$HTTP_ADDR/slow/4s" >"$run/slow.out" 2>&1 9>&- &
slow_pid=$!
proc_pids+=("$slow_pid")
for ((i = 0; i < 100; i++)); do [ "$(curl -fsS "http://$upstream/inflight")" = 1 ] && break; sleep 0.1; done
[ "$(curl -fsS "http://$upstream/inflight")" = 1 ] || fail "the slow request never reached the upstream"
t=$SECONDS
step docker stop scafo-edge-check >/dev/null
code=$(docker inspect -f '{{.State.ExitCode}}' scafo-edge-check)
[ "$code" = 0 ] || { docker logs scafo-edge-check 2>&1 | tail -20 >&2; fail "docker stop: the edge exited $code, want 0"; }
wait "$slow_pid" || fail "the request in flight at docker stop failed: $(cat "$run/slow.out")"
grep -q "^image-check upstream: GET /slow/4s" "$run/slow.out" || fail "the request in flight at docker stop got '$(cat "$run/slow.out")'"
check "docker stop: exit 0 in $(elapsed "$t"), the 4s request in flight answered"
docker rm -v scafo-edge-check >/dev/null
docker volume rm scafo-edge-check-state >/dev/null

# --------------------------------------------------------------- upgrade

mark "run, health, stop"
log "$(docker compose version)"

# The project's own compose file, with what this machine needs on top:
# the routes file instead of a node, the internal CA instead of Let's
# Encrypt, loopback listeners, and the image just built.
compose_file() {
	cat >"$run/compose.yaml" <<EOF
services:
  edge:
    extends:
      file: $root/deploy/compose.yaml
      service: edge
    image: $IMAGE
    environment:
      SCAFO_EDGE_ROUTES_FILE: /etc/scafo-edge/routes.json
      SCAFO_EDGE_TLS: internal
      SCAFO_EDGE_HTTP_ADDR: $HTTP_ADDR
      SCAFO_EDGE_HTTPS_ADDR: $HTTPS_ADDR
      SCAFO_EDGE_ADMIN_ADDR: $ADMIN_ADDR
$(for kv in "$@"; do echo "      $kv"; done)
    volumes:
      - type: bind
        source: $run/routes.json
        target: /etc/scafo-edge/routes.json
        read_only: true
volumes:
  state:
EOF
}
echo image-check >"$run/ingress-token"
chmod 644 "$run/ingress-token"
export SCAFO_INGRESS_TOKEN_PATH=$run/ingress-token SCAFO_EDGE_PROJECT=$PROJECT SCAFO_EDGE_COMPOSE_FILE=$run/compose.yaml
compose_file
step docker compose -p "$PROJECT" -f "$run/compose.yaml" up -d >"$run/compose.log" 2>&1 || { cat "$run/compose.log" >&2; fail "docker compose up"; }
first=$(docker compose -p "$PROJECT" -f "$run/compose.yaml" ps -q edge)
wait_healthy "$first" 90
through

# Each upgrade replaces the edge the one before started; --upgrades repeats
# it, since a window that loses one request in many shows only so.
for ((u = 1; u <= upgrades; u++)); do
	log "upgrade $u of $upgrades: deploy/upgrade-compose.sh under load (HTTP and HTTPS, new and kept-alive connections)"
	"$run/imagecheck" load -http "http://$HTTP_ADDR/load" -https "https://$HTTPS_ADDR/load" -host "$HOST" -http-host "$HTTP_HOST" -max 150s >"$run/load.out" 2>"$run/load.err" 9>&- &
	load_pid=$!
	proc_pids+=("$load_pid")
	sleep 2 # some load on the old edge first, so the handover happens under it
	t=$SECONDS
	step "$root/deploy/upgrade-compose.sh" >"$run/upgrade.log" 2>&1 || { cat "$run/upgrade.log" >&2; fail "deploy/upgrade-compose.sh exited non-zero"; }
	upgrade_time=$(elapsed "$t")
	sleep 2 # and some on the new one
	# (It may have stopped already, at its -max.)
	kill -INT "$load_pid" 2>/dev/null || true
	wait "$load_pid" || fail "the load generator failed: $(cat "$run/load.err")"
	load=$(cat "$run/load.out")
	log "load: $load"
	[[ $load =~ requests=([0-9]+).*refused=([0-9]+)\ failed=([0-9]+) ]] || fail "the load printed '$load'"
	[ "${BASH_REMATCH[1]}" -gt 100 ] || fail "only ${BASH_REMATCH[1]} requests went through: not a load"
	{ [ "${BASH_REMATCH[2]}" = 0 ] && [ "${BASH_REMATCH[3]}" = 0 ]; } ||
		fail "the upgrade refused ${BASH_REMATCH[2]} and failed ${BASH_REMATCH[3]} requests: $(head -5 "$run/load.err")"
	check "upgrade $u of $upgrades in $upgrade_time under load: $load"
	docker inspect "$first" >/dev/null 2>&1 && fail "the old container $first is still there"
	second=$(docker compose -p "$PROJECT" -f "$run/compose.yaml" ps -q edge)
	handovers=$(curl -fsS "http://$ADMIN_ADDR/metrics" | grep '^scafo_edge_handovers_total{result="received"}' || true)
	[[ $handovers == *" 1" ]] || fail "the new edge's metrics say '$handovers', want scafo_edge_handovers_total{result=\"received\"} 1"
	check "the new edge counts $handovers; readyz: $(curl -fsS "http://$ADMIN_ADDR/readyz" | head -n 1)"
	first=$second
done
mark "upgrade under load"

log "upgrading to a successor that crash-loops (SCAFO_EDGE_LOG_LEVEL=bogus)"
compose_file "SCAFO_EDGE_LOG_LEVEL: bogus"
t=$SECONDS
rc=0
step env SCAFO_EDGE_UPGRADE_LOG_DIR="$run/upgrade-logs" "$root/deploy/upgrade-compose.sh" >"$run/crash.log" 2>&1 || rc=$?
crash_time=$(elapsed "$t")
[ "$rc" != 0 ] || { cat "$run/crash.log" >&2; fail "deploy/upgrade-compose.sh accepted a crash-looping successor"; }
[ $((SECONDS - t)) -le 30 ] || { cat "$run/crash.log" >&2; fail "deploy/upgrade-compose.sh took $crash_time to give up on a crash-looping successor"; }
# No match is reported by the check below, not by pipefail's silent exit.
saved=$(grep -o "saved in [^ ;]*" "$run/crash.log" | cut -d' ' -f3 || true)
{ [ -n "$saved" ] && grep -q bogus "$saved"; } || { cat "$run/crash.log" >&2; fail "the crashed successor's log was not kept (or does not say why)"; }
[ "$(docker compose -p "$PROJECT" -f "$run/compose.yaml" ps -q edge)" = "$second" ] || fail "after the failed upgrade, the edge is not $second alone"
[ "$(docker inspect -f '{{.HostConfig.RestartPolicy.Name}}' "$second")" = unless-stopped ] || fail "the failed upgrade did not restore $second's restart policy"
through
check "a crash-looping successor: exit $rc in $crash_time, its log kept ($(wc -l <"$saved") lines), the running edge kept serving: $(grep -m1 'did not' "$run/crash.log" | cut -c1-160)"
step docker compose -p "$PROJECT" -f "$run/compose.yaml" down -v >/dev/null 2>&1
mark "crash-looping successor"

# What each run adds to the data root: the image it replaced (dangling
# now) and build cache past a bound. The base images are tagged and stay.
step docker image prune -f >/dev/null
step docker builder prune -f --keep-storage 3GB >/dev/null
log "data root: $(du -sh "$cache/docker" | cut -f1)"
mark prune

log "summary: image $((size / 1000)) kB, built in $(printf '%s, ' "${build_times[@]}")upgrade under load: $load; crash-looping successor given up in $crash_time"
