/*
 * help.c — everything the CLI says about itself, printed from the command table (commands.c):
 * `obx help [COMMAND]` and `obx COMMAND --help` as wrapped text, `obx help --man` as the roff
 * man page (docs/obx.1 is its output: `cmake --build build --target man`), `obx completion
 * bash|zsh|fish` as a completion script for that shell, `obx version`. Nothing here knows a
 * command by name except `help` itself (its completion offers the command names).
 */
#include "cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#define WIDTH 80    /* text help: wrap before this column */
#define OPT_COL 28  /* text help: option descriptions start here */
#define NBSP '\x01' /* in wrap()'s text: a space that does not break the line */

static size_t n_opts(const cli_command *c) {
    size_t n = 0;
    while (n < CLI_MAX_OPTS && c->opts[n].name) n++;
    return n;
}

/* ---- text -------------------------------------------------------------------------------- */

/* Writes s word by word, wrapped before WIDTH; the first line continues at column `col` (after
 * a space when `cont`: text already stands there), later lines start at `indent`. A blank line
 * ("\n\n") in s starts a new paragraph. Returns the column after the last word. */
static int wrap(FILE *f, const char *s, int col, int indent, bool cont) {
    bool first = !cont;
    while (*s) {
        if (s[0] == '\n' && s[1] == '\n') {
            fprintf(f, "\n\n%*s", indent, "");
            col = indent;
            first = true;
            s += 2;
            continue;
        }
        if (*s == ' ' || *s == '\n') {
            s++;
            continue;
        }
        int len = (int)strcspn(s, " \n");
        if (!first && col + 1 + len >= WIDTH) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
            first = true;
        }
        if (!first) {
            fputc(' ', f);
            col++;
        }
        for (int i = 0; i < len; i++) fputc(s[i] == NBSP ? ' ' : s[i], f);
        col += len;
        first = false;
        s += len;
    }
    return col;
}

static bool required(const cli_opt *o) { return !strncmp(o->def, "required", 8); }

void cli_help_general(FILE *f) {
    fprintf(f, "obx %s - transactional outbox with delivery reconciliation\n\n", obx_libversion());
    fprintf(f, "usage: obx COMMAND [options]\n"
               "       obx COMMAND --help    that command's synopsis, options and examples\n\n"
               "commands:\n");
    for (size_t i = 0; i < cli_n_commands; i++)
        fprintf(f, "  %-14s %s\n", cli_commands[i].name, cli_commands[i].summary);
    fputc('\n', f);
    /* the second paragraph of the man page's DESCRIPTION: URLs and their defaults */
    const char *urls = strstr(cli_man_description, "\n\n");
    wrap(f, urls ? urls + 2 : cli_man_description, 0, 0, false);
    fprintf(f,
            "\n\nexit status: 0 done, 1 a finding, 2 usage error, 3 could not check\n"
            "(each command's --help says what a finding is). More in `man obx` and README.md.\n");
}

/* The configuration keys (obx_config_reference: the parser's own table), one object each. */
static json_t *config_keys(void) {
    char *js = NULL;
    if (obx_config_reference(&js)) return NULL;
    json_t *a = json_loads(js, 0, NULL);
    obx_free(js);
    return a;
}

/* "integer 100..86400000, default 30000" and the like (cap bytes). */
static void key_summary(json_t *k, char *out, size_t cap) {
    const char *type = json_string_value(json_object_get(k, "type"));
    const char *def = json_string_value(json_object_get(k, "default"));
    const char *values = json_string_value(json_object_get(k, "values"));
    size_t n = (size_t)snprintf(out, cap, "%s", type);
    if (json_object_get(k, "min"))
        n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, " %lld..%lld",
                              (long long)json_integer_value(json_object_get(k, "min")),
                              (long long)json_integer_value(json_object_get(k, "max")));
    if (values) n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, " %s", values);
    if (n < cap)
        snprintf(out + n, cap - n, "%s%s", def && *def ? ", default " : "", def && *def ? def : "");
}

