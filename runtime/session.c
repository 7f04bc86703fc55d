/* session.c — model_open, the inference commands' prelude (runtime/session.h). */
#include "runtime/session.h"
#include "kernels/kernels.h"
#include "runtime/adapter.h"
#include "runtime/comm.h"
#include "runtime/device.h"

void model_open(ModelOpen *s, Mesh *mesh, Model *m) {
    comm_set_timeout(s->comm_timeout);
    s->threads = backend_set_threads(s->threads);
    DType dtype = dtype_parse("--dtype", s->dtype_name);
    kernel_options_set(s->kv_dtype_name, s->bf16_dot_name, s->device);
    const Backend *be = device_open(s->device);
    mesh_init_world(mesh, s->tp, s->pp, s->ep);
    if (s->score_head) model_load_score(m, s->dir, mesh, 1, dtype, be);   /* a directory's own head is kept */
    else model_load(m, s->dir, mesh, dtype, be);
    if (s->adapter) adapter_merge(m, s->adapter);
}
