/* YAML configuration: a good file applies every key; each kind of mistake is refused with
 * the file, the line and the key (and the closest valid key); `config show` output reads
 * back to the same configuration. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/config_yaml.h"
#include "testutil.h"

static char dir[256];

static int teardown(void **state) {
    (void)state;
    return tu_rmtree(dir);
}

static int setup(void **state) {
    (void)state;
    return tu_mkdtemp(dir, sizeof dir, "test_config");
}

static void test_good_file_sets_keys(void **state) {
    (void)state;
    const char *p = tu_write_file(dir, "good.yaml",
                               "# a comment\n"
                               "model:\n  preset: gpt2-tiny\n  n_layer: 3\n"
                               "data:\n  train: \"data/train_*.bin\"\n  shuffle: false\n"
                               "training:\n  micro_batch: 8\n  seq_len: 32\n  steps: 50\n"
                               "optimizer:\n  lr: 1e-3\n"
                               "schedule:\n  kind: linear\n  warmup: 5\n");
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_run_cfg c;
    dt_run_cfg_defaults(&c);
    assert_int_equal(dt_cfg_load_yaml(&ctx, &c, p), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &c), DT_OK);
    assert_int_equal(c.train.model.n_layer, 3);
    assert_int_equal(c.train.model.d_model, 64); /* from the preset */
    assert_string_equal(c.data_train, "data/train_*.bin");
    assert_int_equal(c.data_shuffle, 0);
    assert_int_equal(c.train.micro_batch, 8);
    assert_true(c.train.sched.lr == 1e-3f);
    assert_int_equal(c.train.sched.kind, DT_SCHED_LINEAR);
    assert_int_equal(c.train.sched.total, 50);
}

static void expect_error(const char *name, const char *text, const char *const *needles) {
    const char *p = tu_write_file(dir, name, text);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_run_cfg c;
    dt_run_cfg_defaults(&c);
    dt_status st = dt_cfg_load_yaml(&ctx, &c, p);
    if (st == DT_OK) st = dt_cfg_finish(&ctx, &c);
    assert_int_equal(st, DT_ERR_CONFIG);
    printf("  %s -> %s\n", name, ctx.err);
    for (int i = 0; needles[i]; i++)
        if (!strstr(ctx.err, needles[i])) fail_msg("'%s' does not contain '%s'", ctx.err, needles[i]);
}

static void test_mistakes_name_file_line_and_key(void **state) {
    (void)state;
    expect_error("unknown.yaml", "model:\n  n_layer: 2\n  n_layers: 3\n",
                 (const char *[]){"unknown.yaml:3:", "model.n_layers", "model.n_layer'", NULL});
    expect_error("section.yaml", "trainig:\n  steps: 3\n",
                 (const char *[]){"section.yaml:2:", "trainig.steps", "training.steps", NULL});
    expect_error("type.yaml", "training:\n  micro_batch: eight\n",
                 (const char *[]){"type.yaml:2:", "training.micro_batch", "integer", NULL});
    expect_error("float.yaml", "optimizer:\n  lr: fast\n",
                 (const char *[]){"float.yaml:2:", "optimizer.lr", NULL});
    expect_error("dup.yaml", "training:\n  steps: 3\n  steps: 4\n",
                 (const char *[]){"dup.yaml:3:", "set twice", NULL});
    expect_error("list.yaml", "data:\n  train: [a, b]\n",
                 (const char *[]){"list.yaml:2:", "data.train", "list", NULL});
    expect_error("empty.yaml", "training:\n  steps:\n",
                 (const char *[]){"empty.yaml:2:", "training.steps", "no value", NULL});
    expect_error("syntax.yaml", "model:\n  n_layer: [1,\n",
                 (const char *[]){"syntax.yaml:", "syntax", NULL});
    expect_error("flat.yaml", "- a\n- b\n", (const char *[]){"flat.yaml:1:", "mapping", NULL});
    expect_error("notmap.yaml", "model: gpt2\n", (const char *[]){"notmap.yaml:1:", "model", NULL});
    expect_error("enum.yaml", "data:\n  tokenizer: sentencepiece\n",
                 (const char *[]){"enum.yaml:2:", "data.tokenizer", "byte|gpt2", NULL});
    expect_error("shape.yaml", "model:\n  n_head: 5\n", (const char *[]){"model.n_head", "divide", NULL});
    /* A file that sets nothing would train the defaults without a word: refused. */
    expect_error("void.yaml", "", (const char *[]){"void.yaml: the config file sets no keys", NULL});
    expect_error("comments.yaml", "# nothing here\n\n", (const char *[]){"comments.yaml:", "sets no keys", NULL});
    expect_error("nokeys.yaml", "model: {}\n", (const char *[]){"nokeys.yaml:", "sets no keys", NULL});
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_run_cfg c;
    dt_run_cfg_defaults(&c);
    assert_int_equal(dt_cfg_load_yaml(&ctx, &c, "/nonexistent/x.yaml"), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "/nonexistent/x.yaml"));
    /* A directory: said so, not libyaml's "input error". */
    char sub[300];
    snprintf(sub, sizeof sub, "%s/adir.yaml", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    assert_int_equal(dt_cfg_load_yaml(&ctx, &c, sub), DT_ERR_CONFIG);
    printf("  adir.yaml -> %s\n", ctx.err);
    assert_non_null(strstr(ctx.err, "adir.yaml: is a directory, not a config file"));
}

static void test_show_output_reads_back(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_run_cfg a, b;
    dt_run_cfg_defaults(&a);
    assert_int_equal(dt_cfg_set(&ctx, &a, "model.preset", "bench-small"), DT_OK);
    assert_int_equal(dt_cfg_set(&ctx, &a, "data.val", "v \"quoted\" \\ path"), DT_OK);
    assert_int_equal(dt_cfg_set(&ctx, &a, "optimizer.lr", "0.000123"), DT_OK);
    assert_int_equal(dt_cfg_set(&ctx, &a, "training.seq_len", "128"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &a), DT_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/show.yaml", dir);
    FILE *f = fopen(path, "w");
    dt_cfg_print(f, &a);
    fclose(f);
    dt_run_cfg_defaults(&b);
    assert_int_equal(dt_cfg_load_yaml(&ctx, &b, path), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &b), DT_OK);
    char *sa = NULL, *sb = NULL;
    size_t na, nb;
    FILE *fa = open_memstream(&sa, &na), *fb = open_memstream(&sb, &nb);
    dt_cfg_print(fa, &a);
    dt_cfg_print(fb, &b);
    fclose(fa);
    fclose(fb);
    assert_string_equal(sa, sb);
    assert_string_equal(b.data_val, "v \"quoted\" \\ path");
    free(sa);
    free(sb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_file_sets_keys),
        cmocka_unit_test(test_mistakes_name_file_line_and_key),
        cmocka_unit_test(test_show_output_reads_back),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
