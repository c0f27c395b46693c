#include "train/config_yaml.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

/* Re-prefixes the message dt_cfg_set stored with "file:line: ". */
static dt_status at_line(dt_ctx *ctx, dt_status st, const char *path, const yaml_node_t *n) {
    char msg[DT_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", ctx->err);
    return dt_fail(ctx, st, "%s:%lu: %s", path, (unsigned long)n->start_mark.line + 1, msg);
}

static const char *scalar(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

dt_status dt_yaml_load_file(dt_ctx *ctx, const char *path, const char *what, yaml_document_t *doc) {
    FILE *f = fopen(path, "rb");
    if (!f) return dt_fail(ctx, DT_ERR_CONFIG, "%s: cannot open %s: %s", path, what, strerror(errno));
    /* fopen reads a directory without complaint and libyaml then reports "input error". */
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(f);
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: is a directory, not a %s file", path, what);
    }
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        return dt_fail(ctx, DT_ERR_NOMEM, "%s: cannot initialise the YAML parser", path);
    }
    yaml_parser_set_input_file(&parser, f);
    dt_status st = DT_OK;
    if (!yaml_parser_load(&parser, doc))
        st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: YAML syntax error: %s", path,
                     (unsigned long)parser.problem_mark.line + 1, parser.problem ? parser.problem : "unknown");
    yaml_parser_delete(&parser);
    fclose(f);
    return st;
}

/* Applies every key of doc (read from path, which errors name) to c; deletes doc. *n_keys:
 * how many keys it set. */
static dt_status apply_doc(dt_ctx *ctx, dt_run_cfg *c, const char *path, yaml_document_t doc, int *n_keys) {
    dt_status st = DT_OK;
    *n_keys = 0;
    char seen[64][96]; /* keys already set by this file, to refuse duplicates */
    int nseen = 0;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) goto done; /* an empty document sets nothing (dt_cfg_load_yaml refuses that) */
    if (root->type != YAML_MAPPING_NODE) {
        st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: expected a mapping of sections (model:, data:, ...)",
                     path, (unsigned long)root->start_mark.line + 1);
        goto done;
    }
    for (yaml_node_pair_t *sp = root->data.mapping.pairs.start; sp < root->data.mapping.pairs.top; sp++) {
        yaml_node_t *sk = yaml_document_get_node(&doc, sp->key);
        yaml_node_t *sv = yaml_document_get_node(&doc, sp->value);
        if (sk->type != YAML_SCALAR_NODE) {
            st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: section names must be plain words", path,
                         (unsigned long)sk->start_mark.line + 1);
            goto done;
        }
        if (sv->type != YAML_MAPPING_NODE) {
            st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: section '%s' must be a mapping of key: value",
                         path, (unsigned long)sv->start_mark.line + 1, scalar(sk));
            goto done;
        }
        for (yaml_node_pair_t *p = sv->data.mapping.pairs.start; p < sv->data.mapping.pairs.top; p++) {
            yaml_node_t *k = yaml_document_get_node(&doc, p->key);
            yaml_node_t *v = yaml_document_get_node(&doc, p->value);
            char key[96];
            if (k->type != YAML_SCALAR_NODE ||
                (size_t)snprintf(key, sizeof key, "%s.%s", scalar(sk), scalar(k)) >= sizeof key) {
                st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: bad key in section '%s'", path,
                             (unsigned long)k->start_mark.line + 1, scalar(sk));
                goto done;
            }
            char list[1024]; /* a list key's sequence as the comma list dt_cfg_set reads */
            const char *text = NULL;
            if (v->type == YAML_SEQUENCE_NODE && dt_cfg_key_is_list(key)) {
                size_t j = 0;
                list[0] = 0;
                for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
                    yaml_node_t *e = yaml_document_get_node(&doc, *it);
                    if (e->type != YAML_SCALAR_NODE || e->data.scalar.length == 0 ||
                        j + e->data.scalar.length + 2 >= sizeof list) {
                        st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: %s: expected a list of numbers", path,
                                     (unsigned long)e->start_mark.line + 1, key);
                        goto done;
                    }
                    j += (size_t)snprintf(list + j, sizeof list - j, "%s%s", j ? "," : "", scalar(e));
                }
                text = list;
            } else if (v->type != YAML_SCALAR_NODE) {
                st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: %s: expected a single value, got a %s", path,
                             (unsigned long)v->start_mark.line + 1, key,
                             v->type == YAML_SEQUENCE_NODE ? "list" : "mapping");
                goto done;
            }
            /* "key:" with nothing after it is a plain scalar "" (or "~"/"null"): refuse, since
             * silently keeping the default hides a typo; strings may be given as "". */
            if (!text && v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
                (v->data.scalar.length == 0 || !strcmp(scalar(v), "~") || !strcmp(scalar(v), "null"))) {
                st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: %s has no value", path,
                             (unsigned long)v->start_mark.line + 1, key);
                goto done;
            }
            for (int i = 0; i < nseen; i++)
                if (!strcmp(seen[i], key)) {
                    st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: %s is set twice", path,
                                 (unsigned long)k->start_mark.line + 1, key);
                    goto done;
                }
            if (nseen < 64) strcpy(seen[nseen++], key);
            st = dt_cfg_set(ctx, c, key, text ? text : scalar(v));
            if (st != DT_OK) {
                st = at_line(ctx, st, path, k);
                goto done;
            }
            ++*n_keys;
        }
    }
done:
    yaml_document_delete(&doc);
    return st;
}

dt_status dt_cfg_load_yaml(dt_ctx *ctx, dt_run_cfg *c, const char *path) {
    yaml_document_t doc;
    DT_CHECK(dt_yaml_load_file(ctx, path, "config", &doc));
    int n_keys;
    DT_CHECK(apply_doc(ctx, c, path, doc, &n_keys));
    /* An empty file (a failed copy, a truncated write) would train the defaults without a
     * word about it: a config file names at least one key. */
    if (n_keys == 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: the config file sets no keys (it is empty, or holds only comments "
                       "or empty sections); give at least one key, or leave the file out to train with the defaults",
                       path);
    return DT_OK;
}

dt_status dt_cfg_load_yaml_text(dt_ctx *ctx, dt_run_cfg *c, const char *name, const char *text) {
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) return dt_fail(ctx, DT_ERR_NOMEM, "%s: cannot initialise the YAML parser", name);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
    dt_status st = DT_OK;
    if (!yaml_parser_load(&parser, &doc))
        st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: YAML syntax error: %s", name,
                     (unsigned long)parser.problem_mark.line + 1, parser.problem ? parser.problem : "unknown");
    yaml_parser_delete(&parser);
    int n_keys;
    return st == DT_OK ? apply_doc(ctx, c, name, doc, &n_keys) : st;
}
