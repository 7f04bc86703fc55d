/* checkpoint.h — saving a model held on a TP x PP x DP mesh as a Hugging Face directory.
 * Owns: gathering each tensor's tp shards into the full HF tensor (each shard copied out of the
 * model's backend memory one tensor at a time, to_host; placement from model_param_infos,
 * padded vocab rows stripped, one copy of each replicated tensor), the directory layout, and the
 * atomic publish of the directory. Does not own: the safetensors format (runtime/safetensors.c), the
 * sharding rules (runtime/model.c), nor the training state (the optimizer's, train/optim_state.c,
 * which writes its tensors through checkpoint_save_tensors; RNG, data cursor).
 *
 * Layout of a saved directory (pp = P pipeline stages, stage s counted from 1):
 *     config.json                         src_dir's config.json, only "torch_dtype" set to "float32"
 *     model-0000s-of-0000P.safetensors    stage s's tensors, full (un-sharded), F32, HF names
 *     model.safetensors.index.json        {"metadata": {"total_size"}, "weight_map": name -> file}
 *     tokenizer.model, tokenizer.json, ... copies of those present in src_dir (CHECKPOINT_COPY_FILES)
 * Tied embeddings: only model.embed_tokens.weight is written (no lm_head.weight), as HF does; with
 * pp > 1 the first stage writes it and the last stage's copy of the table is not written.
 * Why "float32": the tensors are stored in F32 (what training holds; a bf16 source reloads
 * bit-identically), and torch_dtype="auto" loaders take the config's word for the stored dtype.
 * Load with torch_dtype=torch.bfloat16 to get a bf16 model. */
#ifndef TANDEM_CHECKPOINT_H
#define TANDEM_CHECKPOINT_H
#include "runtime/model.h"

/* Besides config.json, the files copied from src_dir when present (tokenizers, generation defaults). */
#define CHECKPOINT_COPY_FILES                                                                         \
    "tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",         \
        "added_tokens.json", "vocab.json", "merges.txt", "generation_config.json"

/* Writes m (every stage, every tp shard) as an HF directory out_dir that transformers'
 * AutoModelForCausalLM loads. Collective: every rank of m->mesh calls it with the same arguments.
 * The tensors are stored in dtype (DTYPE_AUTO: the model's own; a bf16 model saved as F32 is its
 * exact upcast, an fp32 one saved as BF16 is rounded to nearest even) and config.json's torch_dtype
 * says which. src_dir is the directory m was loaded from (config.json and tokenizer files are copied from it;
 * out_dir may be src_dir itself when overwrite is set).
 * Atomic: rank 0 creates out_dir.tmp.<its pid>, the tp rank 0 of dp rank 0 of each stage writes its
 * stage file there, and rank 0 renames the finished directory to out_dir (atomically swapped with
 * an existing out_dir when overwrite is set; the old one is then deleted). out_dir must be on a
 * filesystem every writing rank sees.
 * User errors (one line from rank 0, the job exits, nothing written): out_dir exists and overwrite
 * is 0; out_dir exists but is not a model directory (no config.json), overwrite or not;
 * src_dir/config.json unreadable.
 * Returns 0 on every rank, or -1 on every rank when a write failed (disk full, a file-size limit,
 * permissions): err (CHECKPOINT_ERR_CAP bytes on every rank) then holds the one line that says which
 * file and why (the lowest failing rank's, without "tandem: "), printed by nobody; the temp directory
 * is removed and out_dir is left as it was. The caller stops the run (job_error). */
#define CHECKPOINT_ERR_CAP 4608   /* a PATH_MAX path and its reason */
int checkpoint_save_model(const Model *m, const char *src_dir, const char *out_dir, int overwrite, DType dtype,
                          char *err);

/* Where checkpoint_save_tensors takes each tensor from: shard(ctx, in) is called on every rank of
 * the mesh for every tensor of model_param_infos, in that order (so a source may gather over dp in
 * it), and returns this rank's shard of `in` as fp32 host memory (in->numel floats, valid until the
 * next call) on the ranks that send or write it: dp rank 0, tp ranks with tp_rank % in->replicas
 * == 0. Elsewhere it may return NULL. The weights are one source (checkpoint_save_model's), the
 * optimizer's moments and master others (train/optim_state.c). */
typedef struct {
    const float *(*shard)(void *ctx, const ParamInfo *in);
    void *ctx;
} ShardSource;

/* Writes src's tensors into the existing directory dir as checkpoint_save_model writes the weights
 * (model-0000s-of-0000P.safetensors per stage, stored as dtype, and model.safetensors.index.json:
 * full HF shapes and names, padded vocab rows dropped, one copy of each replica, no tied lm_head),
 * nothing else. Collective over the mesh. Returns 0 on every rank, or -1 on every rank with the
 * failed write's line in err (CHECKPOINT_ERR_CAP bytes, as checkpoint_save_model's). */
int checkpoint_save_tensors(const Model *m, const ShardSource *src, const char *dir, DType dtype, char *err);
#endif