/* `obx config --help` (and `obx help config`): every key of a configuration file. */
static void config_reference_text(FILE *f) {
    json_t *a = config_keys();
    fprintf(f, "\nconfiguration keys (a.b in YAML is b: under a:; a flag sets one: --set "
               "a.b=VALUE):\n");
    size_t i;
    json_t *k;
    json_array_foreach(a, i, k) {
        char sum[160];
        key_summary(k, sum, sizeof sum);
        int col = fprintf(f, "  %s", json_string_value(json_object_get(k, "key")));
        if (col >= OPT_COL - 1) {
            fprintf(f, "\n%*s", OPT_COL, "");
            col = OPT_COL;
        } else
            col += fprintf(f, "%*s", OPT_COL - col, "");
        col = wrap(f, sum, col, OPT_COL, false);
        fprintf(f, "\n%*s", OPT_COL, "");
        wrap(f, json_string_value(json_object_get(k, "help")), OPT_COL, OPT_COL, false);
        fputc('\n', f);
    }
    json_decref(a);
}

void cli_help_command(FILE *f, const cli_command *c) {
    const char *line = c->synopsis;
    for (bool first = true; *line; first = false) {
        size_t len = strcspn(line, "\n");
        fprintf(f, "%s obx", first ? "usage:" : "      ");
        /* long synopses wrap under their own first word */
        char buf[512];
        snprintf(buf, sizeof buf, "%.*s", (int)len, line);
        wrap(f, buf, 10, 13, true);
        fputc('\n', f);
        line += len + (line[len] == '\n');
    }
    fputc('\n', f);
    wrap(f, c->text, 0, 0, false);
    fprintf(f, "\n\noptions:\n");
    for (size_t i = 0; i < n_opts(c); i++) {
        const cli_opt *o = &c->opts[i];
        int col = 0;
        col += fprintf(f, "  ");
        if (o->short_name) col += fprintf(f, "-%c, ", o->short_name);
        col += fprintf(f, "--%s", o->name);
        if (o->arg) col += fprintf(f, " %s", o->arg);
        if (col >= OPT_COL - 1) {
            fprintf(f, "\n%*s", OPT_COL, "");
            col = OPT_COL;
        } else {
            col += fprintf(f, "%*s", OPT_COL - col, "");
        }
        col = wrap(f, o->text, col, OPT_COL, false);
        if (o->def) {
            char d[256];
            snprintf(d, sizeof d, required(o) ? "(%s)" : "(default:\x01%s)", o->def);
            wrap(f, d, col, OPT_COL, true);
        }
        fputc('\n', f);
    }
    fprintf(f, "  -h, --help                Show this help.\n");
    fprintf(f, "\nexit status:\n  0  done\n");
    if (c->finding) {
        fprintf(f, "  1 ");
        wrap(f, c->finding, 4, 5, true);
        fputc('\n', f);
    }
    fprintf(f, "  2  usage error (unknown option, malformed URL or value, missing required "
               "option)\n"
               "  3  could not check (unreachable, no such outbox, schema, permission)\n");
    if (!strcmp(c->name, "config")) config_reference_text(f);
    if (c->examples) {
        fprintf(f, "\nexamples:\n");
        for (const char *e = c->examples; *e;) {
            size_t len = strcspn(e, "\n");
            fprintf(f, "  %.*s\n", (int)len, e);
            e += len + (e[len] == '\n');
        }
    }
}

/* ---- man page (roff) ---------------------------------------------------------------------- */

/* s as roff text: backslashes and hyphens escaped, a control character at a line start
 * neutralised; "\n\n" becomes a paragraph break, a single '\n' a line break. */
static void roff(FILE *f, const char *s, bool *bol) {
    for (; *s; s++) {
        if (s[0] == '\n' && s[1] == '\n') {
            fprintf(f, "\n.PP\n");
            s++;
            *bol = true;
            continue;
        }
        if (*s == '\n') {
            fprintf(f, "\n.br\n");
            *bol = true;
            continue;
        }
        if (*bol && (*s == '.' || *s == '\'')) fprintf(f, "\\&");
        if (*s == '\\')
            fprintf(f, "\\e");
        else if (*s == '-')
            fprintf(f, "\\-");
        else
            fputc(*s, f);
        *bol = false;
    }
}

