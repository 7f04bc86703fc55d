/* tensorboard.c — see tensorboard.h. */
#include "train/tensorboard.h"
#include "train/tensorboard.pb-c.h"   /* generated from train/tensorboard.proto (Makefile) */
#include "runtime/util.h"
#include <dirent.h>
#include <errno.h>
#include <isa-l/crc.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EVENTS_PREFIX "events.out.tfevents."

/* TFRecord's checksum: CRC-32C (Castagnoli; ISA-L's crc32_iscsi, which takes and returns the
 * register without the final inversion), rotated right by 15 and offset, so that the CRC of bytes
 * that hold a CRC is not trivially related to it. */
static uint32_t masked_crc32c(const uint8_t *p, size_t n) {
    CHECK(n <= INT_MAX);
    uint32_t crc = ~crc32_iscsi((unsigned char *)p, (int)n, 0xffffffffu);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* One record: length, its CRC, the packed Event, its CRC. A failed fwrite sticks (ferror) and is
 * reported at the next flush. */
static void write_event(Tensorboard *tb, const Tensorboard__Event *ev) {
    size_t n = tensorboard__event__get_packed_size(ev);
    if (n > tb->cap) {
        tb->buf = xrealloc(tb->buf, n);
        tb->cap = n;
    }
    CHECK(tensorboard__event__pack(ev, tb->buf) == n);
    uint8_t head[12], tail[4];
    put_le(head, n, 8);
    put_le(head + 8, masked_crc32c(head, 8), 4);
    put_le(tail, masked_crc32c(tb->buf, n), 4);
    fwrite(head, 1, sizeof head, tb->f);
    fwrite(tb->buf, 1, n, tb->f);
    fwrite(tail, 1, sizeof tail, tb->f);
}

void tensorboard_check_dir(const char *dir) {
    int bad = mkdir_parents(dir) != 0 || (mkdir(dir, 0755) != 0 && errno != EEXIST);
    if (!bad && !dir_exists(dir)) bad = 1, errno = ENOTDIR;
    if (!bad && access(dir, W_OK | X_OK) != 0) bad = 1;
    if (bad) user_error("--tensorboard %s: cannot create or write the directory: %s", dir, strerror(errno));
}

/* The newest SECONDS among DIR's event files (0: none). TensorBoard reads a directory's files in
 * name order, so a new file must sort after them even when a run resumes within the second its
 * previous file was named in. */
static long newest_seconds(const char *dir) {
    long newest = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, EVENTS_PREFIX, strlen(EVENTS_PREFIX))) continue;
        long s = strtol(e->d_name + strlen(EVENTS_PREFIX), NULL, 10);
        if (s > newest) newest = s;
    }
    closedir(d);
    return newest;
}

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void tensorboard_open(Tensorboard *tb, const char *dir, int purge_step) {
    memset(tb, 0, sizeof *tb);
    tensorboard_check_dir(dir);
    long sec = (long)time(NULL), newest = newest_seconds(dir);
    if (sec <= newest) sec = newest + 1;
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) strcpy(host, "localhost");
    char name[512];
    snprintf(name, sizeof name, EVENTS_PREFIX "%ld.%s.%d", sec, host, (int)getpid());
    tb->path = path_join(dir, name);
    tb->f = fopen(tb->path, "wb");
    if (!tb->f) user_error("--tensorboard: %s: cannot open for writing: %s", tb->path, strerror(errno));

    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_seconds();
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = (char *)"brain.Event:2";   /* version 2: readers purge on SessionLog START */
    write_event(tb, &ev);
    Tensorboard__SessionLog start = TENSORBOARD__SESSION_LOG__INIT;
    start.status = TENSORBOARD__SESSION_LOG__SESSION_STATUS__START;
    ev.step = purge_step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SESSION_LOG;
    ev.session_log = &start;
    write_event(tb, &ev);
    tensorboard_flush(tb);
}

void tensorboard_scalar(Tensorboard *tb, int step, const char *tag, float value) {
    if (!tb->f) return;
    Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag;
    v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    v.simple_value = value;
    Tensorboard__Summary__Value *values[1] = {&v};
    Tensorboard__Summary s = TENSORBOARD__SUMMARY__INIT;
    s.n_value = 1;
    s.value = values;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_seconds();
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &s;
    write_event(tb, &ev);
}

void tensorboard_flush(Tensorboard *tb) {
    if (tb->f && (fflush(tb->f) != 0 || ferror(tb->f)))
        user_error("--tensorboard: %s: cannot write: %s", tb->path, strerror(errno));
}

void tensorboard_close(Tensorboard *tb) {
    if (tb->f) {
        int failed = ferror(tb->f);
        if (fclose(tb->f) != 0 || failed) user_error("--tensorboard: %s: cannot write: %s", tb->path, strerror(errno));
    }
    free(tb->path);
    free(tb->buf);
    memset(tb, 0, sizeof *tb);
}
