/* safetensors.h — reading (mmap, bounds-checked) and writing safetensors files.
 * Owns: the file format, the sharded index (model.safetensors.index.json), dtype conversion
 * (F32/BF16/F16 -> the model's F32 or BF16). Does not know model names or sharding rules: callers ask
 * for a 2-D block [r0, r0+nr) x [c0, c0+nc) of a tensor, so each rank touches only its own bytes. */
#ifndef TANDEM_SAFETENSORS_H
#define TANDEM_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>
#include "kernels/kernels.h"   /* DType, bf16 conversions */

typedef enum { ST_F32 = 0, ST_BF16, ST_F16 } StDtype;

typedef struct {
    char *name;
    StDtype dtype;
    int ndim;
    int64_t shape[4];
    const uint8_t *data;   /* points into the file's mapping */
    int file;              /* index into SafeTensors.files */
} StTensor;

typedef struct {
    char *path;
    uint8_t *map;
    size_t size;
} StFile;

typedef struct {
    StFile *files;
    int n_files;
    StTensor *tensors;
    int n_tensors;
} SafeTensors;

/* Opens DIR/model.safetensors, or every file named by DIR/model.safetensors.index.json.
 * Any format problem (truncated file, bad header, offsets past the end, unsupported dtype,
 * index naming a missing file) is a user_error naming the file and tensor. */
SafeTensors *st_open_dir(const char *dir);
/* Opens one safetensors file (a PEFT adapter's adapter_model.safetensors), with the same checks. */
SafeTensors *st_open_file(const char *path);
void st_close(SafeTensors *st);
const StTensor *st_find(const SafeTensors *st, const char *name); /* NULL if absent */

/* Copies block rows [r0, r0+nr) x cols [c0, c0+nc) of tensor `name` into dst (nr, nc) as dtype dt
 * (F32 exactly, or BF16 rounded to nearest even; BF16 -> BF16 is a copy), then releases the mapped
 * pages of the rows read (their bytes now live in dst).
 * The tensor must have exactly the shape (rows, cols), or (rows) when cols == 0 (then c0 = 0,
 * nc = 1): a mismatch is a user_error naming the tensor and both shapes. Rows of the block at or
 * beyond `rows` (vocab padding) are zero-filled. */
void st_read_block(const SafeTensors *st, const char *name, int64_t rows, int64_t cols, int64_t r0,
                   int64_t nr, int64_t c0, int64_t nc, void *dst, DType dt);

/* Writing. Tensors are f32 in memory; stored as F32 or BF16. */
typedef struct {
    const char *name;
    int ndim;
    int64_t shape[2];
    const float *data;
} StWriteTensor;
/* Writes atomically (temp file + rename). Returns 0, or -1 with errno set. */
int st_write(const char *path, const StWriteTensor *t, int n, StDtype dtype);

/* The same, streamed: the header comes from the names and shapes (data ignored), then each
 * tensor's data in that order, so a writer never holds more than one tensor.
 * open: NULL with errno on failure. put: -1 with errno (later puts are no-ops, close fails).
 * close: 0 once the file is complete, fsync'ed and renamed into place, else -1 and no file
 * (the temp file is removed). Always frees w. */
typedef struct StWriter StWriter;
StWriter *st_writer_open(const char *path, const StWriteTensor *t, int n, StDtype dtype);
int st_writer_put(StWriter *w, const float *data, size_t numel);
int st_writer_close(StWriter *w);
#endif
