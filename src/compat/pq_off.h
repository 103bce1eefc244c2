/*
 * pq_off.h — the few libpq calls of the simulator's application doubles (src/app) and the demo
 * (src/cli/cmd_demo.c), for a build without PostgreSQL (OBX_WITH_POSTGRES=OFF; CMake puts this
 * folder on their include path only then). Every connection fails with "not built in", so
 * `obx sim --db postgres://...` and `obx demo --db postgres://...` say so and exit non-zero;
 * the other calls are never reached with a connection and do nothing.
 */
#ifndef OBX_PQ_OFF_H
#define OBX_PQ_OFF_H

#include <stddef.h>

typedef struct pg_conn PGconn;
typedef struct pg_result PGresult;
typedef unsigned int Oid;
typedef enum { CONNECTION_OK, CONNECTION_BAD } ConnStatusType;
typedef enum { PGRES_COMMAND_OK = 1, PGRES_TUPLES_OK, PGRES_FATAL_ERROR } ExecStatusType;

static inline PGconn *PQconnectdb(const char *conninfo) {
    (void)conninfo;
    return NULL;
}
static inline ConnStatusType PQstatus(const PGconn *c) {
    (void)c;
    return CONNECTION_BAD;
}
static inline char *PQerrorMessage(const PGconn *c) {
    (void)c;
    return (char *)"PostgreSQL support is not built in (OBX_WITH_POSTGRES=OFF)\n";
}
static inline void PQfinish(PGconn *c) { (void)c; }
static inline PGresult *PQexec(PGconn *c, const char *q) {
    (void)c, (void)q;
    return NULL;
}
static inline PGresult *PQexecParams(PGconn *c, const char *q, int n, const Oid *types,
                                     const char *const *vals, const int *lens, const int *fmts,
                                     int rfmt) {
    (void)c, (void)q, (void)n, (void)types, (void)vals, (void)lens, (void)fmts, (void)rfmt;
    return NULL;
}
static inline PGresult *PQprepare(PGconn *c, const char *name, const char *q, int n,
                                  const Oid *types) {
    (void)c, (void)name, (void)q, (void)n, (void)types;
    return NULL;
}
static inline PGresult *PQexecPrepared(PGconn *c, const char *name, int n, const char *const *vals,
                                       const int *lens, const int *fmts, int rfmt) {
    (void)c, (void)name, (void)n, (void)vals, (void)lens, (void)fmts, (void)rfmt;
    return NULL;
}
static inline ExecStatusType PQresultStatus(const PGresult *r) {
    (void)r;
    return PGRES_FATAL_ERROR;
}
static inline void PQclear(PGresult *r) { (void)r; }
static inline int PQntuples(const PGresult *r) {
    (void)r;
    return 0;
}
static inline int PQgetisnull(const PGresult *r, int row, int col) {
    (void)r, (void)row, (void)col;
    return 1;
}
static inline char *PQgetvalue(const PGresult *r, int row, int col) {
    (void)r, (void)row, (void)col;
    return (char *)"";
}

#endif
