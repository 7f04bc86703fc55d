/* learner.c — see learner.h. */
#include "train/learner.h"
#include "runtime/lora.h"
#include <errno.h>
#include <sys/stat.h>
#include "runtime/comm.h"
#include "runtime/util.h"
#include "train/checkpoint.h"
#include "train/optim_state.h"
#include "train/schedule.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ZeRO-2: a layer's gradient of one micro-batch is complete: to the owners of its slices */
static void reduce_layer(GradSink *g, int l) {
    Optim *o = g->ctx;
    optim_reduce_unit(o, optim_layer_unit(o, l));
}

/* ZeRO-2: the gradients as tensors in the optimizer's unit buffers: every layer in the layers' one
 * buffer (model_layer_place's packing; at ep > 1 without the routed experts, which are in the layer's
 * experts' unit's buffer: moe_ep_fold_grads adds the step's sources there, reduced by optim_step),
 * each other tensor in its own unit's */
static void place_unit_grads(Learner *L) {
    const Optim *o = L->opt;
    Model *m = L->m;
    ModelWeights *w = &L->sink.w;
    void **field[] = {&w->embed, &w->final_norm, &w->lm_head, &w->score};
    void *const own[] = {m->w.embed, m->w.final_norm, m->w.lm_head, m->w.score};
    for (int f = 0; f < 4; f++) {
        if (!own[f]) continue;
        size_t off = (size_t)((char *)own[f] - (char *)m->params) / dtype_size(m->dtype);
        int u = 0;
        while (u < o->n_units && !(o->units[u].t0 >= 0 && o->ranges[o->units[u].t0].lo == off)) u++;
        CHECK(u < o->n_units);
        *field[f] = optim_unit_grads(o, u);   /* a tied lm_head on the embedding's stage: the same unit */
    }
    for (int l = 0; l < m->n_layers_local; l++) {   /* each tensor to its unit's buffer (ep > 1: the experts') */
        float *base = optim_unit_grads(o, optim_layer_unit(o, l));
        model_layer_place(m, base, DTYPE_F32, &L->gl[l], NULL);
        void **f = (void **)&L->gl[l];
        for (size_t k = 0; k < sizeof(LayerWeights) / sizeof(void *); k++)
            if (f[k]) f[k] = optim_layer_tensor_grads(o, l, (size_t)((float *)f[k] - base));
    }
    L->sink.layer_done = reduce_layer;
    L->sink.ctx = L->opt;
}

/* HF's load-balancing loss coefficient: an LM head of a MoE model whose config.json says
 * output_router_logits (as transformers' *ForCausalLM adds it to the loss), else 0 */
static float learner_moe_aux(const Model *m) {
    const ModelConfig *c = &m->cfg;
    return c->moe != MOE_NONE && c->output_router_logits && m->head == HEAD_LM ? c->router_aux_coef : 0.0f;
}

/* r's routing statistics (learner.h: moe_load_max / _min, moe_balance, moe_tokens, moe_z) from the
 * slots' sums, summed over the mesh (collective; every tp rank counts the same routing, a factor tp
 * taken out; each pp stage its own layers). The balance loss E sum_e f_e P_e with f_e = n_e / T,
 * P_e = S_e / T, T = sum_e n_e / k (tokens x layers), n_e the choices of e, S_e its summed
 * probability: HF's load_balancing_loss_func over the step's routing at once. */
static void learner_moe_load(Learner *L, LearnerStep *r, int M) {
    r->moe_load_max = r->moe_load_min = r->moe_balance = r->moe_z = 0.0f;
    r->moe_tokens = NULL;
    r->moe_n_experts = 0;
    const Model *m = L->m;
    int E = m->cfg.n_experts, k = m->cfg.n_experts_tok;
    if (m->cfg.moe == MOE_NONE) return;
    double *n = xcalloc(2 * (size_t)E + 1, sizeof(double)), tot = 0.0, mx = 0.0, mn = INFINITY, bal = 0.0;
    for (int i = 0; i < L->n_slots; i++) {
        for (int e = 0; e < 2 * E; e++) n[e] += L->slots[i].moe_load[e];
        n[2 * E] += L->slots[i].moe_z_sum;
    }
    comm_all_reduce_sum_f64(&m->mesh->group, n, 2 * (size_t)E + 1);
    for (int e = 0; e < E; e++) { tot += n[e]; mx = n[e] > mx ? n[e] : mx; mn = n[e] < mn ? n[e] : mn; }
    for (int e = 0; e < E; e++) bal += n[e] * n[E + e];
    for (int e = 0; e < E; e++) L->moe_tokens[e] = n[e] / m->mesh->tp;
    if (tot > 0) {
        r->moe_load_max = (float)(mx * E / tot);
        r->moe_load_min = (float)(mn * E / tot);
        r->moe_balance = (float)(E * bal / ((tot / k) * (tot / k)));
    }
    r->moe_tokens = L->moe_tokens;
    r->moe_n_experts = E;
    if (L->moe_z_coef != 0.0f)   /* the mean over layers and micro-batches of each dp rank, then over dp */
        r->moe_z = (float)(n[2 * E] / ((double)m->mesh->tp * m->mesh->dp * M * m->cfg.n_layers));
    free(n);
}

