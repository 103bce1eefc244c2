/*
 * retention.c — the audit and retention as a configuration names them: opens the outbox, the
 * broker and the critical consumers' databases, runs the engine's audit (audit.c) and purge
 * (purge.c) at the wall clock, and renders their JSON. The public obx_audit, obx_purge,
 * obx_watermarks and obx_watermark_force live here, and so does the relay's auditor thread:
 * every audit.interval_ms an audit whose counts /metrics exports (obx_audit_findings{kind=...}),
 * and every retention.interval_ms (0: never, the default) a purge run.
 *
 * Owns: the stores and broker it opens (closed before returning; the auditor thread keeps its
 * own for its life and reopens them after an error), the auditor's counters (under its mutex).
 */
#include "drivers/log.h"
#include "drivers/retention.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void obx__criticals_close(obx__critical *v, size_t n) {
    for (size_t i = 0; v && i < n; i++) obx__st_close(v[i].s);
    free(v);
}

obx_err obx__criticals_open(const obx_config *c, unsigned flags, obx__critical **out, size_t *n) {
    *out = NULL;
    *n = 0;
    size_t k = c->critical_consumers.n;
    if (!k) return OBX_OK;
    obx__critical *v = calloc(k, sizeof *v);
    if (!v) return obx__fail(OBX_ENOMEM, "critical consumers: out of memory");
    obx_err e = OBX_OK;
    size_t i = 0;
    for (; i < k && !e; i++) {
        const char *item = c->critical_consumers.v[i], *eq = strchr(item, '=');
        if (!eq || (size_t)(eq - item) > OBX_NAME_MAX) {
            e = obx__fail(OBX_ECONFIG, "audit.critical_consumers[%zu]: '%.60s' is not ID=URL", i,
                          item);
            break;
        }
        memcpy(v[i].id, item, (size_t)(eq - item));
        v[i].id[eq - item] = '\0';
        if ((e = obx__st_open_with(eq + 1, flags, &v[i].s))) {
            v[i].s = NULL;
            obx__fail_prefix(e, "critical consumer %s", v[i].id);
            break;
        }
        int found = 0;
        if (!(e = obx__st_schema_version(v[i].s, &found)) && found != OBX__SCHEMA_VERSION)
            e = obx__fail(OBX_ESCHEMA,
                          "critical consumer %s: %s has schema version %d, need %d (is it the "
                          "consumer's database? run obx init on it)",
                          v[i].id, v[i].s->url_redacted, found, OBX__SCHEMA_VERSION);
        if (!e) e = obx__critical_load(&v[i]);
    }
    if (e) {
        obx__criticals_close(v, k);
        return e;
    }
    *out = v;
    *n = k;
    return OBX_OK;
}

/* flags: OBX_STORE_READ_ONLY for what only reads it (the audit, a dry run, the watermarks). */
static obx_err open_outbox(const obx_config *c, unsigned flags, obx__store **s) {
    obx_err e = obx__st_open_with(c->db, flags, s);
    if (e) return e;
    int found = 0;
    if (!(e = obx__st_schema_version(*s, &found)) && found != OBX__SCHEMA_VERSION)
        e = obx__fail(OBX_ESCHEMA, "%s: schema version %d, this obx needs %d (run obx init)",
                      (*s)->url_redacted, found, OBX__SCHEMA_VERSION);
    if (e) {
        obx__st_close(*s);
        *s = NULL;
    }
    return e;
}

static void audit_cfg_of(const obx_config *c, obx__critical *cons, size_t n, obx__audit_cfg *a) {
    memset(a, 0, sizeof *a);
    a->consumers = cons;
    a->n_consumers = n;
    a->pending_max_age_ms = c->pending_max_age_ms;
    a->unconsumed_max_age_ms = c->unconsumed_max_age_ms;
    a->unknown_max_age_ms = c->unknown_max_age_ms;
    a->broker_scan_window_ms = c->audit_scan_window_ms;
    a->max_ids = (size_t)c->audit_max_ids;
    a->max_scan = (size_t)c->audit_max_scan;
}

