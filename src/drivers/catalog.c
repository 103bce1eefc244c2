/*
 * catalog.c — the topic catalog and `obx catalog check` (obx_catalog_check): compares a YAML
 * catalog of versioned topics (owner, event types, subscribers) with the outbox's route policy
 * and with what consumers subscribe to (declared in a YAML file or on the command line, and
 * observed in consumer databases' watermarks), and reports every disagreement: topics nobody
 * consumes, subscriptions to undeclared topics, routes the catalog does not know, subscriber
 * lists that differ from the runtime, and spelling drift (a name one typo, a case or separator
 * change, or a version away from a declared one). The release gate (docs/operations.md): the
 * catalog agrees with the runtime subscriptions, with nothing unconsumed and no drift.
 *
 * Catalog:                                   Consumers:
 *   topics:                                    consumers:
 *     - name: orders.v1                          - id: order-projection
 *       owner: orders-team                         topics: [orders.v1]
 *       event_types: [order.created.v1]            event_types: [order.created.v1]
 *       subscribers: [order-projection]
 */
#include "drivers/config.h"
#include "drivers/log.h"
#include "drivers/observe.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* ---- names ----------------------------------------------------------------------------------- */

typedef struct name_list {
    char **v;
    int *line;
    size_t n;
} name_list;

static obx_err nl_push(name_list *l, const char *s, int line) {
    char **v = realloc(l->v, (l->n + 1) * sizeof *v);
    if (v) l->v = v;
    int *ln = realloc(l->line, (l->n + 1) * sizeof *ln);
    if (ln) l->line = ln;
    if (!v || !ln || !(l->v[l->n] = obx__strdup(s)))
        return obx__fail(OBX_ENOMEM, "catalog: out of memory");
    l->line[l->n++] = line;
    return OBX_OK;
}

static void nl_free(name_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    free(l->line);
    memset(l, 0, sizeof *l);
}

static bool nl_has(const name_list *l, const char *s) {
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->v[i], s)) return true;
    return false;
}

/* The base name and version of "orders.v2" ("orders", 2); version -1 when unversioned. */
static long split_version(const char *s, char *base, size_t cap) {
    const char *dot = strrchr(s, '.');
    char *end;
    long v = dot && (dot[1] == 'v' || dot[1] == 'V') && dot[2] ? strtol(dot + 2, &end, 10) : -1;
    if (v < 0 || *end) {
        obx__strlcpy(base, s, cap);
        return -1;
    }
    snprintf(base, cap, "%.*s", (int)(dot - s), s);
    return v;
}

/* Lowercase without separators: "Order_Created" and "order.created" compare equal. */
static void fold(const char *s, char *out, size_t cap) {
    size_t k = 0;
    for (; *s && k + 1 < cap; s++)
        if (*s != '.' && *s != '-' && *s != '_')
            out[k++] = (char)(*s >= 'A' && *s <= 'Z' ? *s - 'A' + 'a' : *s);
    out[k] = '\0';
}

/* Optimal string alignment distance (Damerau-Levenshtein with adjacent transpositions), on
 * three rows of the table (i - 2, i - 1, i) on the stack. Not a thread-local table: static TLS
 * is allocated and zeroed in every thread of the process, librdkafka's too, and a 257 x 257
 * table cost each of a relay's 25 threads 516 KiB of resident memory. */
static size_t distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 255 || m > 255) return 999;
    size_t rows[3][257];
    for (size_t j = 0; j <= m; j++) rows[0][j] = j;
    for (size_t i = 1; i <= n; i++) {
        size_t *cur = rows[i % 3], *up = rows[(i - 1) % 3], *up2 = rows[(i + 1) % 3];
        cur[0] = i;
        for (size_t j = 1; j <= m; j++) {
            size_t cost = a[i - 1] != b[j - 1];
            size_t x = up[j] + 1, y = cur[j - 1] + 1, z = up[j - 1] + cost;
            size_t best = x < y ? x : y;
            if (z < best) best = z;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                up2[j - 2] + 1 < best)
                best = up2[j - 2] + 1;
            cur[j] = best;
        }
    }
    return rows[n % 3][m];
}

