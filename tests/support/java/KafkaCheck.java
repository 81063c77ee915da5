import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.Future;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.TopicConfig;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Checks the broker against the Java kafka-clients library, the reference client for Kafka's protocol.
 *
 * <p>Usage: {@code java KafkaCheck BOOTSTRAP SCENARIO}. Prints {@code OK SCENARIO} and exits 0 when every check holds;
 * otherwise prints {@code FAIL SCENARIO: why} (exit 1) or the unexpected exception (exit 2). A watchdog ends the run
 * with exit 3 after {@code kafkacheck.timeout.s} seconds (default 100) so a hung client never hangs the test run.
 */
public final class KafkaCheck {
    private static final Duration WAIT = Duration.ofSeconds(30);

    private final String bootstrap;
    private final String suffix = UUID.randomUUID().toString().substring(0, 8);

    private KafkaCheck(String bootstrap) {
        this.bootstrap = bootstrap;
    }

    static final class CheckFailed extends RuntimeException {
        private static final long serialVersionUID = 1L;

        CheckFailed(String message) {
            super(message);
        }
    }

    public static void main(String[] args) {
        if (args.length != 2) {
            System.err.println("usage: KafkaCheck BOOTSTRAP SCENARIO");
            System.exit(64);
        }
        String scenario = args[1];
        startWatchdog(scenario, Integer.getInteger("kafkacheck.timeout.s", 100));
        KafkaCheck check = new KafkaCheck(args[0]);
        long started = System.nanoTime();
        int status = 0;
        try {
            switch (scenario) {
                case "produce-consume" -> check.produceConsume();
                case "compression" -> check.compression();
                case "transactions" -> check.transactions();
                case "fencing" -> check.fencing();
                case "groups" -> check.groups();
                case "send-offsets" -> check.sendOffsets();
                default -> throw new CheckFailed("unknown scenario " + scenario);
            }
            System.out.printf("OK %s (%d ms)%n", scenario, (System.nanoTime() - started) / 1_000_000);
        } catch (CheckFailed failure) {
            System.err.println("FAIL " + scenario + ": " + failure.getMessage());
            status = 1;
        } catch (Throwable unexpected) {
            System.err.println("ERROR " + scenario + ": unexpected exception");
            unexpected.printStackTrace(System.err);
            status = 2;
        }
        System.out.flush();
        System.err.flush();
        // Client threads may still be winding down; the verdict is already known.
        System.exit(status);
    }

    private static void startWatchdog(String scenario, int seconds) {
        Thread watchdog = new Thread(() -> {
            try {
                Thread.sleep(seconds * 1000L);
            } catch (InterruptedException ignored) {
                return;
            }
            System.err.println("FAIL " + scenario + ": timed out after " + seconds + " s; thread dump follows");
            Thread.getAllStackTraces().forEach((thread, stack) -> {
                System.err.println("\"" + thread.getName() + "\"");
                for (StackTraceElement frame : stack) {
                    System.err.println("    at " + frame);
                }
            });
            System.err.flush();
            Runtime.getRuntime().halt(3);
        }, "kafkacheck-watchdog");
        watchdog.setDaemon(true);
        watchdog.start();
    }

    // -- scenarios ------------------------------------------------------------------------------------------------

