#!/usr/bin/env bats
# How comm.h's calls move a device backend's buffers (runtime/comm_device.c), without a GPU
# (tests/test_link.c: a fake device and a fake NCCL over MPI): the link's bootstrap order (rank 0
# makes the id, every member opens with it), every call's bits equal to the host path's, two ranks
# sending to each other at once without a deadlock; ranks sharing a device stage through the host.
load helpers

TL="$ROOT/build/tests/test_link"

@test "link: each group of ranks with devices of their own opens the link (id from its rank 0), and every call on device buffers gives the host path's bits (2, 3, 4 ranks)" {
    for np in 2 3 4; do
        run timeout -k 5 60 $MPIRUN $np "$TL" link
        echo "$output"
        [ "$status" -eq 0 ]
        [[ "$output" == *"ok: link, "* ]]
    done
}

@test "link: ranks that share a device open no link and stage every call through host memory, with the same bits" {
    run timeout -k 5 60 $MPIRUN 3 "$TL" shared
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"ok: shared, 0 link calls, 0 ids, 0 opens"* ]]
}
