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
# keeps serving, its restart policy restored; if it took over and then
# stopped, the old one (draining towards its exit by then) is restarted.
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

# The old edge's own log says whether it gave its sockets away: from then
# on it is stopping, whatever becomes of the new one.
handed_over() { docker logs "$old" 2>&1 | grep -q 'handover: a new edge took the listening sockets'; }

# give_up removes the new container and restores the old one's restart
# policy. An old edge that has not handed over keeps serving; one that has
# is draining towards its exit and nothing else would serve after it, so it
# is restarted (it binds the ports itself once the new one has let them go).
give_up() {
	echo "the new edge did not take over or did not stay up (see: docker logs $new)" >&2
	if [ -n "$new" ]; then docker rm -f "$new" >/dev/null; fi
	docker update --restart="$policy" "$old" >/dev/null
	if handed_over; then
		echo "$old had handed over already: restarting it" >&2
		docker restart "$old" >/dev/null
	else
		echo "keeping $old" >&2
	fi
	exit 1
}

i=0
while running "$old"; do
	if [ -z "$new" ] || ! running "$new" || [ "$i" -ge "$timeout" ]; then
		give_up
	fi
	i=$((i + 1))
	sleep 1
done
running "$new" || give_up

code=$(docker inspect -f '{{.State.ExitCode}}' "$old")
if [ "$code" != 0 ]; then
	echo "the old edge exited $code (see: docker logs $old); it is left for inspection" >&2
	exit 1
fi
docker rm "$old" >/dev/null
echo "upgraded: $old handed over to $new and exited 0"
echo "check: curl -s 127.0.0.1:9180/readyz; curl -s 127.0.0.1:9180/metrics | grep scafo_edge_handovers_total"