typedef enum { SAME, UNRELATED, SPELLING, VERSION } kinship;

/* How name x relates to a declared name y. Spelling drift: equal but for case and separators,
 * or base names one edit apart (two for names of 16 bytes or more). Version drift: the same
 * base name at another version (a consumer still on orders.v1 when only orders.v2 exists). */
static kinship relate(const char *x, const char *y) {
    if (!strcmp(x, y)) return SAME;
    char fx[260], fy[260], bx[260], by[260];
    fold(x, fx, sizeof fx);
    fold(y, fy, sizeof fy);
    if (!strcmp(fx, fy)) return SPELLING;
    long vx = split_version(x, bx, sizeof bx), vy = split_version(y, by, sizeof by);
    if (!strcmp(bx, by) && vx != vy) return VERSION;
    size_t shorter = strlen(bx) < strlen(by) ? strlen(bx) : strlen(by);
    size_t limit = shorter >= 16 ? 2 : 1;
    return distance(bx, by) <= limit ? SPELLING : UNRELATED;
}

/* The closest declared name to x and how it relates (UNRELATED: none close). The same base
 * name at another version is closer than a spelling variant. */
static kinship closest(const name_list *declared, const char *x, const char **which) {
    kinship best = UNRELATED;
    *which = NULL;
    for (size_t i = 0; i < declared->n; i++) {
        kinship k = relate(x, declared->v[i]);
        if (k == SAME) {
            *which = declared->v[i];
            return SAME;
        }
        if (k != UNRELATED && (best == UNRELATED || (k == VERSION && best == SPELLING))) {
            best = k;
            *which = declared->v[i];
        }
    }
    return best;
}

/* A declared name that is a spelling variant of x (near-duplicates inside the catalog). */
static bool spelling_twin(const name_list *declared, const char *x, const char **which) {
    for (size_t i = 0; i < declared->n; i++)
        if (relate(x, declared->v[i]) == SPELLING) {
            *which = declared->v[i];
            return true;
        }
    return false;
}

/* ---- model ------------------------------------------------------------------------------------
 */

typedef struct topic {
    char *name;
    char *owner;
    int line;
    name_list types, subscribers;
} topic;

typedef struct consumer {
    char *id;
    char *source; /* where its subscriptions were declared */
    int line;
    name_list topics, types;
} consumer;

typedef struct model {
    topic *t;
    size_t nt;
    consumer *c;
    size_t nc;
    json_t *findings;
} model;

static void finding(model *m, const char *kind, const char *subject, int line,
                    const char *suggestion, const char *fmt, ...) OBX__PRINTF(6, 7);
static void finding(model *m, const char *kind, const char *subject, int line,
                    const char *suggestion, const char *fmt, ...) {
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    json_t *f = json_pack("{s:s,s:s,s:s}", "kind", kind, "subject", subject, "detail", detail);
    if (suggestion) json_object_set_new(f, "suggestion", json_string(suggestion));
    if (line > 0) json_object_set_new(f, "line", json_integer(line));
    json_array_append_new(m->findings, f);
}

