/* test_pref_loss.c — rlhf/pref_loss.c's per-pair formulas against torch float64 autograd
 * (tests/fixtures/hook/pref_scalars.json by make_pref_fixtures.py): Bradley–Terry with margin and
 * center coefficient, DPO sigmoid with label smoothing, IPO, at ordinary inputs and at |x| = 800
 * where log(sigmoid(x)) computed naively gives -inf or NaN. Usage: test_pref_loss FIXTURE.json
 * Tolerance: 1e-12 relative to max(1, |torch|): both sides are float64 evaluations of the same
 * closed forms (log1p/exp orders differ by a few ulps, ~1e-16). */
#include "rlhf/pref_loss.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double num(const cJSON *c, const char *k) { return cJSON_GetObjectItemCaseSensitive(c, k)->valuedouble; }

static int close_to(double got, double want) { return fabs(got - want) <= 1e-12 * fmax(1.0, fabs(want)); }

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: test_pref_loss FIXTURE.json\n"); return 2; }
    size_t len;
    char *text = read_file(argv[1], &len);
    cJSON *fx = text ? cJSON_Parse(text) : NULL;
    if (!fx) { fprintf(stderr, "%s: cannot read as JSON\n", argv[1]); return 1; }
    int fail = 0, n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(fx, "cases")) {
        double loss, dc, dr;
        const char *kind = cJSON_GetObjectItemCaseSensitive(c, "kind")->valuestring;
        if (!strcmp(kind, "bt"))
            loss = bt_loss(num(c, "rc"), num(c, "rr"), num(c, "margin"), num(c, "center"), &dc, &dr);
        else {
            int ipo = !strcmp(cJSON_GetObjectItemCaseSensitive(c, "loss_type")->valuestring, "ipo");
            loss = dpo_loss(ipo ? DPO_IPO : DPO_SIGMOID, num(c, "beta"), num(c, "label_smoothing"), num(c, "pi_c"),
                            num(c, "pi_r"), num(c, "ref_c"), num(c, "ref_r"), &dc, &dr);
        }
        int ok = close_to(loss, num(c, "loss")) && close_to(dc, num(c, "d_c")) && close_to(dr, num(c, "d_r"));
        char *js = cJSON_PrintUnformatted(c);
        printf("%s: loss %.17g d_c %.17g d_r %.17g%s\n", js, loss, dc, dr, ok ? "" : "  FAIL");
        free(js);
        fail |= !ok;
        n++;
    }
    if (!fail) printf("ok: %d preference-loss cases match torch\n", n);
    cJSON_Delete(fx);
    free(text);
    return fail || n == 0;
}