static void roff_line(FILE *f, const char *s) {
    bool bol = true;
    roff(f, s, &bol);
    fputc('\n', f);
}

static void man_section(FILE *f, const char *title, const char *text) {
    fprintf(f, ".SH %s\n", title);
    roff_line(f, text);
}

static void man_command(FILE *f, const cli_command *c) {
    bool bol = true;
    fprintf(f, ".SS \"obx %s\"\n.nf\n", c->name);
    for (const char *line = c->synopsis; *line;) {
        size_t len = strcspn(line, "\n");
        char buf[512];
        snprintf(buf, sizeof buf, "%.*s", (int)len, line);
        fprintf(f, "\\fBobx\\fR ");
        bol = false;
        roff(f, buf, &bol);
        fputc('\n', f);
        line += len + (line[len] == '\n');
    }
    fprintf(f, ".fi\n.PP\n");
    roff_line(f, c->text);
    for (size_t i = 0; i < n_opts(c); i++) {
        const cli_opt *o = &c->opts[i];
        fprintf(f, ".TP\n");
        if (o->short_name) fprintf(f, "\\fB\\-%c\\fR, ", o->short_name);
        fprintf(f, "\\fB\\-\\-");
        bol = false;
        roff(f, o->name, &bol);
        fprintf(f, "\\fR");
        if (o->arg) {
            fprintf(f, " \\fI");
            roff(f, o->arg, &bol);
            fprintf(f, "\\fR");
        }
        fputc('\n', f);
        bol = true;
        roff(f, o->text, &bol);
        if (o->def) {
            char d[256];
            snprintf(d, sizeof d, required(o) ? " (%s)" : " (default: %s)", o->def);
            roff(f, d, &bol);
        }
        fputc('\n', f);
    }
    fprintf(f, ".PP\n");
    char ex[512];
    snprintf(ex, sizeof ex, "Exit status 1: %s",
             c->finding ? c->finding : "never (see EXIT STATUS).");
    roff_line(f, ex);
    if (c->examples) {
        fprintf(f, ".PP\nExamples:\n.PP\n.RS\n.nf\n");
        for (const char *e = c->examples; *e;) {
            size_t len = strcspn(e, "\n");
            char buf[512];
            snprintf(buf, sizeof buf, "%.*s", (int)len, e);
            roff_line(f, buf);
            e += len + (e[len] == '\n');
        }
        fprintf(f, ".fi\n.RE\n");
    }
}

/* CONFIGURATION: every key of the relay's configuration file, from the parser's own table. */
static void man_configuration(FILE *f) {
    fprintf(f, ".SH CONFIGURATION\n");
    roff_line(f, "obx relay --config FILE (and obx config, audit, purge, watermark, status, trace) "
                 "read YAML: a dotted key is a key under its section (relay.lease_ms is lease_ms "
                 "under relay). Flags override the file: --db, --broker, --http, --id, "
                 "--broker-prop K=V and --set KEY=VALUE for any key. Unknown keys, wrong types "
                 "and values out of range are errors that name the key and the line; obx config "
                 "prints the configuration a relay would run with.");
    json_t *a = config_keys();
    size_t i;
    json_t *k;
    json_array_foreach(a, i, k) {
        char sum[200];
        key_summary(k, sum, sizeof sum);
        bool bol = false;
        fprintf(f, ".TP\n\\fB");
        roff(f, json_string_value(json_object_get(k, "key")), &bol);
        fprintf(f, "\\fR (");
        roff(f, sum, &bol);
        fprintf(f, ")\n");
        roff_line(f, json_string_value(json_object_get(k, "help")));
    }
    json_decref(a);
}