    /** An idempotent acks=all producer's records come back in order, with keys, values and headers intact. */
    private void produceConsume() throws Exception {
        String topic = "java-pc-" + suffix;
        int count = 300;
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<String, String> producer = producer(Map.of(
                ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true",
                ProducerConfig.ACKS_CONFIG, "all",
                ProducerConfig.LINGER_MS_CONFIG, "5",
                ProducerConfig.BATCH_SIZE_CONFIG, "4096"))) {
            for (int i = 0; i < count; i++) {
                ProducerRecord<String, String> record = new ProducerRecord<>(topic, 0, "k-" + i, "v-" + i);
                record.headers().add("seq", Integer.toString(i).getBytes(StandardCharsets.UTF_8));
                sent.add(producer.send(record));
            }
            producer.flush();
        }
        for (int i = 0; i < count; i++) {
            RecordMetadata metadata = sent.get(i).get();
            expect(metadata.partition() == 0 && metadata.offset() == i,
                    "record " + i + " was acknowledged at " + metadata.partition() + "/" + metadata.offset());
        }
        TopicPartition partition = new TopicPartition(topic, 0);
        List<ConsumerRecord<String, String>> records = readToEnd("read_uncommitted", List.of(partition));
        expect(records.size() == count, "consumer read " + records.size() + " records, expected " + count);
        for (int i = 0; i < count; i++) {
            ConsumerRecord<String, String> record = records.get(i);
            expect(record.offset() == i, "record " + i + " came back at offset " + record.offset());
            expect(("k-" + i).equals(record.key()) && ("v-" + i).equals(record.value()),
                    "offset " + i + " holds " + record.key() + "=" + record.value());
            Header header = record.headers().lastHeader("seq");
            expect(header != null && Integer.toString(i).equals(new String(header.value(), StandardCharsets.UTF_8)),
                    "offset " + i + " lost its header");
        }
    }

    /** Batches compressed by each codec the Java client offers are stored and served back intact. */
    private void compression() throws Exception {
        String topic = "java-codec-" + suffix;
        List<String> expected = new ArrayList<>();
        for (String codec : List.of("gzip", "snappy", "lz4", "zstd")) {
            try (KafkaProducer<String, String> producer = producer(Map.of(
                    ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true",
                    ProducerConfig.COMPRESSION_TYPE_CONFIG, codec,
                    ProducerConfig.LINGER_MS_CONFIG, "20"))) {
                for (int i = 0; i < 50; i++) {
                    String value = codec + "-" + i + "-" + "x".repeat(100);
                    producer.send(new ProducerRecord<>(topic, 0, null, value));
                    expected.add(value);
                }
                producer.flush();
            }
        }
        expectValues(readToEnd("read_uncommitted", List.of(new TopicPartition(topic, 0))), expected,
                "compressed batches read back");
        // Topics whose compression.type names a codec: the broker recompresses what the producer sent.
        try (Admin admin = Admin.create(common())) {
            for (String codec : List.of("gzip", "snappy", "lz4", "zstd")) {
                String recompressed = "java-recodec-" + codec + "-" + suffix;
                admin.createTopics(List.of(new NewTopic(recompressed, 1, (short) 1)
                        .configs(Map.of(TopicConfig.COMPRESSION_TYPE_CONFIG, codec)))).all().get();
                List<String> sent = new ArrayList<>();
                try (KafkaProducer<String, String> producer = producer(Map.of(
                        ProducerConfig.COMPRESSION_TYPE_CONFIG, "none", ProducerConfig.LINGER_MS_CONFIG, "20"))) {
                    for (int i = 0; i < 50; i++) {
                        String value = "sent uncompressed to " + codec + "-" + i + "-" + "y".repeat(100);
                        producer.send(new ProducerRecord<>(recompressed, 0, null, value));
                        sent.add(value);
                    }
                    producer.flush();
                }
                expectValues(readToEnd("read_uncommitted", List.of(new TopicPartition(recompressed, 0))), sent,
                        "batches recompressed with " + codec + " read back");
            }
        }
    }

    /** Commit and abort across two topics; the LSO holds read_committed readers back while a transaction is open. */
    private void transactions() throws Exception {
        String topicA = "java-txa-" + suffix;
        String topicB = "java-txb-" + suffix;
        TopicPartition a = new TopicPartition(topicA, 0);
        TopicPartition b = new TopicPartition(topicB, 0);
        try (KafkaProducer<String, String> producer = transactionalProducer("java-tx-" + suffix)) {
            producer.initTransactions();

            producer.beginTransaction();
            for (int i = 0; i < 5; i++) {
                producer.send(new ProducerRecord<>(topicA, 0, null, "committed-a-" + i));
                producer.send(new ProducerRecord<>(topicB, 0, null, "committed-b-" + i));
            }
            producer.commitTransaction();

            producer.beginTransaction();
            for (int i = 0; i < 5; i++) {
                producer.send(new ProducerRecord<>(topicA, 0, null, "aborted-a-" + i));
                producer.send(new ProducerRecord<>(topicB, 0, null, "aborted-b-" + i));
            }
            producer.flush();
            producer.abortTransaction();

            producer.beginTransaction();
            Future<RecordMetadata> firstOpen = producer.send(new ProducerRecord<>(topicA, 0, null, "late-a-0"));
            producer.send(new ProducerRecord<>(topicA, 0, null, "late-a-1"));
            Future<RecordMetadata> lastOpen = producer.send(new ProducerRecord<>(topicA, 0, null, "late-a-2"));
            producer.flush();
            long lso = firstOpen.get().offset();
            long highWatermark = lastOpen.get().offset() + 1;
            Map<TopicPartition, Long> committedEnd = endOffsets("read_committed", List.of(a));
            Map<TopicPartition, Long> uncommittedEnd = endOffsets("read_uncommitted", List.of(a));
            expect(committedEnd.get(a) == lso,
                    "with a transaction open at offset " + lso + ", read_committed end offset is " + committedEnd.get(a));
            expect(uncommittedEnd.get(a) == highWatermark,
                    "read_uncommitted end offset is " + uncommittedEnd.get(a) + ", expected " + highWatermark);
            expectValues(readToEnd("read_committed", List.of(a)), committedA(false),
                    "read_committed while a transaction is open");
            producer.commitTransaction();
        }

        waitUntilStable(List.of(a, b));
        List<ConsumerRecord<String, String>> committed = readToEnd("read_committed", List.of(a, b));
        expectValues(only(committed, topicA), committedA(true), "read_committed " + topicA);
        expectValues(only(committed, topicB), series("committed-b-", 5), "read_committed " + topicB);

        List<ConsumerRecord<String, String>> uncommitted = readToEnd("read_uncommitted", List.of(a, b));
        List<String> allA = new ArrayList<>(series("committed-a-", 5));
        allA.addAll(series("aborted-a-", 5));
        allA.addAll(series("late-a-", 3));
        List<String> allB = new ArrayList<>(series("committed-b-", 5));
        allB.addAll(series("aborted-b-", 5));
        expectValues(only(uncommitted, topicA), allA, "read_uncommitted " + topicA);
        expectValues(only(uncommitted, topicB), allB, "read_uncommitted " + topicB);
    }

    private static List<String> committedA(boolean withLate) {
        List<String> values = new ArrayList<>(series("committed-a-", 5));
        if (withLate) {
            values.addAll(series("late-a-", 3));
        }
        return values;
    }

    /** A second producer with the same transactional.id fences the first; the zombie's writes never become visible. */
    private void fencing() throws Exception {
        String transactionalId = "java-fence-" + suffix;
        String topic = "java-fence-" + suffix;
        TopicPartition partition = new TopicPartition(topic, 0);
        KafkaProducer<String, String> zombie = transactionalProducer(transactionalId);
        try {
            zombie.initTransactions();
            zombie.beginTransaction();
            zombie.send(new ProducerRecord<>(topic, 0, null, "zombie-0")).get();

            try (KafkaProducer<String, String> successor = transactionalProducer(transactionalId)) {
                successor.initTransactions();

                Throwable fenced = null;
                try {
                    zombie.send(new ProducerRecord<>(topic, 0, null, "zombie-1")).get();
                    zombie.commitTransaction();
                } catch (Exception expected) {
                    fenced = expected;
                }
                expect(fenced != null, "the zombie producer committed after its transactional.id was re-initialised");
                expect(causedBy(fenced, ProducerFencedException.class, InvalidProducerEpochException.class),
                        "the zombie failed, but not with ProducerFencedException/InvalidProducerEpochException: "
                                + describe(fenced));

                successor.beginTransaction();
                successor.send(new ProducerRecord<>(topic, 0, null, "successor-0"));
                successor.commitTransaction();
            }
        } finally {
            zombie.close(Duration.ofSeconds(5));
        }
        waitUntilStable(List.of(partition));
        expectValues(readToEnd("read_committed", List.of(partition)), List.of("successor-0"),
                "read_committed after fencing");
        List<String> stored = values(readToEnd("read_uncommitted", List.of(partition)));
        expect(!stored.contains("zombie-1"),
                "the broker appended a record sent with the fenced producer epoch: " + stored);
    }

    /** A group member commits; the next member of the same group resumes from the committed offset. */
    private void groups() throws Exception {
        String topic = "java-group-" + suffix;
        String group = "java-group-" + suffix;
        TopicPartition partition = new TopicPartition(topic, 0);
        producePlain(topic, series("m-", 10));

        try (KafkaConsumer<String, String> first = groupConsumer(group, "read_uncommitted")) {
            first.subscribe(List.of(topic));
            List<ConsumerRecord<String, String>> records = pollCount(first, 10);
            expectValues(records, series("m-", 10), "first member");
            first.commitSync(WAIT);
            OffsetAndMetadata committed = first.committed(Set.of(partition), WAIT).get(partition);
            expect(committed != null && committed.offset() == 10,
                    "after commitSync the group's committed offset is " + committed + ", expected 10");
        }

        List<String> more = new ArrayList<>();
        for (int i = 10; i < 20; i++) {
            more.add("m-" + i);
        }
        producePlain(topic, more);

        try (KafkaConsumer<String, String> second = groupConsumer(group, "read_uncommitted")) {
            second.subscribe(List.of(topic));
            List<ConsumerRecord<String, String>> records = pollCount(second, 10);
            expect(records.get(0).offset() == 10,
                    "the next member of the group started at offset " + records.get(0).offset()
                            + " instead of the committed offset 10");
            expectValues(records, more, "second member");
            second.commitSync(WAIT);
        }

        try (KafkaConsumer<String, String> observer = groupConsumer(group, "read_uncommitted")) {
            OffsetAndMetadata committed = observer.committed(Set.of(partition), WAIT).get(partition);
            expect(committed != null && committed.offset() == 20,
                    "the group's committed offset is " + committed + " after the second member's commit, expected 20");
        }
    }

    /** Consume-transform-produce: offsets sent with a transaction are committed with it and discarded on abort. */
    private void sendOffsets() throws Exception {
        String input = "java-eos-in-" + suffix;
        String output = "java-eos-out-" + suffix;
        String group = "java-eos-" + suffix;
        TopicPartition inputPartition = new TopicPartition(input, 0);
        TopicPartition outputPartition = new TopicPartition(output, 0);
        producePlain(input, series("in-", 10));

        try (KafkaConsumer<String, String> consumer = groupConsumer(group, "read_committed");
             KafkaProducer<String, String> producer = transactionalProducer("java-eos-" + suffix)) {
            producer.initTransactions();
            consumer.subscribe(List.of(input));

            List<ConsumerRecord<String, String>> batch = pollCount(consumer, 10);
            producer.beginTransaction();
            for (ConsumerRecord<String, String> record : batch) {
                producer.send(new ProducerRecord<>(output, 0, null, "aborted-" + record.value()));
            }
            producer.sendOffsetsToTransaction(nextOffsets(batch), consumer.groupMetadata());
            producer.flush();
            producer.abortTransaction();
            OffsetAndMetadata afterAbort = consumer.committed(Set.of(inputPartition), WAIT).get(inputPartition);
            expect(afterAbort == null,
                    "offsets sent with an aborted transaction were committed: " + afterAbort);

            // As an application does after an abort: rewind to the last committed position and process again.
            consumer.seek(inputPartition, 0);
            batch = pollCount(consumer, 10);
            producer.beginTransaction();
            for (ConsumerRecord<String, String> record : batch) {
                producer.send(new ProducerRecord<>(output, 0, null, "out-" + record.value()));
            }
            producer.sendOffsetsToTransaction(nextOffsets(batch), consumer.groupMetadata());
            producer.commitTransaction();
            OffsetAndMetadata afterCommit = consumer.committed(Set.of(inputPartition), WAIT).get(inputPartition);
            expect(afterCommit != null && afterCommit.offset() == 10,
                    "after the commit the group's offset is " + afterCommit + ", expected 10");
        }

        try (KafkaConsumer<String, String> observer = groupConsumer(group, "read_committed")) {
            OffsetAndMetadata committed = observer.committed(Set.of(inputPartition), WAIT).get(inputPartition);
            expect(committed != null && committed.offset() == 10,
                    "a new member of the group sees committed offset " + committed + ", expected 10");
        }
        List<String> expected = new ArrayList<>();
        for (String value : series("in-", 10)) {
            expected.add("out-" + value);
        }
        waitUntilStable(List.of(outputPartition));
        expectValues(readToEnd("read_committed", List.of(outputPartition)), expected, "read_committed output");
        expect(readToEnd("read_uncommitted", List.of(outputPartition)).size() == 20,
                "the output log should hold the aborted and the committed attempt (20 records)");
    }

    // -- clients ----------------------------------------------------------------------------------------------------

    private Properties common() {
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("client.id", "kafkacheck");
        props.put("request.timeout.ms", "10000");
        props.put("default.api.timeout.ms", "20000");
        props.put("reconnect.backoff.max.ms", "200");
        props.put("retry.backoff.ms", "50");
        // Security settings (security.protocol, sasl.*, ssl.*) for every client, from a properties file.
        String security = System.getProperty("kafkacheck.client.properties");
        if (security != null) {
            try (java.io.Reader reader = java.nio.file.Files.newBufferedReader(java.nio.file.Path.of(security))) {
                props.load(reader);
            } catch (java.io.IOException e) {
                throw new CheckFailed("cannot read " + security + ": " + e);
            }
        }
        return props;
    }

    private KafkaProducer<String, String> producer(Map<String, String> extra) {
        Properties props = common();
        props.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "20000");
        props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "25000");
        props.putAll(extra);
        return new KafkaProducer<>(props, new StringSerializer(), new StringSerializer());
    }

    private KafkaProducer<String, String> transactionalProducer(String transactionalId) {
        return producer(Map.of(
                ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId,
                ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "30000",
                ProducerConfig.LINGER_MS_CONFIG, "5"));
    }

    private void producePlain(String topic, List<String> values) throws Exception {
        try (KafkaProducer<String, String> producer = producer(Map.of(ProducerConfig.ACKS_CONFIG, "all"))) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (String value : values) {
                sent.add(producer.send(new ProducerRecord<>(topic, 0, null, value)));
            }
            for (Future<RecordMetadata> future : sent) {
                future.get();
            }
        }
    }

    private KafkaConsumer<String, String> consumer(String isolation, String group) {
        Properties props = common();
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        if (group != null) {
            props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            props.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
            props.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000");
        }
        return new KafkaConsumer<>(props, new StringDeserializer(), new StringDeserializer());
    }

    private KafkaConsumer<String, String> groupConsumer(String group, String isolation) {
        return consumer(isolation, group);
    }

    /**
     * Kafka writes a transaction's markers after it answered EndTxn, so a read_committed reader right after a commit
     * can stop at the last stable offset short of the committed records: wait until it reaches the high watermark.
     */
    private void waitUntilStable(Collection<TopicPartition> partitions) throws InterruptedException {
        long deadline = System.nanoTime() + WAIT.toNanos();
        while (true) {
            Map<TopicPartition, Long> stable = endOffsets("read_committed", partitions);
            Map<TopicPartition, Long> high = endOffsets("read_uncommitted", partitions);
            if (stable.equals(high)) {
                return;
            }
            if (System.nanoTime() > deadline) {
                throw new CheckFailed("last stable offsets " + stable + " did not reach the high watermarks " + high);
            }
            Thread.sleep(50);
        }
    }

    private Map<TopicPartition, Long> endOffsets(String isolation, Collection<TopicPartition> partitions) {
        try (KafkaConsumer<String, String> consumer = consumer(isolation, null)) {
            return consumer.endOffsets(partitions, WAIT);
        }
    }

    /** Everything an assigned (group-less) consumer sees from the start of each partition up to its end offset. */
    private List<ConsumerRecord<String, String>> readToEnd(String isolation, Collection<TopicPartition> partitions) {
        try (KafkaConsumer<String, String> consumer = consumer(isolation, null)) {
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            Map<TopicPartition, Long> end = consumer.endOffsets(partitions, WAIT);
            List<ConsumerRecord<String, String>> records = new ArrayList<>();
            long deadline = System.nanoTime() + WAIT.toNanos();
            while (true) {
                boolean done = true;
                for (TopicPartition partition : partitions) {
                    done &= consumer.position(partition, WAIT) >= end.get(partition);
                }
                if (done) {
                    return records;
                }
                if (System.nanoTime() > deadline) {
                    Map<TopicPartition, Long> positions = new HashMap<>();
                    for (TopicPartition partition : partitions) {
                        positions.put(partition, consumer.position(partition, WAIT));
                    }
                    throw new CheckFailed(isolation + " consumer stuck at " + positions + " short of end offsets "
                            + end + " after reading " + values(records));
                }
                consumer.poll(Duration.ofMillis(200)).forEach(records::add);
            }
        }
    }

    /** Polls a subscribed consumer until `count` records arrived (more is a failure too). */
    private static List<ConsumerRecord<String, String>> pollCount(KafkaConsumer<String, String> consumer, int count) {
        List<ConsumerRecord<String, String>> records = new ArrayList<>();
        long deadline = System.nanoTime() + WAIT.toNanos();
        while (records.size() < count) {
            if (System.nanoTime() > deadline) {
                throw new CheckFailed("group consumer received " + values(records) + " of " + count
                        + " records within " + WAIT.toSeconds() + " s (assignment " + consumer.assignment() + ")");
            }
            consumer.poll(Duration.ofMillis(200)).forEach(records::add);
        }
        expect(records.size() == count, "group consumer received " + values(records) + ", expected " + count);
        return records;
    }

    private static Map<TopicPartition, OffsetAndMetadata> nextOffsets(List<ConsumerRecord<String, String>> batch) {
        Map<TopicPartition, OffsetAndMetadata> offsets = new LinkedHashMap<>();
        for (ConsumerRecord<String, String> record : batch) {
            offsets.put(new TopicPartition(record.topic(), record.partition()),
                    new OffsetAndMetadata(record.offset() + 1));
        }
        return offsets;
    }

    // -- assertions -------------------------------------------------------------------------------------------------

    private static void expect(boolean condition, String message) {
        if (!condition) {
            throw new CheckFailed(message);
        }
    }

    private static void expectValues(List<ConsumerRecord<String, String>> records, List<String> expected,
                                     String what) {
        List<String> actual = values(records);
        expect(actual.equals(expected), what + ": got " + actual + ", expected " + expected);
    }

    private static List<String> values(List<ConsumerRecord<String, String>> records) {
        List<String> values = new ArrayList<>();
        for (ConsumerRecord<String, String> record : records) {
            values.add(record.value());
        }
        return values;
    }

    private static List<ConsumerRecord<String, String>> only(List<ConsumerRecord<String, String>> records,
                                                             String topic) {
        List<ConsumerRecord<String, String>> selected = new ArrayList<>();
        for (ConsumerRecord<String, String> record : records) {
            if (record.topic().equals(topic)) {
                selected.add(record);
            }
        }
        return selected;
    }

    private static List<String> series(String prefix, int count) {
        List<String> values = new ArrayList<>();
        for (int i = 0; i < count; i++) {
            values.add(prefix + i);
        }
        return values;
    }

    @SafeVarargs
    private static boolean causedBy(Throwable error, Class<? extends Throwable>... types) {
        for (Throwable cause = error; cause != null; cause = cause.getCause()) {
            for (Class<? extends Throwable> type : types) {
                if (type.isInstance(cause)) {
                    return true;
                }
            }
        }
        return false;
    }

    private static String describe(Throwable error) {
        List<String> chain = new ArrayList<>();
        for (Throwable cause = error; cause != null; cause = cause.getCause()) {
            chain.add(cause.getClass().getName() + ": " + cause.getMessage());
        }
        return String.join(" <- ", chain);
    }
}
