/*
 * fuzz_headers.c — the obx message headers a consumer or a lookup reads back from a broker
 * (obx__headers_parse, src/broker/broker.c): outside input.
 *
 * Properties, per input:
 *   1. arbitrary header lines ("name=value", values with any bytes) either parse into an
 *      envelope whose every field satisfies the documented input rules, or are refused with
 *      OBX_EINVAL and a printable header_error — never a crash, a read past a value, or a
 *      field that bypasses validation;
 *   2. round trip: for a valid envelope derived from the input, parse(build(x)) == x field by
 *      field.
 */
#include "fuzz_common.h"

#include "broker/broker.h"

typedef struct hset {
    const char *name[40];
    char *value[40];
    size_t len[40];
    size_t n;
} hset;

static const char *get(void *user, const char *name, size_t *len) {
    hset *h = user;
    for (size_t i = 0; i < h->n; i++)
        if (!strcmp(h->name[i], name)) {
            *len = h->len[i];
            return h->value[i];
        }
    return NULL;
}

static void hset_free(hset *h) {
    for (size_t i = 0; i < h->n; i++) free(h->value[i]);
    h->n = 0;
}

static void check_valid(const obx__delivery *d) {
    const obx__envelope *e = &d->env;
    PROP(!obx_event_id_check(e->event_id), "event_id accepted: %s", obx_errmsg());
    PROP(e->envelope_gen >= 1, "envelope_gen %d", (int)e->envelope_gen);
    PROP(!obx__check_field("attempt", d->attempt_id, 1, OBX_EVENT_ID_LEN, OBX__CS_NAME), "%s",
         obx_errmsg());
    PROP(obx__is_digest(e->payload_digest), "payload digest");
    PROP(obx__is_digest(d->dest_digest), "dest digest");
    PROP(!e->payload_schema[0] || obx__is_digest(e->payload_schema), "schema digest");
    PROP(!obx__check_field("event_type", e->event_type, 1, OBX_NAME_MAX, OBX__CS_EVENT_TYPE), "%s",
         obx_errmsg());
    PROP(!obx__check_field("tenant", e->tenant, 1, OBX_NAME_MAX, OBX__CS_NAME), "%s", obx_errmsg());
    PROP(!obx__check_field("correlation_id", e->correlation_id, 0, OBX_TEXT_MAX, OBX__CS_TEXT),
         "%s", obx_errmsg());
    PROP(!obx__check_field("causation_id", e->causation_id, 0, OBX_TEXT_MAX, OBX__CS_TEXT), "%s",
         obx_errmsg());
    PROP(!obx__check_field("traceparent", e->traceparent, 0, OBX_TRACEPARENT_LEN, OBX__CS_NAME),
         "%s", obx_errmsg());
    if (e->aggregate_type[0] || e->aggregate_id[0]) {
        PROP(!obx__check_field("aggregate_type", e->aggregate_type, 1, OBX_NAME_MAX, OBX__CS_NAME),
             "%s", obx_errmsg());
        PROP(!obx__check_field("aggregate_id", e->aggregate_id, 1, OBX_KEY_MAX, OBX__CS_TEXT), "%s",
             obx_errmsg());
        PROP(e->aggregate_version >= 0, "aggregate_version %lld", (long long)e->aggregate_version);
    }
    PROP(e->occurred_at >= 0 && e->occurred_at < ((int64_t)1 << 48), "occurred_at");
}

/* Property 1: arbitrary headers. */
static void parse_arbitrary(const fz_input *in) {
    hset h = {0};
    for (size_t i = 0; i < in->n && h.n < 40; i++) {
        h.name[h.n] = in->f[i].key;
        h.value[h.n] = malloc(in->f[i].len + 1); /* exact size: ASan sees any over-read */
        if (!h.value[h.n]) abort();
        memcpy(h.value[h.n], in->f[i].v, in->f[i].len);
        h.value[h.n][in->f[i].len] = '\0';
        h.len[h.n] = in->f[i].len;
        h.n++;
    }
    obx__delivery d;
    memset(&d, 0, sizeof d);
    obx__clear_error();
    obx_err e = obx__headers_parse(get, &h, &d);
    PROP(e == OBX_OK || e == OBX_EINVAL, "unexpected %s", obx_errname(e));
    if (e) {
        PROP(d.header_error[0], "refused without a header_error");
        fz_printable("header_error", d.header_error);
        fz_printable("errmsg", obx_errmsg());
    } else {
        PROP(!d.header_error[0], "accepted with a header_error");
        check_valid(&d);
        /* simple fields are copied byte for byte */
        const char *tenant = get(&h, OBX__H_TENANT, &(size_t){0});
        PROP(tenant && !strcmp(tenant, d.env.tenant), "tenant changed");
    }
    hset_free(&h);
}

