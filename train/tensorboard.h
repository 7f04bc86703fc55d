/* tensorboard.h — one TensorBoard event file (--tensorboard DIR): DIR/events.out.tfevents.SECONDS.HOST.PID,
 * TFRecord framing (little-endian uint64 length, masked CRC-32C of the length, the bytes, masked
 * CRC-32C of the bytes) around Event protos (train/tensorboard.proto, packed by protobuf-c; CRC-32C
 * by ISA-L, which picks the CPU's CRC instruction at run time). The file opens with the version
 * event "brain.Event:2" and a SessionLog START at the purge step: TensorBoard's reader then drops
 * every event of the directory's earlier files at that step or later (a resumed run's orphans; a
 * new run's step 0 drops a whole earlier run), as PyTorch's SummaryWriter(purge_step=) does.
 * Scalars are one Event per value, flushed by the caller after each metrics line.
 * Does not own: which scalars (train/metrics.h writes metrics.jsonl's numbers here), nor deleting
 * anything: earlier files stay, read through the purge. */
#ifndef TANDEM_TENSORBOARD_H
#define TANDEM_TENSORBOARD_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    FILE *f;          /* NULL: closed (a zeroed Tensorboard is closed, and every call on it a no-op) */
    char *path;       /* DIR/events.out.tfevents... */
    uint8_t *buf;     /* (cap) one packed Event, reused */
    size_t cap;
} Tensorboard;

/* --tensorboard DIR before any work: creates DIR (and its parents) and checks it can be written;
 * a user_error naming the flag and DIR otherwise. */
void tensorboard_check_dir(const char *dir);
/* Creates a new event file in DIR (whose name sorts after the files already there, which
 * TensorBoard reads in name order) and writes the version and the START at purge_step. A user_error
 * naming the file when it cannot be written. */
void tensorboard_open(Tensorboard *tb, const char *dir, int purge_step);
/* One scalar: Event{wall_time (now), step, summary{value{tag, simple_value}}}. */
void tensorboard_scalar(Tensorboard *tb, int step, const char *tag, float value);
/* Pushes the written records to the file (whole records after a kill); a failed write is a
 * user_error naming the file. */
void tensorboard_flush(Tensorboard *tb);
void tensorboard_close(Tensorboard *tb);
#endif
