/*
 * exec_handler.c — `obx consume --exec CMD`: an inbox handler that runs a command per message.
 * It owns the child process of each call: /bin/sh -c CMD in a process group of its own, the
 * payload on its stdin, the obx headers in its environment (OBX_EVENT_ID, OBX_EFFECT_KEY, ...),
 * its stdout (the first line, as the inbox's result) and its stderr (passed through, the last
 * line kept as the failure's reason).
 *
 * Outcome: exit 0 applies; exit poison_exit parks the message at once (OBX_EPOISON); any other
 * exit, a signal or the timeout (the whole process group is killed) is a failure the inbox
 * retries and parks after --max-failures. The inbox commits its receipt only after the command
 * ended with 0, and the broker is acknowledged only after that commit. The command's effect
 * is outside the inbox's transaction: after a crash between its exit and the commit, it runs
 * again for the same event with the same OBX_EFFECT_KEY (docs/inbox-sql.md) — an effect that
 * must happen once is keyed on it.
 *
 * Values from the message reach the command only through its environment and stdin, never
 * through the shell's command line.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum { OUT_KEEP = 4096, ERR_KEEP = 2048, N_VARS = 20 };

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The environment of the command: the consumer's own, without any inherited OBX_* variable of
 * the names set here, plus those. *out and its strings are malloc'ed (free_env). */
static char **make_env(const exec_handler *x, const obx_message *m, const char *effect_key) {
    char num[8][32];
    snprintf(num[0], sizeof num[0], "%d", m->envelope_gen);
    snprintf(num[1], sizeof num[1], "%lld", (long long)m->aggregate_version);
    snprintf(num[2], sizeof num[2], "%lld", (long long)m->occurred_at);
    snprintf(num[3], sizeof num[3], "%d", (int)m->partition);
    snprintf(num[4], sizeof num[4], "%lld", (long long)m->offset);
    snprintf(num[5], sizeof num[5], "%d", m->redelivered ? 1 : 0);
    const char *vars[N_VARS][2] = {
        {"OBX_CONSUMER_ID", x->consumer},
        {"OBX_EVENT_ID", m->event_id},
        {"OBX_ENVELOPE_GEN", num[0]},
        {"OBX_EVENT_TYPE", m->event_type},
        {"OBX_TENANT", m->tenant},
        {"OBX_AGGREGATE_TYPE", m->aggregate_type},
        {"OBX_AGGREGATE_ID", m->aggregate_id},
        {"OBX_AGGREGATE_VERSION", num[1]},
        {"OBX_CORRELATION_ID", m->correlation_id},
        {"OBX_CAUSATION_ID", m->causation_id},
        {"OBX_TRACEPARENT", m->traceparent},
        {"OBX_OCCURRED_AT", num[2]},
        {"OBX_PAYLOAD_DIGEST", m->payload_digest},
        {"OBX_TOPIC", m->topic},
        {"OBX_PARTITION", num[3]},
        {"OBX_OFFSET", num[4]},
        {"OBX_REDELIVERED", num[5]},
        {"OBX_EFFECT_KEY", effect_key},
    };
    size_t n = 0;
    while (environ[n]) n++;
    char **env = calloc(n + N_VARS + 1, sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool ours = false;
        for (size_t v = 0; v < N_VARS && vars[v][0]; v++) {
            size_t l = strlen(vars[v][0]);
            if (!strncmp(environ[i], vars[v][0], l) && environ[i][l] == '=') ours = true;
        }
        if (!ours && !(env[k++] = strdup(environ[i]))) goto oom;
    }
    for (size_t v = 0; v < N_VARS && vars[v][0]; v++) {
        const char *val = vars[v][1] ? vars[v][1] : "";
        size_t len = strlen(vars[v][0]) + strlen(val) + 2;
        if (!(env[k] = malloc(len))) goto oom;
        snprintf(env[k++], len, "%s=%s", vars[v][0], val);
    }
    return env;
oom:
    for (size_t i = 0; i < k; i++) free(env[i]);
    free(env);
    return NULL;
}

static void free_env(char **env) {
    for (size_t i = 0; env && env[i]; i++) free(env[i]);
    free(env);
}

/* The last non-empty line of buf (modified in place). */
static const char *last_line(char *buf) {
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = '\0';
    char *nl = strrchr(buf, '\n');
    return nl ? nl + 1 : buf;
}