static topic *find_topic(model *m, const char *name) {
    for (size_t i = 0; i < m->nt; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

static consumer *find_consumer(model *m, const char *id) {
    for (size_t i = 0; i < m->nc; i++)
        if (!strcmp(m->c[i].id, id)) return &m->c[i];
    return NULL;
}

static consumer *add_consumer(model *m, const char *id, const char *source, int line) {
    consumer *c = find_consumer(m, id);
    if (c) return c;
    consumer *v = realloc(m->c, (m->nc + 1) * sizeof *v);
    if (!v) return NULL;
    m->c = v;
    c = &m->c[m->nc];
    memset(c, 0, sizeof *c);
    if (!(c->id = obx__strdup(id)) || !(c->source = obx__strdup(source))) {
        free(c->id);
        free(c->source);
        return NULL;
    }
    c->line = line;
    m->nc++;
    return c;
}

static void model_free(model *m) {
    for (size_t i = 0; i < m->nt; i++) {
        free(m->t[i].name);
        free(m->t[i].owner);
        nl_free(&m->t[i].types);
        nl_free(&m->t[i].subscribers);
    }
    for (size_t i = 0; i < m->nc; i++) {
        free(m->c[i].id);
        free(m->c[i].source);
        nl_free(&m->c[i].topics);
        nl_free(&m->c[i].types);
    }
    free(m->t);
    free(m->c);
    json_decref(m->findings);
}

/* ---- YAML --------------------------------------------------------------------------------------
 */

typedef struct ydoc {
    const char *path;
    yaml_document_t doc;
} ydoc;

static int line_of(yaml_node_t *n) { return n ? (int)n->start_mark.line + 1 : 0; }

static obx_err yerr(ydoc *y, yaml_node_t *n, const char *fmt, ...) OBX__PRINTF(3, 4);
static obx_err yerr(ydoc *y, yaml_node_t *n, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return obx__fail(OBX_ECONFIG, "%s (line %d): %s", y->path, line_of(n), msg);
}

static obx_err yload(ydoc *y, const char *path) {
    y->path = path;
    FILE *f = fopen(path, "rb");
    if (!f) return obx__fail(OBX_ECONFIG, "%s: cannot open: %s", path, strerror(errno));
    yaml_parser_t p;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_file(&p, f);
    obx_err e = OBX_OK;
    if (!yaml_parser_load(&p, &y->doc))
        e = obx__fail(OBX_ECONFIG, "%s (line %d): YAML: %s", path, (int)p.problem_mark.line + 1,
                      p.problem ? p.problem : "syntax error");
    yaml_parser_delete(&p);
    fclose(f);
    return e;
}

static yaml_node_t *get(ydoc *y, yaml_node_t *map, const char *key) {
    if (!map || map->type != YAML_MAPPING_NODE) return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(&y->doc, p->key);
        if (k && k->type == YAML_SCALAR_NODE && !strcmp((const char *)k->data.scalar.value, key))
            return yaml_document_get_node(&y->doc, p->value);
    }
    return NULL;
}

/* Every key of map must be one of allowed (typos in a catalog are findings of their own). */
static obx_err only_keys(ydoc *y, yaml_node_t *map, const char *const *allowed) {
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(&y->doc, p->key);
        const char *ks = k && k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "";
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++) ok = !strcmp(*a, ks);
        if (!ok) return yerr(y, k, "unknown key '%s'", ks);
    }
    return OBX_OK;
}

static obx_err scalar(ydoc *y, yaml_node_t *n, const char *what, const char **out) {
    if (!n || n->type != YAML_SCALAR_NODE || !n->data.scalar.length)
        return yerr(y, n, "%s: expected a non-empty text", what);
    *out = (const char *)n->data.scalar.value;
    return OBX_OK;
}

/* A list of names (absent = empty); each checked against cs. */
static obx_err names(ydoc *y, yaml_node_t *n, const char *what, obx__charset cs, size_t max,
                     name_list *out) {
    if (!n) return OBX_OK;
    if (n->type != YAML_SEQUENCE_NODE) return yerr(y, n, "%s: expected a list", what);
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        yaml_node_t *item = yaml_document_get_node(&y->doc, *it);
        const char *s = NULL;
        obx_err e = scalar(y, item, what, &s);
        if (!e && obx__check_field(what, s, 1, max, cs)) e = yerr(y, item, "%s", obx_errmsg());
        if (!e) e = nl_push(out, s, line_of(item));
        if (e) return e;
    }
    return OBX_OK;
}