static void retention_cfg_of(const obx_config *c, obx__critical *cons, size_t n, const char *who,
                             bool dry, size_t max_listed, obx__retention_cfg *r) {
    memset(r, 0, sizeof *r);
    r->consumers = cons;
    r->n_consumers = n;
    r->replay_window_ms = c->replay_window_ms;
    r->batch = (size_t)c->purge_batch;
    r->dry_run = dry;
    r->who = who;
    r->max_listed = max_listed;
}

/* retention.max_rate: after a purge step, sleeps until the events handled so far (retained,
 * purged or refused) are no more than rate per second since t0_ms. A purge is CPU work for
 * the database that the relay competes with (docs/performance.md, scenario 4); an operator
 * paces it below what the outbox's tables can absorb instead of letting it take its share. */
static void pace(int64_t t0_ms, const obx__ret_result *res, int64_t rate) {
    if (rate <= 0) return;
    int64_t done = res->retained + res->purged + res->refused;
    int64_t due = t0_ms + done * 1000 / rate, wait = due - obx__mono_ms();
    if (wait <= 0) return;
    if (wait > 10000) wait = 10000; /* one step at a time: never asleep for long */
    struct timespec ts = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L};
    nanosleep(&ts, NULL); /* not nap(): a signal (the relay stopping) ends the wait early */
}

/* A whole purge run (obx__purge_run) step by step, paced to rate events/s (0 = unpaced), until
 * done, an error, or v (may be NULL: `obx purge`) says the relay is stopping. */
static obx_err purge_paced(obx__store *s, const obx__retention_cfg *rc, int64_t now, int64_t rate,
                           const obx__relay_view *v, obx__ret_result *res) {
    obx__purge_cursor cur;
    obx__purge_cursor_init(&cur);
    int64_t t0 = obx__mono_ms();
    obx_err e = OBX_OK;
    while (!e && cur.phase < 2 && !(v && v->stopping(v->relay))) {
        e = obx__purge_step(s, rc, now, &cur, res);
        if (!e) pace(t0, res, rate);
    }
    return e;
}

/* ---- public API ------------------------------------------------------------------------------ */

/* The audit reads the broker too and creates nothing there either: a local log broker's file
 * that does not exist is OBX_ENODB, where opening it would make an empty one. */
static obx_err log_broker_exists(const char *url) {
    char *x = NULL;
    obx__url u;
    obx_err e = obx__secret_expand(url, true, &x);
    if (!e) e = obx__url_parse(x, "broker", &u);
    obx__secret_free(x);
    if (!e && u.scheme == OBX__URL_LOG && access(u.path, F_OK))
        e = obx__fail(OBX_ENODB, "log broker: no such file: %s", u.path);
    memset(&u, 0, sizeof u);            /* another broker's URL holds a password */
    return e == OBX_ENODB ? e : OBX_OK; /* any other fault: obx__br_open names it */
}

obx_err obx_audit(const obx_config *c, unsigned flags, char **out) {
    if (!c || !out) return obx__fail(OBX_EINVAL, "audit: NULL argument");
    obx__clear_error();
    *out = NULL;
    if (flags & ~OBX_AUDIT_NO_BROKER)
        return obx__fail(OBX_EINVAL, "flags: unknown bits %#x", flags);
    obx_err e = obx__config_check(c);
    if (e) return e;
    obx__store *s = NULL;
    obx__broker *b = NULL;
    obx__critical *cons = NULL;
    size_t n = 0;
    /* read-only: the audit vouches for what it reads and creates nothing */
    if ((e = open_outbox(c, OBX_STORE_READ_ONLY, &s))) return e;
    if (!(flags & OBX_AUDIT_NO_BROKER)) e = log_broker_exists(c->broker);
    if (!e && !(flags & OBX_AUDIT_NO_BROKER))
        e = obx__br_open(c->broker, (const char *const *)c->broker_props.v, c->broker_props.n, &b);
    if (!e) e = obx__criticals_open(c, OBX_STORE_READ_ONLY, &cons, &n);
    json_t *doc = NULL;
    int64_t counts[OBX__FK_COUNT];
    obx__audit_cfg ac;
    audit_cfg_of(c, cons, n, &ac);
    if (!e) e = obx__audit_run(s, b, &ac, obx__st_now_ms(s), &doc, counts);
    obx__criticals_close(cons, n);
    obx__br_close(b);
    obx__st_close(s);
    if (e) return e;
    int64_t total = 0;
    for (int k = 0; k < OBX__FK_COUNT; k++) total += counts[k];
    if ((e = obx__json_out(doc, out))) return e;
    if (total)
        return obx__fail(OBX_EFINDINGS, "the audit has %lld finding%s", (long long)total,
                         total == 1 ? "" : "s");
    return OBX_OK;
}

