/*
 * snapshot.c — what the outbox holds, read through the store interface for the checkers and
 * the scheduler's clock: every event row (read_events by filter, in commit order) and, for a full
 * snapshot, each event's attempts, receipts and audit rows (load_attempts, load_receipts,
 * load_audit). It reads the database — not the engine's or the actors' memory — so a checker
 * working on it still checks what was committed, not what obx believes it committed.
 */
#include "sim/sim.h"

#include <stdlib.h>
#include <string.h>

obx_err obx__sim_snap_load(wk *k, bool full, obx__sim_snap *s) {
    memset(s, 0, sizeof *s);
    obx__event_filter f = {.limit = 1000};
    for (;;) { /* every event, a page at a time */
        obx__rows page = {0};
        obx_err e = obx__st_read_events(
            k->os, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &f}, &page);
        size_t n = e ? 0 : page.n;
        if (n) f.after_seq = page.v[n - 1].seq;
        if (!e && !s->ev.n) { /* the first page: taken as it is */
            s->ev = page;
            page = (obx__rows){0};
        }
        for (size_t i = 0; !e && i < page.n; i++) { /* later pages: moved row by row */
            obx__event_row *r = obx__rows_push(&s->ev);
            if (!r) {
                e = obx__fail(OBX_ENOMEM, "sim: out of memory");
                break;
            }
            *r = page.v[i];
            page.v[i].payload = NULL; /* owned by s->ev now (a filter read loads none) */
        }
        obx__rows_free(&page);
        if (e) {
            obx__sim_snap_free(s);
            return e;
        }
        if (n < f.limit) break;
    }
    if (!full || !s->ev.n) return OBX_OK;
    s->x = calloc(s->ev.n, sizeof *s->x);
    if (!s->x) {
        obx__sim_snap_free(s);
        return obx__fail(OBX_ENOMEM, "sim: out of memory");
    }
    obx_err e = OBX_OK;
    for (size_t i = 0; !e && i < s->ev.n; i++) {
        const char *id = s->ev.v[i].env.event_id;
        obx__sim_snap_event *x = &s->x[i];
        e = obx__st_load_attempts(k->os, NULL, 0, id, &x->att, &x->natt);
        if (!e) e = obx__st_load_receipts(k->os, id, &x->rc, &x->nrc);
        if (!e) e = obx__st_load_audit(k->os, id, &x->au, &x->nau);
    }
    if (e) obx__sim_snap_free(s);
    return e;
}

void obx__sim_snap_free(obx__sim_snap *s) {
    for (size_t i = 0; s->x && i < s->ev.n; i++) {
        free(s->x[i].att);
        free(s->x[i].rc);
        free(s->x[i].au);
    }
    free(s->x);
    obx__rows_free(&s->ev);
    memset(s, 0, sizeof *s);
}

bool obx__sim_published(obx__state st) {
    return st == OBX__ST_PUBLISHED || st == OBX__ST_RETAINED || st == OBX__ST_PURGED;
}
