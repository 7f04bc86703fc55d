#!/usr/bin/env bash
# tests/hosts/down.sh NAME: undoes up.sh NAME: kills whatever still runs in the namespaces NAMEa and
# NAMEb (a test that failed half-way may leave mpirun, an orted or a rank there) and deletes them
# (the veth pair goes with them). Quiet and exit 0 when there is nothing to undo.
n=$1
for h in a b; do
    ip netns pids "$n$h" 2>/dev/null | xargs -r kill -9 2>/dev/null
done
for h in a b; do
    ip netns del "$n$h" 2>/dev/null
done
exit 0