void learner_init(Learner *L, Model *m, OptimConfig oc, int max_tokens, int max_seq, int n_micro, int flags) {
    memset(L, 0, sizeof *L);
    L->m = m;
    L->save_dtype = DTYPE_AUTO;
    if (m->lora) {   /* LoRA: the adapters alone are trained; the base has no gradients and no moments */
        const Lora *lo = m->lora;
        OptimSet set = {lo->infos, lo->n_infos, lo->arena, lo->n, DTYPE_F32};
        OptimConfig ao = oc;
        if (ao.zero > 1) ao.zero = 1;   /* the adapters' gradients are small: ZeRO-2/3 shard their state as ZeRO-1 */
        L->opt = optim_new_set(m, &set, m->mesh, ao);
    } else {
        L->opt = optim_new(m, m->mesh, oc);
    }
    if (learner_moe_aux(m) != 0.0f && m->mesh->pp > 1)
        user_error("--pp %d: the router's load-balancing loss (config.json output_router_logits, model_type %s) needs "
                   "every layer's routing on one stage: pp 1 only for now", m->mesh->pp, m->cfg.model_type);
    L->n_slots = m->mesh->pp < n_micro ? m->mesh->pp : n_micro;
    L->slots = xcalloc(L->n_slots, sizeof(TrainActs));
    for (int i = 0; i < L->n_slots; i++) train_acts_init(&L->slots[i], m, max_tokens, max_seq, flags);
    L->gl = xcalloc(m->n_layers_local, sizeof(LayerWeights));
    if (m->cfg.moe != MOE_NONE) L->moe_tokens = xcalloc((size_t)m->cfg.n_experts, sizeof(double));
    if (m->lora) {   /* every base tensor NULL: frozen; a score head trained in full, in the adapters' arena */
        L->grads = m->be->alloc(sizeof(float) * optim_grad_floats(L->opt));
        L->sink.w.layers = L->gl;
        L->sink.lora = L->grads;
        if (m->lora->score) L->sink.w.score = L->grads + (m->lora->score - m->lora->arena);
        if (oc.zero == 3) model_shard_weights(m, &m->mesh->dp_comm);   /* the frozen base sliced over dp */
    } else if (oc.zero >= 2) {
        L->sink.w.layers = L->gl;
        place_unit_grads(L);
        if (oc.zero == 3) {   /* the optimizer has its master: the weights to slices */
            model_shard_weights(m, &m->mesh->dp_comm);
            size_t S0 = 0;   /* layer 0's units (ep > 1: two) are its slice */
            for (int u = 0; u < L->opt->n_units; u++) S0 += L->opt->units[u].layer == 0 ? L->opt->units[u].S : 0;
            CHECK(m->n_layers_local == 0 || m->z3->S == S0);
        }
    } else {
        L->grads = m->be->alloc(sizeof(float) * optim_grad_floats(L->opt));   /* zero */
        model_weights_place(m, L->grads, &L->sink.w, L->gl);
    }
}

void learner_free(Learner *L) {
    for (int i = 0; i < L->n_slots; i++) train_acts_free(&L->slots[i]);
    free(L->slots);
    if (L->m && L->grads) L->m->be->free(L->grads);
    free(L->gl);
    free(L->moe_tokens);
    if (L->opt) optim_free(L->opt);
    memset(L, 0, sizeof *L);
}

/* A non-finite step stops the run; it is not skipped. DeepSpeed's fp16 path skips such a step,
 * because there an overflow is expected now and then (dynamic loss scaling probes for the largest
 * scale that fits). Tandem trains in fp32 without loss scaling, so a NaN or inf is a real fault
 * (a learning rate that diverged, bad weights, bad data), and skipping it would hide the fault and
 * go on from a state that produced it. Megatron stops on a NaN gradient norm for the same reason. */