static obx_err load_catalog(model *m, const char *path) {
    ydoc y;
    obx_err e = yload(&y, path);
    if (e) return e;
    yaml_node_t *root = yaml_document_get_root_node(&y.doc);
    static const char *const root_keys[] = {"topics", NULL};
    static const char *const topic_keys[] = {"name",        "owner",       "event_types",
                                             "subscribers", "description", NULL};
    yaml_node_t *list = NULL;
    if (!root || root->type != YAML_MAPPING_NODE)
        e = yerr(&y, root, "expected a mapping with 'topics'");
    if (!e) e = only_keys(&y, root, root_keys);
    if (!e && (!(list = get(&y, root, "topics")) || list->type != YAML_SEQUENCE_NODE))
        e = yerr(&y, list ? list : root, "topics: expected a list of topics");
    for (yaml_node_item_t *it = list && !e ? list->data.sequence.items.start : NULL;
         it && !e && it < list->data.sequence.items.top; it++) {
        yaml_node_t *tn = yaml_document_get_node(&y.doc, *it);
        if (!tn || tn->type != YAML_MAPPING_NODE) {
            e = yerr(&y, tn, "a topic is a mapping (name, owner, event_types, subscribers)");
            break;
        }
        if ((e = only_keys(&y, tn, topic_keys))) break;
        const char *name = NULL, *owner = NULL;
        if ((e = scalar(&y, get(&y, tn, "name"), "name", &name))) break;
        if (obx__check_field("topic", name, 1, OBX_TOPIC_MAX, OBX__CS_NAME)) {
            e = yerr(&y, get(&y, tn, "name"), "%s", obx_errmsg());
            break;
        }
        yaml_node_t *on = get(&y, tn, "owner");
        if (on && (e = scalar(&y, on, "owner", &owner))) break;
        topic *v = realloc(m->t, (m->nt + 1) * sizeof *v);
        if (!v) {
            e = obx__fail(OBX_ENOMEM, "catalog: out of memory");
            break;
        }
        m->t = v;
        topic *t = &m->t[m->nt++];
        memset(t, 0, sizeof *t);
        t->line = line_of(tn);
        if (!(t->name = obx__strdup(name)) || (owner && !(t->owner = obx__strdup(owner)))) {
            e = obx__fail(OBX_ENOMEM, "catalog: out of memory");
            break;
        }
        if ((e = names(&y, get(&y, tn, "event_types"), "event_types", OBX__CS_EVENT_TYPE,
                       OBX_NAME_MAX, &t->types)) ||
            (e = names(&y, get(&y, tn, "subscribers"), "subscribers", OBX__CS_NAME, OBX_NAME_MAX,
                       &t->subscribers)))
            break;
    }
    yaml_document_delete(&y.doc);
    return e;
}

static obx_err load_consumers(model *m, const char *path) {
    ydoc y;
    obx_err e = yload(&y, path);
    if (e) return e;
    yaml_node_t *root = yaml_document_get_root_node(&y.doc), *list = NULL;
    static const char *const root_keys[] = {"consumers", NULL};
    static const char *const keys[] = {"id", "topics", "event_types", NULL};
    if (!root || root->type != YAML_MAPPING_NODE)
        e = yerr(&y, root, "expected a mapping with 'consumers'");
    if (!e) e = only_keys(&y, root, root_keys);
    if (!e && (!(list = get(&y, root, "consumers")) || list->type != YAML_SEQUENCE_NODE))
        e = yerr(&y, list ? list : root, "consumers: expected a list");
    for (yaml_node_item_t *it = list && !e ? list->data.sequence.items.start : NULL;
         it && !e && it < list->data.sequence.items.top; it++) {
        yaml_node_t *cn = yaml_document_get_node(&y.doc, *it);
        const char *id = NULL;
        if (!cn || cn->type != YAML_MAPPING_NODE) {
            e = yerr(&y, cn, "a consumer is a mapping (id, topics, event_types)");
            break;
        }
        if ((e = only_keys(&y, cn, keys)) || (e = scalar(&y, get(&y, cn, "id"), "id", &id))) break;
        if (obx__check_field("consumer id", id, 1, OBX_NAME_MAX, OBX__CS_NAME)) {
            e = yerr(&y, get(&y, cn, "id"), "%s", obx_errmsg());
            break;
        }
        consumer *c = add_consumer(m, id, path, line_of(cn));
        if (!c) {
            e = obx__fail(OBX_ENOMEM, "catalog: out of memory");
            break;
        }
        if ((e = names(&y, get(&y, cn, "topics"), "topics", OBX__CS_NAME, OBX_TOPIC_MAX,
                       &c->topics)) ||
            (e = names(&y, get(&y, cn, "event_types"), "event_types", OBX__CS_EVENT_TYPE,
                       OBX_NAME_MAX, &c->types)))
            break;
    }
    yaml_document_delete(&y.doc);
    return e;
}

