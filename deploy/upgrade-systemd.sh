#!/bin/sh
# Replace the running scafo-edge@ instance (deploy/scafo-edge@.service) with
# a new binary without refusing a connection.
#
#   sudo deploy/upgrade-systemd.sh ./scafo-edge
#
# The binary is installed over /usr/local/bin/scafo-edge (the running
# process keeps the file it started from), the other instance is started and
# takes the running one's listening sockets over the handover socket, and
# the running one drains and exits 0 by itself. The new instance is then
# the one enabled at boot. If it does not take over, it is stopped and the
# old one keeps serving; the previous binary is put back. If it took over and
# then stopped, the old one (draining towards its exit by then) is restarted
# on the previous binary.
set -eu

bin=${1:?usage: upgrade-systemd.sh NEW_BINARY}
timeout=${SCAFO_EDGE_UPGRADE_TIMEOUT:-60}

if systemctl is-active --quiet scafo-edge@blue; then
	old=blue new=green
elif systemctl is-active --quiet scafo-edge@green; then
	old=green new=blue
else
	echo "neither scafo-edge@blue nor scafo-edge@green is running: start one with 'systemctl enable --now scafo-edge@blue'" >&2
	exit 1
fi

# The old instance's own log says whether it gave its sockets away: from
# then on it is stopping, whatever becomes of the new one.
invocation=$(systemctl show -p InvocationID --value "scafo-edge@$old")
handed_over() {
	journalctl -q -o cat "_SYSTEMD_INVOCATION_ID=$invocation" | grep -q 'handover: a new edge took the listening sockets'
}

# give_up stops the new instance and puts the previous binary back. An old
# instance that has not handed over keeps serving; one that has is draining
# towards its exit and nothing else would serve after it, so it is restarted
# (it binds the ports itself once the new one has let them go).
give_up() {
	echo "scafo-edge@$new did not take over or did not stay up (journalctl -u scafo-edge@$new)" >&2
	systemctl stop "scafo-edge@$new" || true
	install -m 0755 /usr/local/bin/scafo-edge.previous /usr/local/bin/scafo-edge
	if handed_over; then
		echo "scafo-edge@$old had handed over already: restarting it on the previous binary" >&2
		systemctl restart "scafo-edge@$old"
	else
		echo "keeping scafo-edge@$old" >&2
	fi
	exit 1
}

cp -p /usr/local/bin/scafo-edge /usr/local/bin/scafo-edge.previous
install -m 0755 "$bin" /usr/local/bin/scafo-edge
systemctl start "scafo-edge@$new"
echo "started scafo-edge@$new; waiting for scafo-edge@$old to hand over and drain"

i=0
while systemctl is-active --quiet "scafo-edge@$old"; do
	if ! systemctl is-active --quiet "scafo-edge@$new" || [ "$i" -ge "$timeout" ]; then
		give_up
	fi
	i=$((i + 1))
	sleep 1
done
systemctl is-active --quiet "scafo-edge@$new" || give_up

if [ "$(systemctl show -p ExecMainStatus --value "scafo-edge@$old")" != 0 ]; then
	echo "scafo-edge@$old did not exit 0 (journalctl -u scafo-edge@$old)" >&2
	exit 1
fi
systemctl enable --quiet "scafo-edge@$new"
systemctl disable --quiet "scafo-edge@$old"
echo "upgraded: scafo-edge@$old handed over to scafo-edge@$new and exited 0"