LearnerStep learner_step(Learner *L, const MicroBatch *mbs, int M, const LossHook *hook) {
    const Mesh *mesh = L->m->mesh;
    LearnerStep r;
    optim_zero_grad(L->opt, L->grads);
    model_shards_step(L->m, 1);   /* ZeRO-3: each layer gathered where it is used */
    if (L->m->lora) L->m->lora->step = L->opt->step;   /* LoRA dropout's masks: this step's */
    for (int i = 0; i < L->n_slots; i++) {   /* the load-balancing loss and the z-loss: the micro-batches' mean */
        L->slots[i].moe_aux_coef = learner_moe_aux(L->m) / (float)M;
        L->slots[i].moe_aux_sum = 0.0;
        L->slots[i].moe_z_coef = L->moe_z_coef / (float)M;
        L->slots[i].moe_z_sum = 0.0;
        if (L->slots[i].moe_load) memset(L->slots[i].moe_load, 0, sizeof(double) * 2 * L->m->cfg.n_experts);
    }
    r.loss = schedule_1f1b(L->m, L->slots, L->n_slots, mbs, M, hook, &L->sink);
    double aux = 0.0;
    for (int i = 0; i < L->n_slots; i++) aux += L->slots[i].moe_aux_sum;
    r.moe_aux = (float)(aux / M);
    learner_moe_load(L, &r, M);
    r.lr = (float)optim_lr(L->opt, L->opt->step);
    /* The loss is each dp replica's own (the same over tp and pp): every rank learns whether any
     * rank's loss is bad, so all take the same branch (the same collectives). */
    float bad = isfinite(r.loss) ? 0.0f : 1.0f;
    comm_all_reduce_max(&mesh->group, &bad, 1);
    if (bad > 0) {
        model_shards_step(L->m, 0);
        r.grad_norm = NAN;   /* not computed */
        r.non_finite = "the loss";
        return r;
    }
    model_shards_step(L->m, 0);
    r.grad_norm = optim_step(L->opt, L->m, L->grads);   /* applies nothing when the norm is not finite */
    r.non_finite = isfinite(r.grad_norm) ? NULL : "the gradient norm";
    return r;
}

void learner_mem_plan(const Learner *L, MemPlan *plan) {
    plan->grads = (double)optim_grad_bytes(L->opt) + (double)moe_ep_src_bytes(L->m);   /* ep > 1: the sources' */
    plan->expert_zero = L->m->mesh->ep > 1 && !L->m->lora ? L->opt->cfg.zero : 0;   /* LoRA: frozen experts */
    plan->moments = 2.0 * sizeof(float) * L->opt->n_state;
    plan->master = (double)optim_master_bytes(L->opt);
    for (int i = 0; i < L->n_slots; i++) plan->acts += sizeof(float) * (double)L->slots[i].n_arena;
}

int learner_save(Learner *L, const char *src_dir, const char *dir, char *err) {
    const Mesh *mesh = L->m->mesh;
    if (L->m->lora) {   /* the adapter in PEFT's format; the base is --model's, unchanged */
        err[0] = 0;
        if (mesh->rank == 0 && mkdir(dir, 0755) != 0 && errno != EEXIST)
            snprintf(err, CHECKPOINT_ERR_CAP, "%s: cannot create directory: %s", dir, strerror(errno));
        if (comm_first_error(&mesh->group, err, CHECKPOINT_ERR_CAP)) return -1;
        if (lora_save(L->m, dir, src_dir, err, CHECKPOINT_ERR_CAP)) return -1;
        return optim_state_save(L->opt, L->m, dir, err);
    }
    model_shards_gather_all(L->m);   /* ZeRO-3: the writer reads whole layers */
    int failed = checkpoint_save_model(L->m, src_dir, dir, 1, L->save_dtype, err);
    model_shards_release(L->m);
    if (failed) return -1;
    if (optim_state_save(L->opt, L->m, dir, err) == 0) return 0;
    if (mesh->rank == 0) remove_tree(dir);   /* weights without their optimizer state: not a checkpoint */
    comm_barrier(&mesh->group);
    return -1;
}

void learner_resume(Learner *L, const char *dir, int same_layout) {
    if (optim_state_present(dir)) {
        optim_state_load(L->opt, L->m, dir);
        return;
    }
    /* a checkpoint of an earlier build: one optim.rankR.bin per rank, its own layout's arena slices */
    char path[4200];
    snprintf(path, sizeof path, "%s/optim.rank0.bin", dir);
    if (!file_exists(path))
        user_error("%s/" OPTIM_STATE_DIR "/" OPTIM_STATE_FILE ": missing: not a complete checkpoint (was the run "
                   "killed while saving?)", dir);
    if (!same_layout)
        user_error("%s: optimizer state in the per-rank format of earlier builds (optim.rankN.bin), which loads only "
                   "at the layout that saved it: resume there once (its state file names tp, pp, dp and zero); the "
                   "checkpoints it writes then resume at any layout", dir);
    snprintf(path, sizeof path, "%s/optim.rank%d.bin", dir, L->m->mesh->rank);
    if (optim_load(L->opt, path)) rank_error("%s: cannot read", path);
}
