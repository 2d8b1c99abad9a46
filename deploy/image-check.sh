#!/usr/bin/env bash
# Build the image from this repository's Dockerfile, unchanged, on a real
# Docker engine and check what the README promises of it: it runs as uid
# 65532 with cap_net_bind_service as its only capability, its state volume
# comes up 0700 and owned by 65532, its HEALTHCHECK reaches healthy, it
# proxies a request to a loopback upstream over HTTP and HTTPS, `docker stop`
# exits 0, deploy/upgrade-compose.sh replaces it under load with no request
# refused or failed, and the same script gives up at once on a successor
# that crash-loops, keeping its log. .ci/run calls it; an operator can too:
#
#   sudo deploy/image-check.sh                       # the Dockerfile at the root
#   sudo deploy/image-check.sh --dockerfile OTHER    # another one, same context
#
# What it needs, and makes when it is missing (Debian, as root):
#   - Debian's docker.io (dockerd 20.10 with BuildKit) and debootstrap, by
#     apt-get. It starts its own dockerd, never the system's: its own data
#     root (in the cache), socket and pid file, no bridge network and no
#     iptables rules (--bridge=none --iptables=false), so every container
#     and build step uses --network host and the edge serves on 127.0.0.1.
#   - The base images, under their real names, when no registry can be
#     reached: golang:1.26-bookworm is a debootstrapped bookworm with this
#     host's /usr/local/go and CA bundle (the build's `go mod download` and
#     `apt-get` go out through whatever TLS the host trusts); the distroless
#     static-debian12:nonroot is Debian's CA certificates, tzdata and an
#     /etc/passwd and /etc/group with nonroot = 65532, and nothing else.
#   - The docker/dockerfile:1 frontend that the Dockerfile's `# syntax=` line
#     asks for (the daemon forwards to it and cannot skip it), and the buildx
#     and Compose v2 CLI plugins, all built with the host's Go from the Go
#     module proxy at the versions pinned below, which are built from one
#     module graph so the three share one compile.
#
# Cache, kept between runs on one machine: ${XDG_CACHE_HOME:-~/.cache}/
# scafo-edge-image-check (SCAFO_EDGE_IMAGE_CHECK_CACHE): the bookworm root
# file system, the plugin binaries, and the daemon's data root (base images
# and BuildKit's layer cache). Delete it to start cold. The plugins are put
# in a private DOCKER_CONFIG there, so an operator's ~/.docker is untouched.
#
# Cost on a two-core machine shared with other work: about 10 minutes cold
# (compiling the three tools is most of it), under 2 warm; the README's
# "Checking the image" has the numbers. Every exit path stops the daemon it
# started and removes what it ran; a failed check exits non-zero with a line
# saying which.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dockerfile=$root/Dockerfile
build_cache=1
while [ $# -gt 0 ]; do
	case $1 in
	--dockerfile) dockerfile=$(realpath "$2"); shift 2 ;;
	--no-build-cache) build_cache=0; shift ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "image-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done

# Compose v2.40.3 pins buildx v0.29.1 and BuildKit v0.25.1 in its go.mod:
# taking those exact versions keeps the three tools on one module graph.
COMPOSE_VERSION=v2.40.3
BUILDX_VERSION=v0.29.1
BUILDKIT_VERSION=v0.25.1
GO_IMAGE=golang:1.26-bookworm
DISTROLESS_IMAGE=gcr.io/distroless/static-debian12:nonroot
FRONTEND_IMAGE=docker/dockerfile:1
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

[ "$(id -u)" = 0 ] || fail "run as root: it installs packages, starts dockerd and debootstraps"
mkdir -p "$cache"
# One run at a time per cache: two daemons on one data root corrupt it.
exec 9>"$cache/lock"
flock -n 9 || fail "another image check holds $cache/lock"

run=$(mktemp -d "${TMPDIR:-/tmp}/scafo-edge-image-check.XXXXXX")
# The edge runs as 65532 and reads the routes file from here.
chmod 755 "$run"
dockerd_pid="" bg_pids=() proc_pids=()
export DOCKER_HOST=unix://$run/docker.sock DOCKER_CONFIG=$cache/docker-config DOCKER_BUILDKIT=1