/* One run of the command, between its phases (exec_handler_run and its helpers below). */
typedef struct exec_child {
    pid_t pid;
    int in_fd, out_fd, err_fd;    /* our ends of its stdin, stdout, stderr; -1 once closed */
    const unsigned char *payload; /* the message's payload, written to its stdin */
    size_t payload_len, sent;
    char obuf[OUT_KEEP + 1], ebuf[ERR_KEEP + 1]; /* stdout's head, stderr's tail */
    size_t olen, elen;
    bool timed_out, exited;
    int st; /* its wait status, once exited */
} exec_child;

/* Start: the pipes and /bin/sh -c CMD in its own process group with the message's environment;
 * on failure nothing is left open. */
static obx_err exec_start(const exec_handler *x, const obx_message *m, const char *effect_key,
                          exec_child *c) {
    int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
    char **env = make_env(x, m, effect_key);
    if (!env) return obx_error_set(OBX_ENOMEM, "exec: out of memory");
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC)) {
        int saved = errno;
        for (int i = 0; i < 2; i++) {
            if (in[i] >= 0) close(in[i]);
            if (out[i] >= 0) close(out[i]);
            if (err[i] >= 0) close(err[i]);
        }
        free_env(env);
        char msg[160];
        snprintf(msg, sizeof msg, "exec: pipe: %s", strerror(saved));
        return obx_error_set(OBX_EHANDLER, msg);
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    posix_spawnattr_init(&at);
    /* its own process group: a timeout kills the command and everything it started; default
     * signal dispositions and an empty mask (the consumer blocks SIGINT/SIGTERM for itself) */
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
    char *argv[] = {"sh", "-c", (char *)x->cmd, NULL};
    int rc = posix_spawn(&c->pid, "/bin/sh", &fa, &at, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    free_env(env);
    close(in[0]);
    close(out[1]);
    close(err[1]);
    if (rc) {
        close(in[1]);
        close(out[0]);
        close(err[0]);
        char msg[160];
        snprintf(msg, sizeof msg, "exec: cannot start /bin/sh: %s", strerror(rc));
        return obx_error_set(OBX_EHANDLER, msg);
    }
    fcntl(in[1], F_SETFL, O_NONBLOCK);
    c->in_fd = in[1];
    c->out_fd = out[0];
    c->err_fd = err[0];
    return OBX_OK;
}

/* Stdin: writes what it takes of the rest of the payload; closes it when done or refused. */
static void exec_feed(exec_child *c) {
    ssize_t w = write(c->in_fd, c->payload + c->sent, c->payload_len - c->sent);
    if (w > 0) c->sent += (size_t)w;
    /* done, or the command closed its stdin (EPIPE: SIGPIPE is ignored) */
    if (c->sent == c->payload_len || (w < 0 && errno != EAGAIN && errno != EINTR)) {
        close(c->in_fd);
        c->in_fd = -1;
    }
}

/* Stdout: keeps its first OUT_KEEP bytes, reads and drops the rest; closes it at EOF. */
static void exec_read_out(exec_child *c) {
    char chunk[4096];
    ssize_t r = read(c->out_fd, chunk, sizeof chunk);
    if (r > 0 && c->olen < OUT_KEEP) {
        size_t k = (size_t)r < OUT_KEEP - c->olen ? (size_t)r : OUT_KEEP - c->olen;
        memcpy(c->obuf + c->olen, chunk, k);
        c->olen += k;
    } else if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
        close(c->out_fd);
        c->out_fd = -1;
    }
}

/* Stderr: passed through to ours, its last ERR_KEEP bytes kept; closes it at EOF. */
static void exec_read_err(exec_child *c) {
    char chunk[4096];
    ssize_t r = read(c->err_fd, chunk, sizeof chunk);
    if (r > 0) {
        /* the command's diagnostics go to the consumer's stderr; the tail is kept */
        fwrite(chunk, 1, (size_t)r, stderr);
        if ((size_t)r >= ERR_KEEP) {
            memcpy(c->ebuf, chunk + r - ERR_KEEP, ERR_KEEP);
            c->elen = ERR_KEEP;
        } else {
            if (c->elen + (size_t)r > ERR_KEEP) {
                size_t drop = c->elen + (size_t)r - ERR_KEEP;
                memmove(c->ebuf, c->ebuf + drop, c->elen - drop);
                c->elen -= drop;
            }
            memcpy(c->ebuf + c->elen, chunk, (size_t)r);
            c->elen += (size_t)r;
        }
    } else if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
        close(c->err_fd);
        c->err_fd = -1;
    }
}

