/* records.h — internal to train/: the reading half of Data (records.c), called by data_open in
 * data.c. Not a public API: callers use train/data.h, which also specifies the file and record
 * formats implemented here. */
#ifndef TANDEM_RECORDS_H
#define TANDEM_RECORDS_H
#include "train/data.h"

/* Reads path and tokenizes every record into d (formats, bad-record and over-long policies: see
 * data.h). Expects d zeroed but for d->path (a copy of path, named in errors) and d->cfg (= *cfg).
 * Fills d->sample_off, ids, mask, sample_line, margin, n_samples and d->stats' record, bad,
 * truncated, dropped, token and loss-token counts; leaves n_samples / n_pairs in stats, group and
 * the iteration state to data_open. cfg's key and chat_template strings are used only here. Bad
 * input: user_error naming path:line (a bad record is counted instead with skip_bad_records); a bad
 * chat_template name fails before any record is read. */
void records_load(Data *d, const char *path, Tokenizer *t, const DataConfig *cfg);
#endif
