#!/usr/bin/env bash
# Replace the edge container of the compose project (deploy/compose.yaml)
# without refusing a connection.
#
#   docker compose -p scafo-edge -f deploy/compose.yaml build   # or pull
#   deploy/upgrade-compose.sh
#
# Needs the Docker Compose v2 plugin (`docker compose`, not the Python
# `docker-compose` 1.x, whose flags differ): the script checks for it first.
#
# A second edge container starts next to the running one, on the same state
# volume and the host's network; it takes the running edge's listening
# sockets over <state-dir>/handover.sock, and the old container drains and
# exits 0 by itself (within --shutdown-timeout), after which it is removed.
# If the new container does not take over, it is removed and the old one
# keeps serving, its restart policy restored; if it took over and then
# stopped, the old one (draining towards its exit by then) is restarted.
# A new container that crashes (restarted by its restart policy, exited, or
# unhealthy) is given up on at once, not at the timeout, and its log is saved
# to a file the message names before it is removed.
#
# Environment: SCAFO_EDGE_PROJECT (default scafo-edge), SCAFO_EDGE_COMPOSE_FILE
# (default compose.yaml next to this script), SCAFO_EDGE_UPGRADE_TIMEOUT in
# seconds for the old container to exit (default 60: the 30s shutdown timeout
# and the new edge's start), SCAFO_EDGE_UPGRADE_LOG_DIR for the failed
# container's saved log (default $TMPDIR or /tmp).
set -euo pipefail

project=${SCAFO_EDGE_PROJECT:-scafo-edge}
file=${SCAFO_EDGE_COMPOSE_FILE:-$(dirname "$0")/compose.yaml}
timeout=${SCAFO_EDGE_UPGRADE_TIMEOUT:-60}
logdir=${SCAFO_EDGE_UPGRADE_LOG_DIR:-${TMPDIR:-/tmp}}

# Compose v1 (Debian's docker-compose 1.29) or no Compose at all fails later
# with a confusing `unknown shorthand flag: 'p'`: say what is missing first.
if ! command -v docker >/dev/null 2>&1; then
	echo "upgrade-compose.sh needs the docker CLI with the Compose v2 plugin; docker is not on PATH" >&2
	exit 1
fi
# A Compose built from source may call itself "dev": only 1.x is refused.
if ! cv=$(docker compose version --short 2>/dev/null) || [[ $cv =~ ^v?1\. ]]; then
	said=${cv:+says $cv}
	echo "upgrade-compose.sh needs the Docker Compose v2 plugin ('docker compose version' ${said:-fails}): install docker-compose-plugin, or put a Compose v2 binary at ~/.docker/cli-plugins/docker-compose" >&2
	exit 1
fi

compose() { docker compose -p "$project" -f "$file" "$@"; }
running() { [ "$(docker inspect -f '{{.State.Running}}' "$1" 2>/dev/null)" = true ]; }

old=$(compose ps -q edge)
case "$old" in
"") echo "no running edge container in project $project: start it with 'docker compose up -d'" >&2; exit 1 ;;
*[!0-9a-f]*) echo "more than one edge container in project $project: finish or clean up the last upgrade first" >&2; exit 1 ;;
esac
policy=$(docker inspect -f '{{.HostConfig.RestartPolicy.Name}}' "$old")

# The old edge's exit after the handover is final: a restart policy must not
# start it again, where it would take the sockets back.
docker update --restart=no "$old" >/dev/null
# -a: a new container that has exited already is still found.
second() { compose ps -aq edge | grep -v "^$old" | head -n 1 || true; }

# The old edge's own log says whether it gave its sockets away: from then
# on it is stopping, whatever becomes of the new one. grep reads to the end
# (no -q): stopping at the first match would kill docker logs with SIGPIPE,
# and pipefail would read that as "not handed over".
handed_over() { docker logs "$old" 2>&1 | grep -F 'handover: a new edge took the listening sockets' >/dev/null; }

