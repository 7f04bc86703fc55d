#!/usr/bin/env bash
# tests/hosts/agent.sh HOST COMMAND...: Open MPI's launcher agent (--mca plm_rsh_agent) for the two
# hosts of up.sh, standing in for ssh: runs COMMAND (words joined as ssh joins them, run by sh) on
# HOST, that is inside the network namespace $HOSTS_NAME plus a or b (192.0.2.1 or 192.0.2.2), under
# a hostname of its own (unshare --uts) so that Open MPI sees another node.
set -eu
case "$1" in
    192.0.2.1) h=a ;;
    192.0.2.2) h=b ;;
    *) echo "tests/hosts/agent.sh: unknown host $1 (192.0.2.1 or 192.0.2.2)" >&2; exit 255 ;;
esac
shift
exec ip netns exec "${HOSTS_NAME}$h" unshare --uts sh -c "hostname ${HOSTS_NAME}$h; exec $*"