obx_err obx_purge(const obx_config *c, const obx_purge_options *o, char **out) {
    if (!c || !o || !out) return obx__fail(OBX_EINVAL, "purge: NULL argument");
    obx__clear_error();
    *out = NULL;
    obx_err e = obx__config_check(c);
    if (e) return e;
    const char *who = o->who ? o->who : "operator";
    if ((e = obx__check_field("who", who, 1, OBX__OWNER_MAX, OBX__CS_OWNER))) return e;
    if (o->event_id && (e = obx_event_id_check(o->event_id))) return e;
    if (!c->critical_consumers.n)
        return obx__fail(OBX_ECONFIG,
                         "audit.critical_consumers: none declared: retention needs evidence from "
                         "the consumers that matter (ID=URL of each one's inbox database); an "
                         "ACK alone never purges");
    obx__store *s = NULL;
    obx__critical *cons = NULL;
    size_t n = 0;
    /* a dry run changes and locks nothing; the consumers' databases are only read */
    if ((e = open_outbox(c, o->dry_run ? OBX_STORE_READ_ONLY : 0, &s))) return e;
    if ((e = obx__criticals_open(c, OBX_STORE_READ_ONLY, &cons, &n))) {
        obx__st_close(s);
        return e;
    }
    obx__retention_cfg rc;
    retention_cfg_of(c, cons, n, who, o->dry_run != 0, o->max_listed ? o->max_listed : 1000, &rc);
    obx__ret_result res;
    memset(&res, 0, sizeof res);
    int64_t now = obx__st_now_ms(s); /* the database server's clock (store.h) */
    e = o->event_id ? obx__purge_event(s, &rc, now, o->event_id, &res)
                    : purge_paced(s, &rc, now, o->dry_run ? 0 : c->purge_max_rate, NULL, &res);
    if (!e || e == OBX_EREFUSED) {
        /* keep the refusal's message: rendering must not overwrite it */
        char msg[1024];
        obx__strlcpy(msg, obx_errmsg(), sizeof msg);
        obx_err je = obx__json_out(obx__ret_result_json(&rc, &res, now), out);
        if (je)
            e = je;
        else if (e)
            obx__fail(e, "%s", msg);
    }
    obx__ret_result_free(&res);
    obx__criticals_close(cons, n);
    obx__st_close(s);
    return e;
}

