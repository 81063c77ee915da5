/*
 * The broker benchmark's client without Python: librdkafka's C API, so the figures measure the
 * brokers and not the cost of creating Python objects per record (which caps a confluent-kafka
 * consume loop near 1M records/s, below what either broker serves).
 *
 * benchmarks/broker.py builds this file with the system compiler against the librdkafka that the
 * installed confluent-kafka wheel bundles, and runs it with --client c. Usage:
 *
 *   rdkafka_bench produce BOOTSTRAP TOPIC COUNT VALUE_SIZE PER_TXN [KEY=VALUE ...]   (PER_TXN 0: no transactions)
 *   rdkafka_bench consume BOOTSTRAP TOPIC COUNT ISOLATION [KEY=VALUE ...]             (partition 0 from offset 0)
 *
 * KEY=VALUE pairs are further librdkafka settings, applied last.
 *
 * It prints one JSON object: records, seconds, value_bytes and, for transactions, commit latencies (ms).
 * Any client error, or a consumed offset that does not rise (a repeat or a reordering), exits non-zero.
 */
#include <librdkafka/rdkafka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *detail) {
    fprintf(stderr, "rdkafka_bench: %s: %s\n", what, detail ? detail : "");
    exit(2);
}

static void set(rd_kafka_conf_t *conf, const char *name, const char *value) {
    char err[512];
    if (rd_kafka_conf_set(conf, name, value, err, sizeof err) != RD_KAFKA_CONF_OK)
        die(name, err);
}

static void check_error(const char *what, rd_kafka_error_t *error) {
    if (error) die(what, rd_kafka_error_string(error));
}

static char **extra_settings;
static int extra_count;

static void set_extra(rd_kafka_conf_t *conf) {
    for (int i = 0; i < extra_count; i++) {
        char *pair = strdup(extra_settings[i]);
        char *eq = strchr(pair, '=');
        if (!eq) die("setting is not KEY=VALUE", pair);
        *eq = '\0';
        set(conf, pair, eq + 1);
        free(pair);
    }
}

static long delivery_failures;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    (void)opaque;
    if (m->err) {
        if (delivery_failures++ == 0) fprintf(stderr, "delivery failed: %s\n", rd_kafka_err2str(m->err));
    }
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest rank, like benchmarks/broker.py. */
static double percentile(double *sorted, long n, double pct) {
    long rank = (long)(pct / 100.0 * (double)n + 0.999999);
    if (rank < 1) rank = 1;
    return sorted[rank - 1];
}

static void produce_one(rd_kafka_t *rk, rd_kafka_topic_t *topic, char *value, size_t size) {
    while (rd_kafka_produce(topic, 0, RD_KAFKA_MSG_F_COPY, value, size, NULL, 0, NULL) == -1) {
        rd_kafka_resp_err_t err = rd_kafka_last_error();
        if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL) die("produce", rd_kafka_err2str(err));
        rd_kafka_poll(rk, 5);
    }
}

static int run_produce(const char *bootstrap, const char *topic_name, long count, size_t value_size, long per_txn) {
    char err[512], id[64];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    set(conf, "bootstrap.servers", bootstrap);
    set(conf, "enable.idempotence", "true");
    set(conf, "acks", "all");
    set(conf, "linger.ms", "5");
    set(conf, "log_level", "3");
    if (per_txn > 0) {
        snprintf(id, sizeof id, "bench-c-%ld-%ld", (long)time(NULL), (long)clock());
        set(conf, "transactional.id", id);
    }
    set_extra(conf);
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!rk) die("rd_kafka_new", err);
    rd_kafka_topic_t *topic = rd_kafka_topic_new(rk, topic_name, NULL);
    char *value = malloc(value_size);
    for (size_t i = 0; i < value_size; i++) value[i] = (char)(rand() & 0xff);

    /* Warm-up before the clock starts: connections, metadata, the producer id (and one transaction). */
    if (per_txn > 0) {
        check_error("init_transactions", rd_kafka_init_transactions(rk, 30000));
        check_error("begin_transaction", rd_kafka_begin_transaction(rk));
    }
    produce_one(rk, topic, value, value_size);
    if (per_txn > 0)
        check_error("commit_transaction", rd_kafka_commit_transaction(rk, 30000));
    else if (rd_kafka_flush(rk, 30000) != RD_KAFKA_RESP_ERR_NO_ERROR)
        die("flush", "warm-up record not acknowledged");

    long transactions = per_txn > 0 ? (count + per_txn - 1) / per_txn : 0;
    double *commits = calloc((size_t)(transactions > 0 ? transactions : 1), sizeof(double));
    double start = now();
    if (per_txn > 0) {
        long sent = 0;
        for (long t = 0; t < transactions; t++) {
            check_error("begin_transaction", rd_kafka_begin_transaction(rk));
            long n = count - sent < per_txn ? count - sent : per_txn;
            for (long i = 0; i < n; i++) produce_one(rk, topic, value, value_size);
            sent += n;
            double c0 = now();
            check_error("commit_transaction", rd_kafka_commit_transaction(rk, 60000));
            commits[t] = (now() - c0) * 1000.0;
        }
    } else {
        for (long i = 0; i < count; i++) {
            produce_one(rk, topic, value, value_size);
            if ((i & 1023) == 0) rd_kafka_poll(rk, 0);
        }
        if (rd_kafka_flush(rk, 120000) != RD_KAFKA_RESP_ERR_NO_ERROR) die("flush", "records not acknowledged");
    }
    double seconds = now() - start;
    rd_kafka_poll(rk, 0);
    if (delivery_failures) die("delivery", "some records failed (see above)");
    printf("{\"records\": %ld, \"seconds\": %.6f, \"value_bytes\": %zu", count, seconds, value_size);
    if (transactions > 0) {
        qsort(commits, (size_t)transactions, sizeof(double), compare_doubles);
        printf(", \"transactions\": %ld, \"commit_p50_ms\": %.3f, \"commit_p99_ms\": %.3f, \"commit_max_ms\": %.3f",
               transactions, percentile(commits, transactions, 50), percentile(commits, transactions, 99),
               commits[transactions - 1]);
    }
    printf("}\n");
    rd_kafka_topic_destroy(topic);
    rd_kafka_destroy(rk);
    free(value);
    free(commits);
    return 0;
}

