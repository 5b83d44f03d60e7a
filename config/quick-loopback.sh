#!/bin/sh
# Make every TCP connection over this machine's loopback acknowledge what it reads at once.
#
# ovos-messagebus writes with Nagle's algorithm on (tornado clears TCP_NODELAY after the
# websocket upgrade) and echoes every message to every client, so a bus client's delayed ACK
# of one message holds the bus's next message to it for up to 40 ms. On an OVOS hub that is
# ovos-core's own connection: a skill's answer that needs a second message from the bus (an
# audio end, a get_response answer, the next utterance soon after the last answer) waits for
# that timer. No client can fix this for another (hivemind_chat_agent/hub/bus_socket.py fixes
# it for the OVOS mode's own connection); the route's `quickack` attribute (Linux 3.11+) does
# it for every connection on the route. docs/performance.md measures it (a genuine ovos-core's
# "hello world" through the OVOS mode: 55 ms -> 14 ms).
#
#     sudo sh config/quick-loopback.sh        # on; run again at each boot (a oneshot unit)
#     sudo sh config/quick-loopback.sh off    # back to the kernel's own routes
#
# The cost: one ACK segment per segment read on loopback, instead of one per two or per timer.
set -eu
case "${1:-on}" in
    on) quickack="quickack 1" ;;
    off) quickack="" ;;
    *) echo "usage: $0 [on|off]" >&2; exit 2 ;;
esac
for destination in 127.0.0.0/8 127.0.0.1; do
    # shellcheck disable=SC2086  # $quickack is two words or none
    ip route replace local "$destination" dev lo table local proto kernel scope host \
        src 127.0.0.1 $quickack
done
ip route show table local dev lo | grep '^local'