# cleanup runs on every exit: the background builds (each in its own
# process group, so their compilers go too), the upstream and load, every
# container and volume of the private daemon (nothing else uses it), and
# the daemon, whose managed containerd stops with it.
cleanup() {
	local rc=$? i
	set +e
	trap - EXIT INT TERM
	for p in "${bg_pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
	for p in "${proc_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	if [ -n "$dockerd_pid" ] && kill -0 "$dockerd_pid" 2>/dev/null; then
		docker ps -aq | xargs -r docker rm -f >/dev/null 2>&1
		docker volume ls -q | xargs -r docker volume rm -f >/dev/null 2>&1
		kill -TERM "$dockerd_pid"
		for ((i = 0; i < 60; i++)); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.5; done
		if kill -0 "$dockerd_pid" 2>/dev/null; then
			log "dockerd did not stop in 30s: killing it"
			kill -KILL "$dockerd_pid"
		fi
		cp "$run/dockerd.log" "$cache/last-dockerd.log" 2>/dev/null
	fi
	# dockerd leaves its default network namespace bind-mounted in its
	# exec root.
	awk -v r="$run/" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l
	wait 2>/dev/null
	rm -rf "$run"
	if [ "$rc" = 0 ]; then
		log "passed in $(elapsed)"
	else
		log "exit $rc after $(elapsed); dockerd's log: $cache/last-dockerd.log; build logs: $cache/logs"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --------------------------------------------------------------- packages

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v curl >/dev/null || need+=(curl)
command -v flock >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	t=$SECONDS
	# A package's postinst must not start the system's dockerd (with its
	# bridge and iptables rules): policy-rc.d 101 forbids starting services.
	own_policy=0
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 755 /usr/sbin/policy-rc.d
		own_policy=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >"$run/apt.log" 2>&1 ||
		{ apt-get update >>"$run/apt.log" 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >>"$run/apt.log" 2>&1; } ||
		{ tail -20 "$run/apt.log" >&2; fail "apt-get install ${need[*]}"; }
	[ "$own_policy" = 0 ] || rm -f /usr/sbin/policy-rc.d
	log "installed in $(elapsed "$t")"
fi
command -v go >/dev/null || fail "needs Go (the builder stand-in copies the host's GOROOT): put it on PATH"
goroot=$(go env GOROOT)

# ------------------------------------------------------ background builds

mkdir -p "$cache/logs" "$DOCKER_CONFIG/cli-plugins"
tools=$cache/tools-$COMPOSE_VERSION
rootfs=$cache/bookworm-rootfs

# build_tools builds the frontend and buildx, then Compose (needed last, by
# the upgrade), each into $tools once; .ok files say each is done.
build_tools() {
	set -euo pipefail
	mkdir -p "$tools/mod"
	cd "$tools/mod"
	if [ ! -e go.mod ]; then
		cat >go.mod <<-EOF
			module scafo-edge-image-check-tools

			go 1.24
		EOF
		cat >tools.go <<-'EOF'
			//go:build tools

			package tools

			import (
				_ "github.com/docker/buildx/cmd/buildx"
				_ "github.com/docker/compose/v2/cmd"
				_ "github.com/moby/buildkit/frontend/dockerfile/cmd/dockerfile-frontend"
			)
		EOF
		GOFLAGS=-mod=mod go get "github.com/docker/compose/v2/cmd@$COMPOSE_VERSION" \
			"github.com/docker/buildx/cmd/buildx@$BUILDX_VERSION" \
			"github.com/moby/buildkit/frontend/dockerfile/cmd/dockerfile-frontend@$BUILDKIT_VERSION"
	fi
	export CGO_ENABLED=0 GOFLAGS=-mod=mod
	[ -e "$tools/dockerfile-frontend" ] || go build -trimpath -ldflags "-s -w" \
		-o "$tools/dockerfile-frontend" github.com/moby/buildkit/frontend/dockerfile/cmd/dockerfile-frontend
	[ -e "$tools/docker-buildx" ] || go build -trimpath \
		-ldflags "-s -w -X github.com/docker/buildx/version.Version=$BUILDX_VERSION" \
		-o "$tools/docker-buildx" github.com/docker/buildx/cmd/buildx
	touch "$tools/build.ok"
	[ -e "$tools/docker-compose" ] || go build -trimpath \
		-ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$COMPOSE_VERSION" \
		-o "$tools/docker-compose" github.com/docker/compose/v2/cmd
	touch "$tools/compose.ok"
}

# make_rootfs debootstraps bookworm once. ca-certificates and tzdata feed
# the distroless stand-in; libcap2-bin is what the Dockerfile installs (its
# apt-get still runs, against Debian's archive).
make_rootfs() {
	set -euo pipefail
	rm -rf "$rootfs.tmp"
	debootstrap --variant=minbase --include=ca-certificates,tzdata,libcap2-bin \
		bookworm "$rootfs.tmp" http://deb.debian.org/debian
	# The host's apt settings that its mirror needs (a snapshot's Release
	# files may be past Valid-Until) go with it.
	grep -h -s -E 'Check-Valid-Until|Check-Date' /etc/apt/apt.conf.d/* >"$rootfs.tmp/etc/apt/apt.conf.d/99image-check" || true
	cp "$rootfs.tmp/etc/ssl/certs/ca-certificates.crt" "$rootfs.tmp/etc/ssl/certs/debian-ca-certificates.crt"
	rm -rf "$rootfs.tmp/var/cache/apt/archives"/*.deb "$rootfs.tmp/var/lib/apt/lists"/*_Packages
	mv "$rootfs.tmp" "$rootfs"
}

# in_background NAME FUNC: FUNC in its own process group, logging to
# $cache/logs/NAME.log; its pid is in bg_pids and bg_NAME.
in_background() {
	export -f "$2"
	export tools rootfs COMPOSE_VERSION BUILDX_VERSION BUILDKIT_VERSION
	setsid bash -c "$2" >"$cache/logs/$1.log" 2>&1 &
	bg_pids+=("$!")
	printf -v "bg_$1" %s "$!"
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

t_tools=$SECONDS
if [ -e "$tools/compose.ok" ]; then
	log "plugins and frontend: cached in $tools"
	bg_tools=""
else
	log "building the dockerfile frontend, buildx and Compose from the Go module proxy (log: $cache/logs/tools.log)"
	in_background tools build_tools
fi
t_rootfs=$SECONDS
if [ -d "$rootfs" ]; then
	log "bookworm root file system: cached in $rootfs"
	bg_rootfs=""
else
	log "debootstrapping bookworm (log: $cache/logs/rootfs.log)"
	in_background rootfs make_rootfs
fi
# The upstream and load generator, from this checkout, with the host's Go;
# built as .ci/run warms its cache (CGO_ENABLED=0 -trimpath), so that there
# the standard library is compiled already.
(cd "$root" && CGO_ENABLED=0 go build -trimpath -o "$run/imagecheck" ./deploy/imagecheck) || fail "go build ./deploy/imagecheck"

# ----------------------------------------------------------------- dockerd

log "starting dockerd ($(dockerd --version)) on $DOCKER_HOST"
dockerd --data-root "$cache/docker" --exec-root "$run/exec" --pidfile "$run/dockerd.pid" \
	--host "$DOCKER_HOST" --bridge=none --iptables=false --ip-masq=false --ip-forward=false \
	--userland-proxy=false >"$run/dockerd.log" 2>&1 &
dockerd_pid=$!
for ((i = 0; i < 60; i++)); do
	docker version >/dev/null 2>&1 && break
	kill -0 "$dockerd_pid" 2>/dev/null || { tail -20 "$run/dockerd.log" >&2; fail "dockerd exited"; }
	sleep 0.5
done
docker version >/dev/null 2>&1 || fail "dockerd did not answer on $DOCKER_HOST in 30s"
# Left by a run that was killed before its cleanup.
docker ps -aq | xargs -r docker rm -f >/dev/null
docker volume ls -q | xargs -r docker volume rm -f >/dev/null

# ------------------------------------------------------------- base images

# has_image NAME KEY: NAME exists, made from inputs that hash to KEY.
has_image() { [ "$(docker image inspect -f '{{index .Config.Labels "scafo-edge.image-check"}}' "$1" 2>/dev/null)" = "$2" ]; }

[ -z "${bg_rootfs:-}" ] || { wait_for "$rootfs" "$bg_rootfs" rootfs 900; log "bookworm debootstrapped in $(elapsed "$t_rootfs")"; }

key=$( (cat "$rootfs/etc/debian_version"; go version; sha256sum /etc/ssl/certs/ca-certificates.crt) | sha256sum | cut -c1-16)
if ! has_image "$GO_IMAGE" "$key"; then
	log "making $GO_IMAGE: bookworm, $(go version | cut -d' ' -f3) from $goroot, the host's CA bundle"
	install -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
	# As the real image: Go in /usr/local/go, GOPATH /go, this toolchain only.
	tar -c -C "$rootfs" --exclude=./usr/local/go . -C "$(dirname "$goroot")" --transform "s,^\./$(basename "$goroot"),./usr/local/go," "./$(basename "$goroot")" |
		docker import --change "LABEL scafo-edge.image-check=$key" \
			--change 'ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
			--change 'ENV GOPATH=/go' --change 'ENV GOTOOLCHAIN=local' --change 'WORKDIR /go' - "$GO_IMAGE" >/dev/null
fi

key=$( (cat "$rootfs/etc/debian_version"; sha256sum "$rootfs/etc/ssl/certs/debian-ca-certificates.crt") | sha256sum | cut -c1-16)
if ! has_image "$DISTROLESS_IMAGE" "$key"; then
	log "making $DISTROLESS_IMAGE: CA certificates, tzdata, passwd and group with nonroot 65532"
	d=$run/distroless
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
	tar -c -C "$d" --numeric-owner . |
		docker import --change "LABEL scafo-edge.image-check=$key" --change 'USER 65532' --change 'WORKDIR /home/nonroot' \
			--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
			--change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' - "$DISTROLESS_IMAGE" >/dev/null
fi

[ -z "${bg_tools:-}" ] || { wait_for "$tools/build.ok" "$bg_tools" tools 900; log "frontend and buildx built in $(elapsed "$t_tools")"; }
ln -sf "$tools/docker-buildx" "$DOCKER_CONFIG/cli-plugins/docker-buildx"
key=$(sha256sum "$tools/dockerfile-frontend" | cut -c1-16)
if ! has_image "$FRONTEND_IMAGE" "$key"; then
	log "making $FRONTEND_IMAGE from BuildKit $BUILDKIT_VERSION"
	mkdir -p "$run/frontend/bin"
	cp "$tools/dockerfile-frontend" "$run/frontend/bin/"
	# The labels the published frontend image carries: BuildKit reads them.
	tar -c -C "$run/frontend" . |
		docker import --change "LABEL scafo-edge.image-check=$key" \
			--change 'LABEL moby.buildkit.frontend.network.none="true"' \
			--change 'LABEL moby.buildkit.frontend.caps="moby.buildkit.frontend.inputs,moby.buildkit.frontend.subrequests,moby.buildkit.frontend.contexts"' \
			--change 'ENTRYPOINT ["/bin/dockerfile-frontend"]' - "$FRONTEND_IMAGE" >/dev/null
fi

# ------------------------------------------------------------------- build

log "docker: $(docker version -f 'client {{.Client.Version}}, engine {{.Server.Version}}'), $(docker buildx version)"
log "building $dockerfile as the README says (with --network host: this daemon has no bridge)"
t=$SECONDS
no_cache=()
[ "$build_cache" = 1 ] || no_cache=(--no-cache)
docker build "${no_cache[@]}" --network host --build-arg VERSION=image-check -f "$dockerfile" -t "$IMAGE" "$root" \
	>"$cache/logs/build.log" 2>&1 || { tail -30 "$cache/logs/build.log" >&2; fail "docker build (log: $cache/logs/build.log)"; }
build_time=$(elapsed "$t")
size=$(docker image inspect -f '{{.Size}}' "$IMAGE")
log "built $IMAGE in $build_time: $((size / 1000)) kB"

# ---------------------------------------------------------- image checks

check() { log "ok: $*"; }

user=$(docker image inspect -f '{{.Config.User}}' "$IMAGE")
[ "$user" = nonroot:nonroot ] || fail "image USER is '$user', want nonroot:nonroot"

# The directory in the image, as a new named volume copies it.
# (stderr: this daemon warns that IPv4 forwarding is off, as meant.)
c=$(docker create "$IMAGE" 2>/dev/null)
entry=$(docker export "$c" | tar -tv --numeric-owner -f - var/lib/scafo-edge/ 2>/dev/null | head -n 1 || true)
docker rm "$c" >/dev/null
read -r mode owner _ <<<"$entry"
[ "$mode" = drwx------ ] && [ "$owner" = 65532/65532 ] ||
	fail "/var/lib/scafo-edge in the image is '${mode:-missing} ${owner:-}', want drwx------ 65532/65532 (it holds certificate keys)"
check "/var/lib/scafo-edge in the image is $mode $owner"

"$run/imagecheck" upstream -addr 127.0.0.1:0 -addr-file "$run/upstream.addr" &
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
	-e SCAFO_EDGE_HTTP_ADDR=$HTTP_ADDR -e SCAFO_EDGE_HTTPS_ADDR=$HTTPS_ADDR -e SCAFO_EDGE_ADMIN_ADDR=$ADMIN_ADDR)
for a in $HTTP_ADDR $HTTPS_ADDR $ADMIN_ADDR; do
	! (exec 3<>"/dev/tcp/${a%:*}/${a##*:}") 2>/dev/null || fail "something already listens on $a: the edge's listeners need it"
done

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
curl -fsS --max-time 30 -H "Host: $HTTP_HOST" "http://$HTTP_ADDR/slow/4s" >"$run/slow.out" 2>&1 &
slow_pid=$!
proc_pids+=("$slow_pid")
for ((i = 0; i < 100; i++)); do [ "$(curl -fsS "http://$upstream/inflight")" = 1 ] && break; sleep 0.1; done
[ "$(curl -fsS "http://$upstream/inflight")" = 1 ] || fail "the slow request never reached the upstream"
t=$SECONDS
docker stop scafo-edge-check >/dev/null
code=$(docker inspect -f '{{.State.ExitCode}}' scafo-edge-check)
[ "$code" = 0 ] || { docker logs scafo-edge-check 2>&1 | tail -20 >&2; fail "docker stop: the edge exited $code, want 0"; }
wait "$slow_pid" || fail "the request in flight at docker stop failed: $(cat "$run/slow.out")"
grep -q "^image-check upstream: GET /slow/4s" "$run/slow.out" || fail "the request in flight at docker stop got '$(cat "$run/slow.out")'"
check "docker stop: exit 0 in $(elapsed "$t"), the 4s request in flight answered"
docker rm -v scafo-edge-check >/dev/null
docker volume rm scafo-edge-check-state >/dev/null

# --------------------------------------------------------------- upgrade

[ -z "${bg_tools:-}" ] || { wait_for "$tools/compose.ok" "$bg_tools" tools 900; log "Compose built in $(elapsed "$t_tools")"; }
ln -sf "$tools/docker-compose" "$DOCKER_CONFIG/cli-plugins/docker-compose"
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
docker compose -p "$PROJECT" -f "$run/compose.yaml" up -d >"$run/compose.log" 2>&1 || { cat "$run/compose.log" >&2; fail "docker compose up"; }
first=$(docker compose -p "$PROJECT" -f "$run/compose.yaml" ps -q edge)
wait_healthy "$first" 90
through

log "upgrading with deploy/upgrade-compose.sh under load (HTTP and HTTPS, new and kept-alive connections)"
"$run/imagecheck" load -http "http://$HTTP_ADDR/load" -https "https://$HTTPS_ADDR/load" -host "$HOST" -http-host "$HTTP_HOST" -max 150s >"$run/load.out" 2>"$run/load.err" &
load_pid=$!
proc_pids+=("$load_pid")
sleep 2 # some load on the old edge first, so the handover happens under it
t=$SECONDS
"$root/deploy/upgrade-compose.sh" >"$run/upgrade.log" 2>&1 || { cat "$run/upgrade.log" >&2; fail "deploy/upgrade-compose.sh exited non-zero"; }
upgrade_time=$(elapsed "$t")
sleep 2 # and some on the new one
kill -INT "$load_pid"
wait "$load_pid" || fail "the load generator failed: $(cat "$run/load.err")"
load=$(cat "$run/load.out")
log "load: $load"
[[ $load =~ requests=([0-9]+).*refused=([0-9]+)\ failed=([0-9]+) ]] || fail "the load printed '$load'"
[ "${BASH_REMATCH[1]}" -gt 100 ] || fail "only ${BASH_REMATCH[1]} requests went through: not a load"
[ "${BASH_REMATCH[2]}" = 0 ] && [ "${BASH_REMATCH[3]}" = 0 ] ||
	fail "the upgrade refused ${BASH_REMATCH[2]} and failed ${BASH_REMATCH[3]} requests: $(head -5 "$run/load.err")"
check "upgraded in $upgrade_time under load: $load"
docker inspect "$first" >/dev/null 2>&1 && fail "the old container $first is still there"
second=$(docker compose -p "$PROJECT" -f "$run/compose.yaml" ps -q edge)
handovers=$(curl -fsS "http://$ADMIN_ADDR/metrics" | grep '^scafo_edge_handovers_total{result="received"}' || true)
[[ $handovers == *" 1" ]] || fail "the new edge's metrics say '$handovers', want scafo_edge_handovers_total{result=\"received\"} 1"
check "the new edge counts $handovers; readyz: $(curl -fsS "http://$ADMIN_ADDR/readyz" | head -n 1)"

log "upgrading to a successor that crash-loops (SCAFO_EDGE_LOG_LEVEL=bogus)"
compose_file "SCAFO_EDGE_LOG_LEVEL: bogus"
t=$SECONDS
rc=0
SCAFO_EDGE_UPGRADE_LOG_DIR=$run/upgrade-logs "$root/deploy/upgrade-compose.sh" >"$run/crash.log" 2>&1 || rc=$?
crash_time=$(elapsed "$t")
[ "$rc" != 0 ] || { cat "$run/crash.log" >&2; fail "deploy/upgrade-compose.sh accepted a crash-looping successor"; }
[ $((SECONDS - t)) -le 30 ] || { cat "$run/crash.log" >&2; fail "deploy/upgrade-compose.sh took $crash_time to give up on a crash-looping successor"; }
saved=$(grep -o "saved in [^ ;]*" "$run/crash.log" | cut -d' ' -f3)
[ -n "$saved" ] && grep -q bogus "$saved" || { cat "$run/crash.log" >&2; fail "the crashed successor's log was not kept (or does not say why)"; }
[ "$(docker compose -p "$PROJECT" -f "$run/compose.yaml" ps -q edge)" = "$second" ] || fail "after the failed upgrade, the edge is not $second alone"
[ "$(docker inspect -f '{{.HostConfig.RestartPolicy.Name}}' "$second")" = unless-stopped ] || fail "the failed upgrade did not restore $second's restart policy"
through
check "a crash-looping successor: exit $rc in $crash_time, its log kept ($(wc -l <"$saved") lines), the running edge kept serving: $(grep -m1 'did not' "$run/crash.log" | cut -c1-160)"
docker compose -p "$PROJECT" -f "$run/compose.yaml" down -v >/dev/null 2>&1

log "summary: image $((size / 1000)) kB, built in $build_time; upgrade under load: $load; crash-looping successor given up in $crash_time"