# crashed says why the new container is failing, or fails if it looks fine.
# .State.Running alone cannot tell: with restart: unless-stopped it is true
# again a moment after each crash, so a crash-looping edge would look up
# until the timeout. A restart, an exit or a failed healthcheck is final.
crashed() {
	local state status restarts code health
	state=$(docker inspect -f '{{.State.Status}} {{.RestartCount}} {{.State.ExitCode}} {{if .State.Health}}{{.State.Health.Status}}{{end}}' "$1" 2>/dev/null) ||
		{ echo "it is gone"; return 0; }
	read -r status restarts code health <<<"$state"
	if [ "${restarts:-0}" -gt 0 ]; then
		echo "it crashed and was restarted $restarts time(s) by its restart policy (last exit code $code)"
	elif [ "$status" != running ]; then
		echo "it is $status with exit code $code"
	elif [ "${health:-}" = unhealthy ]; then
		echo "its healthcheck says unhealthy"
	else
		return 1
	fi
}

# keep_logs saves the new container's log (every run of it, crashes
# included) before it is removed, and prints the file's name.
# It fails if the log could not be saved. The file is made by mktemp,
# readable by its owner only: a predictable name in a shared /tmp could be
# a planted symlink.
keep_logs() {
	local out
	mkdir -p "$logdir" &&
		out=$(umask 077 && mktemp "$logdir/scafo-edge-upgrade-${1:0:12}-$(date -u +%Y%m%dT%H%M%SZ)-XXXXXX.log") &&
		docker logs "$1" >"$out" 2>&1 &&
		echo "$out"
}

# give_up removes the new container, keeping its log, and restores the old
# one's restart policy. An old edge that has not handed over keeps serving;
# one that has is draining towards its exit and nothing else would serve
# after it, so it is restarted (it binds the ports itself once the new one
# has let them go).
give_up() {
	# Every step below must run whatever the one before did: the old edge's
	# restart policy has to come back on every path.
	set +e
	echo "the new edge ${new:-(none started)} did not take over or did not stay up: $1" >&2
	if [ -n "$new" ]; then
		# Stop it first so that the saved log is complete and a restart
		# policy cannot start it again between the save and the removal.
		docker update --restart=no "$new" >/dev/null 2>&1
		docker stop -t 5 "$new" >/dev/null 2>&1
		if saved=$(keep_logs "$new"); then
			echo "its log (docker logs, every start of it) is saved in $saved; removing it" >&2
			docker rm -f "$new" >/dev/null 2>&1
		else
			echo "its log could not be saved in $logdir: kept it stopped, see docker logs $new" >&2
		fi
	fi
	docker update --restart="$policy" "$old" >/dev/null
	if handed_over; then
		echo "$old had handed over already: restarting it" >&2
		docker restart "$old" >/dev/null
	else
		echo "keeping $old" >&2
	fi
	exit 1
}

new=""
if ! compose up -d --no-deps --no-recreate --scale edge=2 edge; then
	new=$(second)
	give_up "docker compose up failed"
fi
new=$(second)
echo "started ${new:-nothing}; waiting for $old to hand over and drain"
[ -n "$new" ] || give_up "compose started no second edge container"
# One look a second, so the count of looks is the seconds waited.
i=0
while running "$old"; do
	if why=$(crashed "$new"); then
		give_up "$why"
	fi
	if [ "$i" -ge "$timeout" ]; then
		give_up "$old was still running after ${timeout}s (SCAFO_EDGE_UPGRADE_TIMEOUT)"
	fi
	i=$((i + 1))
	sleep 1
done
if why=$(crashed "$new"); then
	give_up "$why"
fi

code=$(docker inspect -f '{{.State.ExitCode}}' "$old")
if [ "$code" != 0 ]; then
	echo "the old edge exited $code (see: docker logs $old); it is left for inspection" >&2
	exit 1
fi
docker rm "$old" >/dev/null
echo "upgraded: $old handed over to $new and exited 0"
echo "check: curl -s 127.0.0.1:9180/readyz; curl -s 127.0.0.1:9180/metrics | grep scafo_edge_handovers_total"