/* "ID=TOPIC[,TOPIC...]" from the command line. */
static obx_err load_subscription(model *m, const char *decl) {
    const char *eq = strchr(decl, '=');
    char id[OBX_NAME_MAX + 1];
    if (!eq || eq == decl || (size_t)(eq - decl) > OBX_NAME_MAX || !eq[1])
        return obx__fail(OBX_EINVAL, "subscription '%s' is not CONSUMER=TOPIC[,TOPIC...]", decl);
    snprintf(id, sizeof id, "%.*s", (int)(eq - decl), decl);
    obx_err e = obx__check_field("consumer id", id, 1, OBX_NAME_MAX, OBX__CS_NAME);
    consumer *c = e ? NULL : add_consumer(m, id, "the command line", 0);
    if (!e && !c) e = obx__fail(OBX_ENOMEM, "catalog: out of memory");
    char *copy = e ? NULL : obx__strdup(eq + 1);
    for (char *save = NULL, *t = copy ? strtok_r(copy, ",", &save) : NULL; t && !e;
         t = strtok_r(NULL, ",", &save)) {
        e = obx__check_field("topic", t, 1, OBX_TOPIC_MAX, OBX__CS_NAME);
        if (!e && !nl_has(&c->topics, t)) e = nl_push(&c->topics, t, 0);
    }
    free(copy);
    return e;
}

/* The topics a consumer actually consumed: its watermarks in its inbox database. */
static obx_err load_consumer_db(model *m, const char *decl) {
    obx__consumer_set cs;
    obx_err e = obx__consumer_set_init(&cs, &decl, 1);
    cs.open_flags = OBX_STORE_READ_ONLY; /* its watermarks are only read */
    if (e) return e;
    obx__watermark_row *w = NULL;
    size_t n = 0;
    if (!(e = obx__consumer_open(&cs, 0)))
        e = obx__st_watermark_list(cs.v[0].s, cs.v[0].id, &w, &n);
    char source[1100];
    snprintf(source, sizeof source, "watermarks in %s", cs.v[0].url_redacted);
    consumer *c = e ? NULL : add_consumer(m, cs.v[0].id, source, 0);
    if (!e && !c) e = obx__fail(OBX_ENOMEM, "catalog: out of memory");
    for (size_t i = 0; !e && i < n; i++)
        if (!nl_has(&c->topics, w[i].topic)) e = nl_push(&c->topics, w[i].topic, 0);
    free(w);
    obx__consumer_set_free(&cs);
    return e;
}

/* ---- checks ------------------------------------------------------------------------------------
 */

static void check_catalog(model *m, name_list *all_topics, name_list *all_types) {
    for (size_t i = 0; i < m->nt; i++) {
        topic *t = &m->t[i];
        char base[260];
        if (split_version(t->name, base, sizeof base) < 0)
            finding(m, "topic-unversioned", t->name, t->line, NULL,
                    "topic names carry their contract version (e.g. %s.v1): a breaking change "
                    "gets a new topic that old and new consumers can run side by side",
                    t->name);
        if (!t->owner)
            finding(m, "topic-without-owner", t->name, t->line, NULL,
                    "every topic has an owner who owns its contract");
        if (nl_has(all_topics, t->name))
            finding(m, "duplicate-topic", t->name, t->line, NULL, "declared twice in the catalog");
        else {
            const char *near;
            if (spelling_twin(all_topics, t->name, &near))
                finding(m, "spelling-drift", t->name, t->line, near,
                        "declared next to the near-identical topic '%s'", near);
            nl_push(all_topics, t->name, t->line);
        }
        for (size_t j = 0; j < t->types.n; j++) {
            const char *ty = t->types.v[j], *near;
            if (nl_has(all_types, ty)) {
                finding(m, "type-on-two-topics", ty, t->types.line[j], NULL,
                        "event type declared on more than one topic (also on %s)", t->name);
                continue;
            }
            if (spelling_twin(all_types, ty, &near))
                finding(m, "spelling-drift", ty, t->types.line[j], near,
                        "declared next to the near-identical event type '%s'", near);
            nl_push(all_types, ty, t->types.line[j]);
        }
    }
}

