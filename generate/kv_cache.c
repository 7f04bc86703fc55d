/* kv_cache.c — the paged KV block pool (see kv_cache.h): the pool in the backend's memory, its free
 * list on the host. */
#include "generate/kv_cache.h"
#include "runtime/util.h"
#include <stdlib.h>
#include <string.h>

size_t kv_block_bytes(const Model *m, int block) {
    size_t kvd = (size_t)m->n_heads_kv_local * m->cfg.head_dim;
    return 2 * (size_t)m->n_layers_local * block * kvd * dtype_size(m->kv_dtype);
}

void kv_init(KVCache *kv, const Model *m, size_t bytes, int block) {
    memset(kv, 0, sizeof(*kv));
    size_t kvd = (size_t)m->n_heads_kv_local * m->cfg.head_dim;
    size_t per_block = kv_block_bytes(m, block);
    float nb = (float)(bytes / per_block);
    comm_all_reduce_max(&m->mesh->group, (nb = -nb, &nb), 1);   /* the minimum over ranks */
    kv->n_blocks = (int)-nb;
    if (kv->n_blocks < 1)
        user_error("--kv-cache-mem: %.2f MiB holds no %d-token block (%.3f MiB per block on the largest stage)",
                   bytes / 1048576.0, block, per_block / 1048576.0);
    kv->be = m->be;
    kv->block = block;
    kv->dtype = m->kv_dtype;
    kv->layer_stride = (size_t)kv->n_blocks * block * kvd;
    kv->k = m->be->alloc(dtype_size(kv->dtype) * kv->layer_stride * m->n_layers_local);   /* (L_local, n_blocks, Hkv_local, block, Dh) */
    kv->v = m->be->alloc(dtype_size(kv->dtype) * kv->layer_stride * m->n_layers_local);   /* (L_local, n_blocks, Hkv_local, block, Dh) */
    kv->free_ids = xmalloc(sizeof(int) * kv->n_blocks);
    for (int i = 0; i < kv->n_blocks; i++) kv->free_ids[i] = kv->n_blocks - 1 - i;
    kv->n_free = kv->n_blocks;
}

void kv_free(KVCache *kv) {
    kv->be->free(kv->k);
    kv->be->free(kv->v);
    free(kv->free_ids);
    memset(kv, 0, sizeof(*kv));
}

int kv_block_alloc(KVCache *kv) { return kv->n_free ? kv->free_ids[--kv->n_free] : -1; }

void kv_block_release(KVCache *kv, int id) {
    CHECK(id >= 0 && id < kv->n_blocks && kv->n_free < kv->n_blocks);
    kv->free_ids[kv->n_free++] = id;
}
