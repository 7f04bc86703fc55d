#!/usr/bin/env bash
# tests/hosts/up.sh NAME: two hosts on this machine for tests/hosts.bats (needs root and iproute2).
# Network namespaces NAMEa and NAMEb joined by a veth pair (NAMEa0 <-> NAMEb0), host a at 192.0.2.1
# and host b at 192.0.2.2 (192.0.2.0/24: the documentation range, RFC 5737, never routed). Undone by
# down.sh NAME, which also ends every process left inside them. Does not start anything in them.
set -eu
n=$1
ip netns add "${n}a"
ip netns add "${n}b"
ip link add "${n}a0" netns "${n}a" type veth peer name "${n}b0" netns "${n}b"
ip -n "${n}a" addr add 192.0.2.1/24 dev "${n}a0"
ip -n "${n}b" addr add 192.0.2.2/24 dev "${n}b0"
for h in a b; do
    ip -n "$n$h" link set lo up
    ip -n "$n$h" link set "$n${h}0" up
done