static const char *topic_of_type(model *m, const char *type) {
    for (size_t i = 0; i < m->nt; i++)
        if (nl_has(&m->t[i].types, type)) return m->t[i].name;
    return NULL;
}

static void undeclared(model *m, const char *kind, const char *subject, const name_list *declared,
                       const char *what, const char *where) {
    const char *near;
    kinship k = closest(declared, subject, &near);
    if (k == SPELLING)
        finding(m, "spelling-drift", subject, 0, near,
                "%s '%s' (%s) is not in the catalog; the catalog has '%s'", what, subject, where,
                near);
    else if (k == VERSION)
        finding(m, "version-drift", subject, 0, near,
                "%s '%s' (%s) is not in the catalog, which has version '%s'", what, subject, where,
                near);
    else
        finding(m, kind, subject, 0, NULL, "%s '%s' (%s) is not in the catalog", what, subject,
                where);
}

static obx_err check_routes(model *m, obx_store *s, const name_list *all_topics,
                            const name_list *all_types, size_t *n_routes) {
    obx__route_row *r = NULL;
    size_t n = 0;
    obx_err e = obx__st_route_list(s, false, &r, &n);
    if (e) return e;
    *n_routes = n;
    name_list routed = {0};
    for (size_t i = 0; i < n; i++) {
        char where[400];
        snprintf(where, sizeof where, "route generation %lld to %s/%s", (long long)r[i].gen,
                 r[i].cluster, r[i].topic);
        nl_push(&routed, r[i].event_type, 0);
        const char *declared_on = topic_of_type(m, r[i].event_type);
        if (!declared_on) {
            undeclared(m, "route-type-undeclared", r[i].event_type, all_types, "routed event type",
                       where);
            continue;
        }
        if (strcmp(declared_on, r[i].topic)) {
            kinship k = relate(r[i].topic, declared_on);
            finding(m,
                    k == SPELLING  ? "spelling-drift"
                    : k == VERSION ? "version-drift"
                                   : "route-topic-mismatch",
                    r[i].event_type, 0, declared_on,
                    "routed to topic '%s' (%s) but declared on '%s'", r[i].topic, where,
                    declared_on);
        }
    }
    (void)all_topics;
    for (size_t i = 0; i < m->nt; i++)
        for (size_t j = 0; j < m->t[i].types.n; j++)
            if (!nl_has(&routed, m->t[i].types.v[j]))
                finding(m, "type-without-route", m->t[i].types.v[j], m->t[i].types.line[j], NULL,
                        "declared on %s but this outbox has no route for it: nothing publishes "
                        "it here",
                        m->t[i].name);
    nl_free(&routed);
    free(r);
    return OBX_OK;
}