/* Messages per rd_kafka_consume_batch_queue() call: the call confluent-kafka's Consumer.consume(num_messages)
 * makes, with the 10,000 the Python workloads ask for. One queue lock per batch, not per message. */
#define BATCH 10000

static int run_consume(const char *bootstrap, const char *topic_name, long count, const char *isolation) {
    char err[512], group[64];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    snprintf(group, sizeof group, "bench-c-%ld-%ld", (long)time(NULL), (long)clock());
    set(conf, "bootstrap.servers", bootstrap);
    set(conf, "group.id", group);
    set(conf, "enable.auto.commit", "false");
    set(conf, "isolation.level", isolation);
    set(conf, "fetch.queue.backoff.ms", "10"); /* as the Python consumer: no 1 s pause at 100k queued */
    set(conf, "log_level", "3");
    set_extra(conf);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk) die("rd_kafka_new", err);
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *partitions = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(partitions, topic_name, 0)->offset = 0;

    /* Warm-up before the clock starts, as for the producer, and as the Python consumer is timed from its
     * assignment: a ListOffsets to the partition's leader, so metadata is known and the connection to the
     * leader is up when the clock starts (it took 6-17 ms against either broker). */
    int64_t low, high;
    rd_kafka_resp_err_t warm = rd_kafka_query_watermark_offsets(rk, topic_name, 0, &low, &high, 30000);
    if (warm != RD_KAFKA_RESP_ERR_NO_ERROR) die("query_watermark_offsets", rd_kafka_err2str(warm));

    double start = now();
    if (rd_kafka_assign(rk, partitions) != RD_KAFKA_RESP_ERR_NO_ERROR) die("assign", topic_name);
    long seen = 0;
    int64_t last_offset = -1;
    size_t value_bytes = 0;
    rd_kafka_queue_t *queue = rd_kafka_queue_get_consumer(rk);
    rd_kafka_message_t *batch[BATCH];
    while (seen < count) {
        ssize_t got = rd_kafka_consume_batch_queue(queue, 500, batch, BATCH);
        if (got < 0) die("consume", rd_kafka_err2str(rd_kafka_last_error()));
        if (got == 0 && now() - start > 600) die("consume", "timed out");
        for (ssize_t i = 0; i < got; i++) {
            rd_kafka_message_t *m = batch[i];
            if (m->err) {
                if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) die("consume", rd_kafka_message_errstr(m));
            } else {
                /* Under read_committed, control records and aborted data leave gaps; never a step back. */
                if (m->offset <= last_offset) die("consume", "offsets went backwards");
                last_offset = m->offset;
                value_bytes += m->len;
                seen++;
            }
            rd_kafka_message_destroy(m);
        }
    }
    rd_kafka_queue_destroy(queue);
    double seconds = now() - start;
    printf("{\"records\": %ld, \"seconds\": %.6f, \"value_bytes\": %zu, \"last_offset\": %" PRId64 "}\n", seen,
           seconds, seen ? value_bytes / (size_t)seen : 0, last_offset);
    rd_kafka_topic_partition_list_destroy(partitions);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 7 && strcmp(argv[1], "produce") == 0) {
        extra_settings = argv + 7;
        extra_count = argc - 7;
        return run_produce(argv[2], argv[3], atol(argv[4]), (size_t)atol(argv[5]), atol(argv[6]));
    }
    if (argc >= 6 && strcmp(argv[1], "consume") == 0) {
        extra_settings = argv + 6;
        extra_count = argc - 6;
        return run_consume(argv[2], argv[3], atol(argv[4]), argv[5]);
    }
    fprintf(stderr, "usage: %s produce BOOTSTRAP TOPIC COUNT VALUE_SIZE PER_TXN [KEY=VALUE ...] | "
            "consume BOOTSTRAP TOPIC COUNT ISOLATION [KEY=VALUE ...]\n", argv[0]);
    return 2;
}