obx_err obx_watermarks(const obx_config *c, char **out) {
    if (!c || !out) return obx__fail(OBX_EINVAL, "watermarks: NULL argument");
    obx__clear_error();
    *out = NULL;
    obx_err e = obx__config_check(c);
    if (e) return e;
    obx__store *s = NULL;
    obx__critical *cons = NULL;
    size_t n = 0;
    if ((e = open_outbox(c, OBX_STORE_READ_ONLY, &s))) return e;
    if ((e = obx__criticals_open(c, OBX_STORE_READ_ONLY, &cons, &n))) {
        obx__st_close(s);
        return e;
    }
    /* the oldest event still PUBLISHED and which critical consumers lack it */
    obx__rows rows = {0};
    obx__retention_req req = {.state = OBX__ST_PUBLISHED,
                              .after = OBX__PUB_POS_MIN,
                              .before = OBX__PUB_POS_MAX,
                              .limit = 1};
    e = obx__st_read_events(s, &(obx__read_req){.by = OBX__READ_RETENTION, .retention = &req},
                            &rows);
    json_t *lacking = json_array(), *cons_j = json_array();
    for (size_t k = 0; !e && rows.n && k < n; k++) {
        bool present = false;
        /* retention's evidence (obx__inbox_key): a receipt for the frozen bytes */
        const obx__event_row *r = &rows.v[0];
        obx__inbox_key key = {obx__wire_id(r), r->env.payload_digest, r->envelope_gen,
                              r->target_no ? NULL : r->dest_digest};
        e = obx__st_inbox_has(cons[k].s, cons[k].id, &key, 1, &present);
        if (!e && !present && rows.v[0].published_at > cons[k].forced)
            json_array_append_new(lacking, json_string(cons[k].id));
    }
    for (size_t k = 0; !e && k < n; k++)
        json_array_append_new(cons_j, json_pack("{s:s,s:s,s:I,s:I}", "id", cons[k].id, "db",
                                                cons[k].s->url_redacted, "forced_watermark_ms",
                                                (json_int_t)cons[k].forced, "forced_at_ms",
                                                (json_int_t)cons[k].forced_at));
    json_t *doc = NULL;
    if (!e) {
        json_t *wm = rows.n ? json_pack("{s:s,s:I,s:o}", "event_id", rows.v[0].env.event_id,
                                        "published_at_ms", (json_int_t)rows.v[0].published_at,
                                        "not_consumed_by", lacking)
                            : json_null();
        if (!rows.n) json_decref(lacking);
        lacking = NULL;
        doc = json_pack("{s:s,s:I,s:o,s:o}", "store", s->url_redacted, "at_ms",
                        (json_int_t)obx__wall_ms(), "critical_consumers", cons_j,
                        "forced_consumer_watermark", wm);
        cons_j = NULL;
    }
    json_decref(lacking);
    json_decref(cons_j);
    obx__rows_free(&rows);
    obx__criticals_close(cons, n);
    obx__st_close(s);
    return e ? e : obx__json_out(doc, out);
}

obx_err obx_watermark_force(const obx_config *c, const char *consumer, int64_t until,
                            const char *who, const char *reason) {
    if (!c || !consumer) return obx__fail(OBX_EINVAL, "watermark: NULL argument");
    obx__clear_error();
    obx_err e = obx__config_check(c);
    if (e) return e;
    if ((e = obx__check_field("consumer", consumer, 1, OBX_NAME_MAX, OBX__CS_NAME))) return e;
    if (!reason) return obx__fail(OBX_EINVAL, "reason: missing (say why, for the audit trail)");
    obx__critical *cons = NULL;
    size_t n = 0;
    if ((e = obx__criticals_open(c, 0, &cons, &n))) return e;
    obx__critical *cc = NULL;
    for (size_t k = 0; k < n; k++)
        if (!strcmp(cons[k].id, consumer)) cc = &cons[k];
    if (!cc)
        e = obx__fail(OBX_EINVAL,
                      "consumer: '%s' is not a critical consumer (audit.critical_consumers "
                      "declares %zu)",
                      consumer, n);
    else
        e = obx__critical_force(cc, until, obx__wall_ms(), who ? who : "operator", reason);
    obx__criticals_close(cons, n);
    return e;
}

/* ---- the relay's auditor thread -------------------------------------------------------------- */

typedef struct auditor {
    const obx__relay_view *v; /* the relay's (relay_view.h), outlives the thread */
    pthread_t th;
    pthread_mutex_t mu;
    /* published under mu */
    bool have;                     /* an audit completed at least once */
    int64_t counts[OBX__FK_COUNT]; /* of the last completed audit */
    int64_t last_ok_at, runs, failures;
    bool last_failed;
    int64_t retained, purged, purge_runs, purge_failures;
} auditor;