static void check_consumers(model *m, const name_list *all_topics, const name_list *all_types) {
    for (size_t i = 0; i < m->nc; i++) {
        consumer *c = &m->c[i];
        char where[1200];
        snprintf(where, sizeof where, "consumer %s, %s", c->id, c->source);
        for (size_t j = 0; j < c->topics.n; j++) {
            topic *t = find_topic(m, c->topics.v[j]);
            if (!t)
                undeclared(m, "subscription-undeclared-topic", c->topics.v[j], all_topics,
                           "subscribed topic", where);
            else if (!nl_has(&t->subscribers, c->id))
                finding(m, "subscriber-not-in-catalog", c->id, t->line, NULL,
                        "subscribes to %s at run time (%s) but the catalog's subscribers of %s "
                        "do not list it",
                        t->name, c->source, t->name);
        }
        for (size_t j = 0; j < c->types.n; j++) {
            const char *on = topic_of_type(m, c->types.v[j]);
            if (!on)
                undeclared(m, "consumer-type-undeclared", c->types.v[j], all_types,
                           "accepted event type", where);
            else if (!nl_has(&c->topics, on))
                finding(m, "type-not-subscribed", c->types.v[j], 0, NULL,
                        "consumer %s accepts %s but does not subscribe to its topic %s", c->id,
                        c->types.v[j], on);
        }
    }
    for (size_t i = 0; i < m->nt; i++) {
        topic *t = &m->t[i];
        bool consumed = false;
        for (size_t j = 0; j < m->nc; j++) consumed |= nl_has(&m->c[j].topics, t->name);
        if (!m->nc) consumed = t->subscribers.n > 0; /* no runtime given: the catalog's word */
        if (!consumed)
            finding(
                m, "topic-without-consumer", t->name, t->line, NULL, "nobody consumes this topic%s",
                m->nc ? " (no consumer subscribes to it)" : " (the catalog lists no subscriber)");
        for (size_t j = 0; m->nc && j < t->subscribers.n; j++) {
            consumer *c = find_consumer(m, t->subscribers.v[j]);
            if (!c)
                finding(m, "subscriber-unknown", t->subscribers.v[j], t->subscribers.line[j], NULL,
                        "listed as a subscriber of %s, but no consumer of that name declares any "
                        "subscription",
                        t->name);
            else if (!nl_has(&c->topics, t->name))
                finding(m, "subscriber-not-subscribed", c->id, t->subscribers.line[j], NULL,
                        "listed as a subscriber of %s, but it does not subscribe to it (%s)",
                        t->name, c->source);
        }
    }
}

obx_err obx_catalog_check(const obx_catalog_check_options *o, char **out, size_t *n_findings) {
    if (!o || !o->catalog_path || !out) return obx__fail(OBX_EINVAL, "catalog: NULL argument");
    obx__clear_error();
    *out = NULL;
    if (n_findings) *n_findings = 0;
    model m = {.findings = json_array()};
    name_list topics = {0}, types = {0};
    size_t n_routes = 0;
    obx_err e = m.findings ? load_catalog(&m, o->catalog_path)
                           : obx__fail(OBX_ENOMEM, "catalog: out of memory");
    if (!e && o->consumers_path) e = load_consumers(&m, o->consumers_path);
    for (size_t i = 0; !e && i < o->n_subscriptions; i++)
        e = load_subscription(&m, o->subscriptions[i]);
    for (size_t i = 0; !e && i < o->n_consumer_dbs; i++)
        e = load_consumer_db(&m, o->consumer_dbs[i]);
    if (!e) check_catalog(&m, &topics, &types);
    if (!e && o->routes) e = check_routes(&m, o->routes, &topics, &types, &n_routes);
    if (!e) check_consumers(&m, &topics, &types);
    json_t *doc = NULL;
    if (!e) {
        size_t nf = json_array_size(m.findings);
        doc = json_pack("{s:s,s:I,s:I,s:o,s:I,s:I,s:O,s:b}", "catalog", o->catalog_path, "topics",
                        (json_int_t)m.nt, "event_types", (json_int_t)types.n, "routes",
                        o->routes ? json_integer((json_int_t)n_routes) : json_null(), "consumers",
                        (json_int_t)m.nc, "findings_count", (json_int_t)nf, "findings", m.findings,
                        "ok", nf == 0);
        if (n_findings) *n_findings = nf;
    }
    nl_free(&topics);
    nl_free(&types);
    model_free(&m);
    if (e) return e;
    return obx__json_out(doc, out);
}
