/* kv_cache.h — the paged KV cache's block pool: sizing it from a byte budget, handing out and
 * taking back blocks. The KVCache struct itself stays in runtime/model.h, because forward.c reads
 * and writes its blocks (and runtime/ does not include generate/).
 * Owns: the pool's size (the same on every rank), its memory and its free list.
 * Does not own: which sequence holds which blocks (engine.c's block tables), the layout of a block
 * (kv_store / kv_paged in the kernels). */
#ifndef TANDEM_KV_CACHE_H
#define TANDEM_KV_CACHE_H
#include "runtime/model.h"

/* Bytes one block of `block` token slots takes on this rank: keys and values of its pp stage's
 * layers and its tp rank's kv heads, m->kv_dtype's 4 or 2 bytes each. */
size_t kv_block_bytes(const Model *m, int block);
/* Sizes the pool from a byte budget per rank; n_blocks is the minimum over all ranks so every
 * rank's scheduler makes the same decisions. user_error if not even one block fits. */
void kv_init(KVCache *kv, const Model *m, size_t bytes, int block);
void kv_free(KVCache *kv);
int kv_block_alloc(KVCache *kv);             /* a free block id, or -1 */
void kv_block_release(KVCache *kv, int id);
#endif