static void nap(int64_t ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

typedef struct conns {
    obx__store *s;
    obx__broker *b;
    obx__critical *cons;
    size_t n;
    bool open;
} conns;

static void conns_close(conns *k) {
    obx__criticals_close(k->cons, k->n);
    obx__br_close(k->b);
    obx__st_close(k->s);
    memset(k, 0, sizeof *k);
}

static obx_err conns_open(const obx_config *c, conns *k) {
    if (k->open) {
        /* forced watermarks may have moved since the last run */
        for (size_t i = 0; i < k->n; i++) {
            obx_err e = obx__critical_load(&k->cons[i]);
            if (e) return e;
        }
        return OBX_OK;
    }
    obx_err e = open_outbox(c, 0, &k->s);
    if (!e && c->audit_interval_ms)
        e = obx__br_open(c->broker, (const char *const *)c->broker_props.v, c->broker_props.n,
                         &k->b);
    if (!e) e = obx__criticals_open(c, 0, &k->cons, &k->n);
    if (e) {
        conns_close(k);
        return e;
    }
    k->open = true;
    return OBX_OK;
}

static void run_audit(auditor *a, const obx_config *c, conns *k) {
    obx__audit_cfg ac;
    audit_cfg_of(c, k->cons, k->n, &ac);
    /* a periodic audit looks at what reached the broker since about its previous run, not at
     * the whole window each time */
    if (!ac.broker_scan_window_ms || ac.broker_scan_window_ms > 2 * c->audit_interval_ms)
        ac.broker_scan_window_ms = 2 * c->audit_interval_ms;
    json_t *doc = NULL;
    int64_t counts[OBX__FK_COUNT];
    obx_err e = obx__audit_run(k->s, k->b, &ac, obx__st_now_ms(k->s), &doc, counts);
    json_decref(doc);
    pthread_mutex_lock(&a->mu);
    a->runs++;
    a->last_failed = e != OBX_OK;
    if (e)
        a->failures++;
    else {
        a->have = true;
        memcpy(a->counts, counts, sizeof counts);
        a->last_ok_at = obx__wall_ms();
    }
    pthread_mutex_unlock(&a->mu);
    if (e) {
        obx__log(OBX__LOG_WARN, "auditor", NULL, NULL, NULL, "audit failed: %s: %s", obx_errname(e),
                 obx_errmsg());
        conns_close(k);
        return;
    }
    char line[512];
    size_t o = 0;
    int64_t total = 0;
    line[0] = '\0';
    for (int i = 0; i < OBX__FK_COUNT; i++) {
        total += counts[i];
        if (counts[i] && o < sizeof line)
            o += (size_t)snprintf(line + o, sizeof line - o, " %s=%lld",
                                  obx__finding_name((obx__finding_kind)i), (long long)counts[i]);
    }
    if (total)
        obx__log(OBX__LOG_WARN, "auditor", NULL, NULL, NULL,
                 "audit findings:%s (run `obx audit` for the event IDs)", line);
}

static void run_purge(auditor *a, const obx_config *c, conns *k) {
    char who[OBX__OWNER_MAX + 1];
    snprintf(who, sizeof who, "%.200s/purger", a->v->id);
    obx__retention_cfg rc;
    retention_cfg_of(c, k->cons, k->n, who, false, 0, &rc);
    obx__ret_result res;
    memset(&res, 0, sizeof res);
    obx_err e = purge_paced(k->s, &rc, obx__st_now_ms(k->s), c->purge_max_rate, a->v, &res);
    pthread_mutex_lock(&a->mu);
    a->purge_runs++;
    a->retained += res.retained;
    a->purged += res.purged;
    if (e) a->purge_failures++;
    pthread_mutex_unlock(&a->mu);
    if (e) {
        obx__log(OBX__LOG_WARN, "purger", NULL, NULL, NULL, "purge failed: %s: %s", obx_errname(e),
                 obx_errmsg());
        conns_close(k);
    } else if (res.retained || res.purged)
        obx__log(OBX__LOG_INFO, "purger", NULL, NULL, NULL,
                 "retained %lld, purged %lld (%lld payload bytes dropped) in %lld transactions",
                 (long long)res.retained, (long long)res.purged, (long long)res.bytes_freed,
                 (long long)res.batches);
    obx__ret_result_free(&res);
}

static void *auditor_main(void *arg) {
    auditor *a = arg;
    const obx_config *c = a->v->cfg;
    conns k;
    memset(&k, 0, sizeof k);
    /* the first audit at start (fresh gauges); a purge (with critical consumers) after one
     * interval, never in the relay's first moments */
    int64_t next_audit = obx__wall_ms(), next_purge = obx__wall_ms() + c->purge_interval_ms;
    while (!a->v->stopping(a->v->relay)) {
        int64_t now = obx__wall_ms();
        bool audit_due = c->audit_interval_ms && now >= next_audit;
        bool purge_due = c->purge_interval_ms && c->critical_consumers.n && now >= next_purge;
        if (audit_due || purge_due) {
            obx_err e = conns_open(c, &k);
            if (e) {
                obx__log(OBX__LOG_WARN, "auditor", NULL, NULL, NULL,
                         "cannot open the outbox, broker or critical consumers: %s: %s",
                         obx_errname(e), obx_errmsg());
                pthread_mutex_lock(&a->mu);
                a->last_failed = true;
                a->failures += audit_due;
                pthread_mutex_unlock(&a->mu);
                conns_close(&k);
            } else {
                if (audit_due) run_audit(a, c, &k);
                if (purge_due && k.open) run_purge(a, c, &k);
            }
            if (audit_due) next_audit = obx__wall_ms() + c->audit_interval_ms;
            if (purge_due) next_purge = obx__wall_ms() + c->purge_interval_ms;
        }
        nap(50);
    }
    conns_close(&k);
    return NULL;
}

obx_err obx__auditor_start(const obx__relay_view *v, void **out) {
    *out = NULL;
    const obx_config *c = v->cfg;
    if (!c->audit_interval_ms && !c->purge_interval_ms) return OBX_OK;
    auditor *a = calloc(1, sizeof *a);
    if (!a) return obx__fail(OBX_ENOMEM, "auditor: out of memory");
    a->v = v;
    pthread_mutex_init(&a->mu, NULL);
    int rc = pthread_create(&a->th, NULL, auditor_main, a);
    if (rc) {
        pthread_mutex_destroy(&a->mu);
        free(a);
        return obx__fail(OBX_EINTERNAL, "auditor: cannot start thread: %s", strerror(rc));
    }
    *out = a;
    return OBX_OK;
}

void obx__auditor_stop(void *p) {
    auditor *a = p;
    if (!a) return;
    pthread_join(a->th, NULL);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

void obx__auditor_metrics(void *p, obx__buf *b) {
    auditor *a = p;
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    obx__buf_printf(b,
                    "# HELP obx_audit_up 1 when the relay's last audit ran to completion\n"
                    "# TYPE obx_audit_up gauge\nobx_audit_up %d\n",
                    a->have && !a->last_failed ? 1 : 0);
    if (a->have) {
        obx__buf_puts(b, "# HELP obx_audit_findings Events (bypass: messages) in the findings of "
                         "the last completed audit, by kind\n"
                         "# TYPE obx_audit_findings gauge\n");
        for (int i = 0; i < OBX__FK_COUNT; i++)
            obx__buf_printf(b, "obx_audit_findings{kind=\"%s\"} %lld\n",
                            obx__finding_name((obx__finding_kind)i), (long long)a->counts[i]);
        obx__buf_printf(b,
                        "# HELP obx_audit_last_success_timestamp_seconds When the last audit "
                        "completed\n# TYPE obx_audit_last_success_timestamp_seconds gauge\n"
                        "obx_audit_last_success_timestamp_seconds %.3f\n",
                        (double)a->last_ok_at / 1000.0);
    }
    obx__buf_printf(b,
                    "# HELP obx_audit_runs_total Audits and purge runs by this relay, and their "
                    "failures\n# TYPE obx_audit_runs_total counter\n"
                    "obx_audit_runs_total{what=\"audit\"} %lld\n"
                    "obx_audit_runs_total{what=\"audit_failed\"} %lld\n"
                    "obx_audit_runs_total{what=\"purge\"} %lld\n"
                    "obx_audit_runs_total{what=\"purge_failed\"} %lld\n"
                    "# HELP obx_retention_total Retention transitions by this relay since start\n"
                    "# TYPE obx_retention_total counter\n"
                    "obx_retention_total{what=\"retained\"} %lld\n"
                    "obx_retention_total{what=\"purged\"} %lld\n",
                    (long long)a->runs, (long long)a->failures, (long long)a->purge_runs,
                    (long long)a->purge_failures, (long long)a->retained, (long long)a->purged);
    pthread_mutex_unlock(&a->mu);
}
