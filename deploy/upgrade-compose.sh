#!/bin/sh
# Replace the edge container of the compose project (deploy/compose.yaml)
# without refusing a connection.
#
#   docker compose -p scafo-edge -f deploy/compose.yaml build   # or pull
#   deploy/upgrade-compose.sh
#
# A second edge container starts next to the running one, on the same state
# volume and the host's network; it takes the running edge's listening
# sockets over <state-dir>/handover.sock, and the old container drains and
# exits 0 by itself (within --shutdown-timeout), after which it is removed.
# If the new container does not take over, it is removed and the old one
# keeps serving, its restart policy restored.
#
# Environment: SCAFO_EDGE_PROJECT (default scafo-edge), SCAFO_EDGE_COMPOSE_FILE
# (default compose.yaml next to this script), SCAFO_EDGE_UPGRADE_TIMEOUT in
# seconds for the old container to exit (default 60: the 30s shutdown timeout
# and the new edge's start).
set -eu

project=${SCAFO_EDGE_PROJECT:-scafo-edge}
file=${SCAFO_EDGE_COMPOSE_FILE:-$(dirname "$0")/compose.yaml}
timeout=${SCAFO_EDGE_UPGRADE_TIMEOUT:-60}

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
compose up -d --no-deps --no-recreate --scale edge=2 edge
new=$(compose ps -q edge | grep -v "^$old" | head -n 1)
echo "started $new; waiting for $old to hand over and drain"

i=0
while running "$old"; do
	if [ -z "$new" ] || ! running "$new" || [ "$i" -ge "$timeout" ]; then
		echo "the new edge did not take over (see: docker logs $new); keeping $old" >&2
		[ -n "$new" ] && docker rm -f "$new" >/dev/null
		docker update --restart="$policy" "$old" >/dev/null
		exit 1
	fi
	i=$((i + 1))
	sleep 1
done

code=$(docker inspect -f '{{.State.ExitCode}}' "$old")
if [ "$code" != 0 ]; then
	echo "the old edge exited $code (see: docker logs $old); it is left for inspection" >&2
	exit 1
fi
docker rm "$old" >/dev/null
echo "upgraded: $old handed over to $new and exited 0"
echo "check: curl -s 127.0.0.1:9180/readyz; curl -s 127.0.0.1:9180/metrics | grep scafo_edge_handovers_total"