/* No date in the header: the page changes only when the table or the version does. */
static void man_page(FILE *f) {
    fprintf(f,
            ".\\\" Generated by `obx help --man` from src/cli/commands.c: edit that file, then\n"
            ".\\\" `cmake --build build --target man`. Do not edit by hand.\n"
            ".TH OBX 1 \"\" \"obx %s\" \"User Commands\"\n"
            ".SH NAME\nobx \\- transactional outbox with delivery reconciliation\n"
            ".SH SYNOPSIS\n.B obx\n.I command\n.RI [ options ]\n.br\n.B obx\n.I command\n"
            ".B \\-\\-help\n",
            obx_libversion());
    man_section(f, "DESCRIPTION", cli_man_description);
    fprintf(f, ".SH COMMANDS\n");
    for (size_t i = 0; i < cli_n_commands; i++) man_command(f, &cli_commands[i]);
    man_configuration(f);
    man_section(f, "HTTP", cli_man_http);
    man_section(f, "FILES", cli_man_files);
    man_section(f, "EXIT STATUS", cli_man_exit);
    man_section(f, "SEE ALSO", cli_man_see_also);
}

/* ---- bash completion ---------------------------------------------------------------------- */

/* An argument that names a file: complete file names after the option. */
static bool file_arg(const char *arg) {
    return arg && strncmp(arg, "sqlite:", 7) /* sqlite:PATH is a URL */ &&
           (strstr(arg, "FILE") || strstr(arg, "DIR") || strstr(arg, "PATH") ||
            strstr(arg, ".so") || !strcmp(arg, "F"));
}

/* var='--a --b' for the command's options: kind 0 all, 1 those taking an argument, 2 those
 * whose argument is a file. Nothing when there are none. */
static void list_opts(FILE *f, const char *var, const cli_command *c, int kind) {
    bool any = false;
    for (size_t j = 0; j < n_opts(c); j++) {
        const cli_opt *o = &c->opts[j];
        if ((kind == 1 && !o->arg) || (kind == 2 && !file_arg(o->arg))) continue;
        if (!any) fprintf(f, "        %s='", var);
        fprintf(f, "%s--%s", any ? " " : "", o->name);
        any = true;
    }
    if (any) fprintf(f, "'\n");
}

static void completion_bash(FILE *f) {
    fprintf(f,
            "# bash completion for obx %s: commands, subcommands, options. Generated by\n"
            "# `obx completion bash` from the CLI's command table (src/cli/commands.c).\n"
            "_obx() {\n"
            "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}\n"
            "    local cmds=\"",
            obx_libversion());
    for (size_t i = 0; i < cli_n_commands; i++)
        fprintf(f, "%s%s", i ? " " : "", cli_commands[i].name);
    fprintf(f, "\"\n"
               "    COMPREPLY=()\n"
               "    if ((COMP_CWORD == 1)); then\n"
               "        mapfile -t COMPREPLY < <(compgen -W \"$cmds --help --version\" -- "
               "\"$cur\")\n"
               "        return\n"
               "    fi\n"
               "    local subs='' opts='' args='' files=''\n"
               "    case ${COMP_WORDS[1]} in\n");
    for (size_t i = 0; i < cli_n_commands; i++) {
        const cli_command *c = &cli_commands[i];
        fprintf(f, "    %s)\n", c->name);
        if (!strcmp(c->name, "help"))
            fprintf(f, "        subs=$cmds\n");
        else if (c->subcommands)
            fprintf(f, "        subs='%s'\n", c->subcommands);
        list_opts(f, "opts", c, 0);
        list_opts(f, "args", c, 1);
        list_opts(f, "files", c, 2);
        fprintf(f, "        ;;\n");
    }
    fprintf(f, "    esac\n"
               "    # the word after an option that takes an argument is that argument\n"
               "    if [[ \" $args \" == *\" $prev \"* ]]; then\n"
               "        [[ \" $files \" == *\" $prev \"* ]] && mapfile -t COMPREPLY < <(compgen -f "
               "-- \"$cur\")\n"
               "        return\n"
               "    fi\n"
               "    if [[ $cur == -* ]]; then\n"
               "        mapfile -t COMPREPLY < <(compgen -W \"$opts --help\" -- \"$cur\")\n"
               "    elif ((COMP_CWORD == 2)) && [[ -n $subs ]]; then\n"
               "        mapfile -t COMPREPLY < <(compgen -W \"$subs\" -- \"$cur\")\n"
               "    fi\n"
               "}\n"
               "complete -F _obx obx\n");
}

/* ---- zsh and fish completion -------------------------------------------------------------- */