/* Property 2: parse(build(x)) == x for a valid x derived from the input. */
static void round_trip(const unsigned char *data, size_t size) {
    fz_gen g = {data, size, 0};
    obx__envelope env;
    obx__dest dest;
    memset(&env, 0, sizeof env);
    memset(&dest, 0, sizeof dest);
    fz_event_id(&g, env.event_id);
    env.envelope_gen = 1 + (int32_t)(fz_byte(&g) * 977u % 100000u);
    fz_string(&g, fz_name_tok, 9, 1, OBX_NAME_MAX, env.aggregate_type);
    fz_string(&g, fz_text_tok, 18, 1, OBX_KEY_MAX, env.aggregate_id);
    env.aggregate_version = (int64_t)fz_byte(&g) << (fz_byte(&g) % 55);
    fz_event_type(&g, env.event_type);
    fz_digest(&g, env.payload_schema);
    fz_digest(&g, env.payload_digest);
    fz_string(&g, fz_name_tok, 9, 1, OBX_NAME_MAX, env.tenant);
    env.occurred_at = ((int64_t)fz_byte(&g) << 40) | fz_byte(&g);
    fz_string(&g, fz_text_tok, 18, 0, OBX_TEXT_MAX, env.correlation_id);
    fz_string(&g, fz_text_tok, 18, 0, OBX_TEXT_MAX, env.causation_id);
    if (fz_byte(&g) & 1)
        snprintf(env.traceparent, sizeof env.traceparent, "00-%032x-%016x-01", fz_byte(&g),
                 fz_byte(&g));
    char dd[OBX_DIGEST_LEN + 1], att[OBX_EVENT_ID_LEN + 1];
    fz_digest(&g, dd);
    fz_event_id(&g, att);
    memcpy(att, "att-", 4);
    obx__msg m = {.env = &env,
                  .dest = &dest,
                  .dest_digest = dd,
                  .attempt_id = att,
                  .attempt_gen = 1 + (int32_t)fz_byte(&g)};
    obx__headers built;
    obx__headers_build(&m, &built);
    hset h = {0};
    for (size_t i = 0; i < built.n; i++) {
        h.name[h.n] = built.name[i];
        h.len[h.n] = strlen(built.value[i]);
        h.value[h.n] = malloc(h.len[h.n] + 1);
        if (!h.value[h.n]) abort();
        memcpy(h.value[h.n], built.value[i], h.len[h.n] + 1);
        h.n++;
    }
    obx__delivery d;
    memset(&d, 0, sizeof d);
    obx_err e = obx__headers_parse(get, &h, &d);
    PROP(e == OBX_OK, "valid envelope refused: %s", obx_errmsg());
    const obx__envelope *p = &d.env;
#define SAME(f) PROP(!strcmp(p->f, env.f), #f ": '%s' != '%s'", p->f, env.f)
    SAME(event_id);
    SAME(aggregate_type);
    SAME(aggregate_id);
    SAME(event_type);
    SAME(payload_schema);
    SAME(payload_digest);
    SAME(tenant);
    SAME(correlation_id);
    SAME(causation_id);
    SAME(traceparent);
#undef SAME
    PROP(p->envelope_gen == env.envelope_gen, "envelope_gen");
    PROP(p->aggregate_version == env.aggregate_version, "aggregate_version %lld != %lld",
         (long long)p->aggregate_version, (long long)env.aggregate_version);
    PROP(p->occurred_at == env.occurred_at, "occurred_at");
    PROP(!strcmp(d.dest_digest, dd) && !strcmp(d.attempt_id, att), "dest digest / attempt");
    hset_free(&h);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    fz_input in;
    fz_parse(data, size, &in);
    parse_arbitrary(&in);
    round_trip(data, size);
    return 0;
}
