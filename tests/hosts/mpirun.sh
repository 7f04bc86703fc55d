#!/usr/bin/env bash
# tests/hosts/mpirun.sh NAME N COMMAND...: mpirun on the two hosts of up.sh NAME, as on a cluster:
# started on host a (inside namespace NAMEa, under hostname NAMEa), N ranks from a hostfile naming
# both hosts with N/2 slots each (ranks 0..N/2-1 on host a), the remote daemon started through
# agent.sh (the stand-in for ssh), MPI's and Open MPI's own traffic pinned to the hosts' subnet over
# TCP, and the daemons' lifeline: TCP keepalive on their connections, so that a dead link ends them
# (README "Across hosts": the keepalive must notice later than --comm-timeout and before the rank's
# own exit, half the deadline later, at least 10 s; here 1 + 1 x 8 = 9 s against the tests' 5 s).
# HOSTS_KEEPALIVE="TIME INTVL PROBES" replaces those three (seconds, seconds, count).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
n=$1 np=$2
shift 2
read -r ka_time ka_intvl ka_probes <<<"${HOSTS_KEEPALIVE:-1 1 8}"
hostfile=$(mktemp)
trap 'rm -f "$hostfile"' EXIT
printf '192.0.2.1 slots=%d\n192.0.2.2 slots=%d\n' $((np / 2)) $((np - np / 2)) > "$hostfile"
export HOSTS_NAME=$n OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ip netns exec "${n}a" unshare --uts sh -c 'hostname "$0"; exec "$@"' "${n}a" \
    mpirun -q --oversubscribe --hostfile "$hostfile" -np "$np" \
    --mca plm_rsh_agent "$here/agent.sh" \
    --mca btl tcp,self --mca btl_tcp_if_include 192.0.2.0/24 --mca oob_tcp_if_include 192.0.2.0/24 \
    --mca oob_tcp_keepalive_time "$ka_time" --mca oob_tcp_keepalive_intvl "$ka_intvl" --mca oob_tcp_keepalive_probes "$ka_probes" \
    "$@"