/* The first sentence of s, cut at a word before about 70 bytes, as a description safe inside
 * single quotes (an apostrophe becomes a typographic one) and, for zsh, inside _arguments'
 * brackets and _describe's entries (brackets become parentheses, a colon is escaped). */
static void short_text(const char *s, char *out, size_t cap, bool zsh) {
    size_t o = 0, cut = 0;
    for (; *s && o + 8 < cap; s++) {
        if (s[0] == '.' && (s[1] == ' ' || !s[1]) && !(o && out[o - 1] == '.')) break;
        if (o >= 70) {
            o = cut ? cut : o;
            o += (size_t)snprintf(out + o, cap - o, "...");
            break;
        }
        if (*s == ' ') cut = o;
        if (*s == '\'')
            o += (size_t)snprintf(out + o, cap - o, "\xe2\x80\x99");
        else if (*s == '\\' || *s == '`')
            out[o++] = '/';
        else if (zsh && (*s == '[' || *s == ']'))
            out[o++] = *s == '[' ? '(' : ')';
        else if (zsh && *s == ':')
            o += (size_t)snprintf(out + o, cap - o, "\\:");
        else
            out[o++] = *s;
    }
    out[o] = '\0';
}

static bool repeatable(const cli_opt *o) { return strstr(o->text, "Repeatable") != NULL; }

/* One command's _arguments specifications (zsh). */
static void zsh_opts(FILE *f, const cli_command *c) {
    char d[128];
    for (size_t j = 0; j < n_opts(c); j++) {
        const cli_opt *o = &c->opts[j];
        short_text(o->text, d, sizeof d, true);
        const char *rep = repeatable(o) ? "*" : "";
        if (o->short_name)
            fprintf(f, "        '(-%c --%s)'{-%c,--%s}'[%s]", o->short_name, o->name, o->short_name,
                    o->name, d);
        else
            fprintf(f, "        '%s--%s[%s]", rep, o->name, d);
        if (o->arg) fprintf(f, ":%s:%s", o->arg, file_arg(o->arg) ? "_files" : " ");
        fprintf(f, "' \\\n");
    }
    fprintf(f, "        '(- *)'{-h,--help}'[Show this help]'");
}

static void completion_zsh(FILE *f) {
    fprintf(f,
            "#compdef obx\n"
            "# zsh completion for obx %s: commands, subcommands, options. Generated by\n"
            "# `obx completion zsh` from the CLI's command table (src/cli/commands.c). Install it\n"
            "# as _obx in a folder of $fpath, or: source <(obx completion zsh)\n"
            "_obx() {\n"
            "    local context state state_descr line\n"
            "    typeset -A opt_args\n"
            "    local -a cmds\n"
            "    cmds=(\n",
            obx_libversion());
    char d[128];
    for (size_t i = 0; i < cli_n_commands; i++) {
        short_text(cli_commands[i].summary, d, sizeof d, true);
        fprintf(f, "        '%s:%s'\n", cli_commands[i].name, d);
    }
    fprintf(f, "    )\n"
               "    if ((CURRENT == 2)); then\n"
               "        _describe -t commands 'obx command' cmds\n"
               "        return\n"
               "    fi\n"
               "    local cmd=${words[2]}\n"
               "    shift words\n"
               "    ((CURRENT--))\n"
               "    case $cmd in\n");
    for (size_t i = 0; i < cli_n_commands; i++) {
        const cli_command *c = &cli_commands[i];
        fprintf(f, "    (%s)\n        _arguments -s -S \\\n", c->name);
        if (!strcmp(c->name, "help")) /* the commands, with their summaries */
            fprintf(f, "        '1:command:->command' \\\n");
        else if (c->subcommands)
            fprintf(f, "        '1:subcommand:(%s)' \\\n", c->subcommands);
        zsh_opts(f, c);
        fprintf(f, "\n");
        if (!strcmp(c->name, "help"))
            fprintf(
                f, "        [[ $state == command ]] && _describe -t commands 'obx command' cmds\n");
        fprintf(f, "        ;;\n");
    }
    fprintf(f, "    esac\n"
               "}\n"
               "if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then\n"
               "    _obx \"$@\"\n"
               "else\n"
               "    compdef _obx obx\n"
               "fi\n");
}

