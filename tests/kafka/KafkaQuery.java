// One long-lived Kafka Admin client for the real-broker tests (tests/broker_lib.sh, bt_query):
// what the broker's own tools (TopicCommand, ConsumerGroupCommand, TransactionsCommand) tell,
// without a JVM start per question. A fault test asks while a worker is stopped (SIGSTOP), so an
// answer must take milliseconds, not the seconds of a JVM start.
//
// Usage: java -cp "KAFKA_LIB/*:DIR" KafkaQuery BOOTSTRAP ANSWERS
// Reads one request per line on stdin and answers each into the file ANSWERS (a FIFO: stdout
// and stderr are the client's log, where a logging library may write too), ending the answer
// with a line holding only "."; an answer that starts with "error " is a failed request (the client stays
// usable). Requests:
//   topic NAME PARTITIONS [KEY=VALUE...]  creates topic NAME (replication 1, the given topic
//                                         configs) unless it exists; answers "ok" once every
//                                         partition has a leader (at most 30 s)
//   offsets GROUP TOPIC                   one line per partition of TOPIC, ascending:
//                                         "PARTITION COMMITTED LOG_END" (COMMITTED -1: none;
//                                         LOG_END: the latest offset, read_uncommitted)
//   txn TRANSACTIONAL_ID                  "STATE EPOCH DURATION_MS" as kafka-transactions.sh
//                                         describe prints them (e.g. "Ongoing 3 180"; DURATION_MS
//                                         "None" when no transaction is open)
// Every request is bounded (request.timeout.ms and default.api.timeout.ms 10 s). Exits at the
// end of stdin.
import java.io.BufferedReader;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;

public final class KafkaQuery {
    private static final long WAIT_S = 15;

    private KafkaQuery() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: KafkaQuery BOOTSTRAP ANSWERS");
            System.exit(2);
        }
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "10000");
        PrintStream out = new PrintStream(new FileOutputStream(args[1]), false, StandardCharsets.UTF_8);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (Admin admin = Admin.create(p)) {
            String line;
            while ((line = in.readLine()) != null) {
                String[] w = line.trim().split("\\s+");
                try {
                    if (w.length >= 3 && w[0].equals("topic")) {
                        topic(admin, w, out);
                    } else if (w.length == 3 && w[0].equals("offsets")) {
                        offsets(admin, w[1], w[2], out);
                    } else if (w.length == 2 && w[0].equals("txn")) {
                        txn(admin, w[1], out);
                    } else {
                        out.println("error unknown request: " + line);
                    }
                } catch (ExecutionException e) {
                    out.println("error " + e.getCause());
                } catch (Exception e) {
                    out.println("error " + e);
                }
                out.println(".");
                out.flush();
            }
        }
    }

    private static List<TopicPartitionInfo> partitions(Admin admin, String topic) throws Exception {
        TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames()
            .get(WAIT_S, TimeUnit.SECONDS).get(topic);
        return d.partitions();
    }

    private static void topic(Admin admin, String[] w, PrintStream out) throws Exception {
        String name = w[1];
        int parts = Integer.parseInt(w[2]);
        Map<String, String> configs = new HashMap<>();
        for (int i = 3; i < w.length; i++) {
            int eq = w[i].indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("topic config not KEY=VALUE: " + w[i]);
            }
            configs.put(w[i].substring(0, eq), w[i].substring(eq + 1));
        }
        try {
            admin.createTopics(List.of(new NewTopic(name, parts, (short) 1).configs(configs)))
                .all().get(WAIT_S, TimeUnit.SECONDS);
        } catch (ExecutionException e) {
            if (!(e.getCause() instanceof TopicExistsException)) {
                throw e;
            }
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        String last = "no metadata";
        while (System.nanoTime() < deadline) {
            try {
                List<TopicPartitionInfo> ps = partitions(admin, name);
                int led = 0;
                for (TopicPartitionInfo pi : ps) {
                    if (pi.leader() != null && !pi.leader().isEmpty()) {
                        led++;
                    }
                }
                if (ps.size() == parts && led == parts) {
                    out.println("ok");
                    return;
                }
                last = led + " of " + ps.size() + " partitions have a leader";
            } catch (ExecutionException e) {
                if (!(e.getCause() instanceof UnknownTopicOrPartitionException)) {
                    throw e;
                }
                last = "topic not in the metadata yet";
            }
            Thread.sleep(100);
        }
        out.println("error topic " + name + ": " + last + " after 30 s");
    }

    private static void offsets(Admin admin, String group, String topic, PrintStream out)
            throws Exception {
        List<TopicPartitionInfo> ps = partitions(admin, topic);
        Map<TopicPartition, OffsetAndMetadata> done = admin.listConsumerGroupOffsets(group)
            .partitionsToOffsetAndMetadata().get(WAIT_S, TimeUnit.SECONDS);
        Map<TopicPartition, OffsetSpec> want = new HashMap<>();
        List<TopicPartition> tps = new ArrayList<>();
        for (TopicPartitionInfo pi : ps) {
            TopicPartition tp = new TopicPartition(topic, pi.partition());
            tps.add(tp);
            want.put(tp, OffsetSpec.latest());
        }
        tps.sort((a, b) -> Integer.compare(a.partition(), b.partition()));
        Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> ends =
            admin.listOffsets(want).all().get(WAIT_S, TimeUnit.SECONDS);
        for (TopicPartition tp : tps) {
            OffsetAndMetadata c = done.get(tp);
            out.println(tp.partition() + " " + (c == null ? -1 : c.offset()) + " " + ends.get(tp).offset());
        }
    }

    private static void txn(Admin admin, String id, PrintStream out) throws Exception {
        TransactionDescription d = admin.describeTransactions(List.of(id)).description(id)
            .get(WAIT_S, TimeUnit.SECONDS);
        String dur = d.transactionStartTimeMs().isPresent()
            ? Long.toString(System.currentTimeMillis() - d.transactionStartTimeMs().getAsLong())
            : "None";
        out.println(d.state() + " " + d.producerEpoch() + " " + dur);
    }
}