/* Run: feeds stdin and reads stdout and stderr until both close (or the command ended and a
 * moment passed), killing the process group at the timeout; then closes every pipe and reaps
 * the command. */
static void exec_wait(exec_child *c, long timeout_ms) {
    long long deadline = now_ms() + timeout_ms, drained = 0;
    while (c->out_fd >= 0 || c->err_fd >= 0) {
        struct pollfd p[3] = {
            {c->in_fd, POLLOUT, 0}, {c->out_fd, POLLIN, 0}, {c->err_fd, POLLIN, 0}};
        /* the command ended but something it started keeps its stdout or stderr open: what
         * it wrote is read for a moment more, then the outcome is the command's own */
        if (!c->exited && waitpid(c->pid, &c->st, WNOHANG) == c->pid) {
            c->exited = true;
            drained = now_ms() + 200;
        }
        if (c->exited && now_ms() >= drained) break;
        long long left = (c->exited ? drained : deadline) - now_ms();
        if (left <= 0 && !c->timed_out && !c->exited) {
            c->timed_out = true;
            kill(-c->pid, SIGKILL); /* the pipes close when the whole group is gone */
        }
        int n = poll(p, 3, c->timed_out ? 1000 : (int)(left > 100 ? 100 : left < 0 ? 0 : left));
        if (n < 0 && errno != EINTR) break;
        if (n <= 0) continue;
        if (c->in_fd >= 0 && (p[0].revents & (POLLOUT | POLLERR | POLLHUP))) exec_feed(c);
        if (c->out_fd >= 0 && (p[1].revents & (POLLIN | POLLERR | POLLHUP))) exec_read_out(c);
        if (c->err_fd >= 0 && (p[2].revents & (POLLIN | POLLERR | POLLHUP))) exec_read_err(c);
    }
    if (c->in_fd >= 0) close(c->in_fd);
    if (c->out_fd >= 0) close(c->out_fd);
    if (c->err_fd >= 0) close(c->err_fd);
    while (!c->exited && waitpid(c->pid, &c->st, 0) < 0 && errno == EINTR) {
    }
}

/* Outcome: exit 0 gives stdout's first line as the result; poison_exit is OBX_EPOISON; any
 * other ending is OBX_EHANDLER with stderr's last line as the reason. */
static obx_err exec_outcome(const exec_handler *x, exec_child *c, char *result, size_t cap) {
    int st = c->st;
    c->obuf[c->olen] = '\0';
    c->ebuf[c->elen] = '\0';
    const char *why = last_line(c->ebuf);
    char msg[512];
    if (!c->timed_out && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        const char *line = c->obuf;
        size_t l = strcspn(line, "\r\n");
        if (l >= cap) l = cap - 1;
        memcpy(result, line, l);
        result[l] = '\0';
        return OBX_OK;
    }
    if (c->timed_out)
        snprintf(msg, sizeof msg, "timed out after %ld ms (killed)%s%.300s", x->timeout_ms,
                 *why ? ": " : "", why);
    else if (WIFEXITED(st) && WEXITSTATUS(st) == x->poison_exit) {
        snprintf(msg, sizeof msg, "exit %d%s%.300s", WEXITSTATUS(st), *why ? ": " : "", why);
        return obx_error_set(OBX_EPOISON, msg);
    } else if (WIFEXITED(st))
        snprintf(msg, sizeof msg, "exit %d%s%.300s", WEXITSTATUS(st), *why ? ": " : "", why);
    else
        snprintf(msg, sizeof msg, "killed by signal %d%s%.300s", WTERMSIG(st), *why ? ": " : "",
                 why);
    return obx_error_set(OBX_EHANDLER, msg);
}

obx_err exec_handler_run(void *user, void *conn, const obx_message *m, const char *effect_key,
                         char *result, size_t cap) {
    exec_handler *x = user;
    (void)conn;
    exec_child c = {.pid = -1, .in_fd = -1, .out_fd = -1, .err_fd = -1};
    obx_err e = exec_start(x, m, effect_key, &c);
    if (e) return e;
    c.payload = m->payload;
    c.payload_len = m->payload_len;
    if (!m->payload_len) {
        close(c.in_fd);
        c.in_fd = -1;
    }
    exec_wait(&c, x->timeout_ms);
    return exec_outcome(x, &c, result, cap);
}