static void completion_fish(FILE *f) {
    fprintf(f,
            "# fish completion for obx %s: commands, subcommands, options. Generated by\n"
            "# `obx completion fish` from the CLI's command table (src/cli/commands.c).\n"
            "complete -c obx -f\n"
            "set -l obx_cmds",
            obx_libversion());
    for (size_t i = 0; i < cli_n_commands; i++) fprintf(f, " %s", cli_commands[i].name);
    fprintf(f, "\ncomplete -c obx -n \"not __fish_seen_subcommand_from $obx_cmds\" -l help -s h "
               "-d 'Show the commands'\n"
               "complete -c obx -n \"not __fish_seen_subcommand_from $obx_cmds\" -l version "
               "-d 'Print the version'\n");
    char d[128];
    for (size_t i = 0; i < cli_n_commands; i++) {
        const cli_command *c = &cli_commands[i];
        short_text(c->summary, d, sizeof d, false);
        fprintf(f,
                "complete -c obx -n \"not __fish_seen_subcommand_from $obx_cmds\" -a %s -d '%s'\n",
                c->name, d);
    }
    for (size_t i = 0; i < cli_n_commands; i++) {
        const cli_command *c = &cli_commands[i];
        const char *cond = "__fish_seen_subcommand_from";
        if (!strcmp(c->name, "help"))
            fprintf(f, "complete -c obx -n '%s help' -a \"$obx_cmds\"\n", cond);
        else if (c->subcommands)
            fprintf(f, "complete -c obx -n '%s %s; and not %s %s' -a '%s'\n", cond, c->name, cond,
                    c->subcommands, c->subcommands);
        for (size_t j = 0; j < n_opts(c); j++) {
            const cli_opt *o = &c->opts[j];
            short_text(o->text, d, sizeof d, false);
            fprintf(f, "complete -c obx -n '%s %s' -l %s", cond, c->name, o->name);
            if (o->short_name) fprintf(f, " -s %c", o->short_name);
            /* -x: an argument and no file names; -r -F: a file name */
            if (o->arg) fprintf(f, file_arg(o->arg) ? " -r -F" : " -x");
            fprintf(f, " -d '%s'\n", d);
        }
        fprintf(f, "complete -c obx -n '%s %s' -l help -s h -d 'Show this help'\n", cond, c->name);
    }
}

/* ---- the commands ------------------------------------------------------------------------- */

int cmd_help(int argc, char **argv) {
    static const struct option opts[] = {{"man", no_argument, 0, 'm'}, {0, 0, 0, 0}};
    bool man = false;
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        if (c != 'm') return cli_usage("help", "usage: obx help [COMMAND] | obx help --man");
        man = true;
    }
    if (man) {
        if (optind < argc) return cli_usage("help", "--man: no COMMAND with it");
        man_page(stdout);
        return 0;
    }
    if (optind == argc) {
        cli_help_general(stdout);
        return 0;
    }
    const cli_command *cmd = optind == argc - 1 ? cli_find_command(argv[optind]) : NULL;
    if (!cmd) {
        const char *names[64];
        size_t n = 0;
        for (size_t i = 0; i < cli_n_commands && n < 64; i++) names[n++] = cli_commands[i].name;
        const char *s = cli_suggest(argv[optind], names, n);
        return s ? cli_usage("help", "no command '%s'; did you mean '%s'?", argv[optind], s)
                 : cli_usage("help", "no command '%s' (see `obx help`)", argv[optind]);
    }
    cli_help_command(stdout, cmd);
    return 0;
}

int cmd_version(int argc, char **argv) {
    if (argc > 1) return cli_usage("version", "unexpected argument '%s'", argv[1]);
    printf("obx %s\n", obx_libversion());
    return 0;
}

int cmd_completion(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "bash"))
        completion_bash(stdout);
    else if (argc == 2 && !strcmp(argv[1], "zsh"))
        completion_zsh(stdout);
    else if (argc == 2 && !strcmp(argv[1], "fish"))
        completion_fish(stdout);
    else
        return cli_usage("completion", "usage: obx completion bash|zsh|fish");
    return 0;
}
