package herd.ref;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.LinkedBlockingQueue;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.utils.internals.Exit;

/**
 * Kafka's own Java client (and its kafka-consumer-groups tool) driven by herd's conformance tests:
 * one JVM runs many {@link KafkaConsumer}s, each on its own thread, so a test session pays the JVM
 * start once. Commands arrive on stdin and events leave on stdout, one JSON object a line:
 *
 * <pre>
 * {"cmd":"start","id":"a","topics":["t"],"props":{"group.id":"g",...}}   a consumer that subscribes and polls
 * {"cmd":"close","id":"a"}           close it (a dynamic member sends LeaveGroup, a static one does not)
 * {"cmd":"stall","id":"a","ms":N}    stop polling for N ms (past max.poll.interval.ms it leaves the group)
 * {"cmd":"commit","id":"a","offsets":[["t",0,5,"meta"]]}   commitSync from the consumer's thread
 * {"cmd":"committed","id":"a","partitions":[["t",0]]}      consumer.committed(...)
 * {"cmd":"tool","args":["--bootstrap-server",...]}          kafka-consumer-groups (ConsumerGroupCommand), in process
 * {"cmd":"exit"}
 * </pre>
 *
 * Events: {"ev":"ready"}, {"ev":"assigned"|"revoked"|"lost","id","partitions"} (the listener's
 * increments), {"ev":"state","id","partitions","generation","member_id"} whenever one of them
 * changes, {"ev":"committed"|"offsets","id",...}, {"ev":"error","id","type","message"} (the consumer
 * stops after an error from poll), {"ev":"closed","id"}, {"ev":"tool","code","out","err"}.
 * The JVM exits when stdin closes (the test process is gone).
 */
public final class Driver {
    static final ObjectMapper JSON = new ObjectMapper();
    static final PrintStream OUT = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true,
            StandardCharsets.UTF_8);
    static final Map<String, Member> MEMBERS = new ConcurrentHashMap<>();

    static synchronized void emit(ObjectNode ev) {
        ev.put("t", System.nanoTime() / 1e9);
        OUT.println(ev.toString());
    }

    static ObjectNode event(String ev, String id) {
        ObjectNode n = JSON.createObjectNode();
        n.put("ev", ev);
        if (id != null) {
            n.put("id", id);
        }
        return n;
    }

    static ArrayNode tps(Collection<TopicPartition> parts) {
        TreeSet<String> sorted = new TreeSet<>();
        ArrayNode out = JSON.createArrayNode();
        List<TopicPartition> list = new ArrayList<>(parts);
        list.sort((a, b) -> a.topic().equals(b.topic()) ? Integer.compare(a.partition(), b.partition())
                : a.topic().compareTo(b.topic()));
        for (TopicPartition tp : list) {
            ArrayNode e = out.addArray();
            e.add(tp.topic());
            e.add(tp.partition());
        }
        return out;
    }

    static final class Member implements Runnable {
        final String id;
        final Properties props;
        final List<String> topics;
        final LinkedBlockingQueue<JsonNode> inbox = new LinkedBlockingQueue<>();
        final Set<TopicPartition> owned = new HashSet<>();
        String lastState = "";
        volatile boolean stop;

        Member(String id, Properties props, List<String> topics) {
            this.id = id;
            this.props = props;
            this.topics = topics;
        }

        @Override
        public void run() {
            KafkaConsumer<byte[], byte[]> consumer;
            try {
                consumer = new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
            } catch (RuntimeException e) {
                error(e);
                MEMBERS.remove(id);
                return;
            }
            try {
                consumer.subscribe(topics, new ConsumerRebalanceListener() {
                    @Override
                    public void onPartitionsRevoked(Collection<TopicPartition> parts) {
                        owned.removeAll(parts);
                        emit(event("revoked", id).set("partitions", tps(parts)));
                    }

                    @Override
                    public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                        owned.addAll(parts);
                        emit(event("assigned", id).set("partitions", tps(parts)));
                    }

                    @Override
                    public void onPartitionsLost(Collection<TopicPartition> parts) {
                        owned.removeAll(parts);
                        emit(event("lost", id).set("partitions", tps(parts)));
                    }
                });
                while (!stop) {
                    consumer.poll(Duration.ofMillis(50));
                    report(consumer);
                    JsonNode cmd;
                    while ((cmd = inbox.poll()) != null) {
                        handle(consumer, cmd);
                    }
                }
            } catch (RuntimeException e) {
                error(e);
            } finally {
                try {
                    consumer.close(Duration.ofSeconds(10));
                } catch (RuntimeException e) {
                    error(e);
                }
                MEMBERS.remove(id);
                emit(event("closed", id));
            }
        }

        void report(KafkaConsumer<byte[], byte[]> consumer) {
            ConsumerGroupMetadata md = consumer.groupMetadata();
            String key = new TreeSet<>(owned.stream().map(TopicPartition::toString).toList()) + "|"
                    + md.generationId() + "|" + md.memberId();
            if (!key.equals(lastState) && md.generationId() >= 1) {
                lastState = key;
                ObjectNode ev = event("state", id);
                ev.set("partitions", tps(owned));
                ev.put("generation", md.generationId());
                ev.put("member_id", md.memberId());
                emit(ev);
            }
        }

        void handle(KafkaConsumer<byte[], byte[]> consumer, JsonNode cmd) {
            switch (cmd.get("cmd").asText()) {
                case "close" -> stop = true;
                case "stall" -> {
                    try {
                        Thread.sleep(cmd.get("ms").asLong());
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                    emit(event("stalled", id));
                }
                case "commit" -> {
                    Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                    for (JsonNode e : cmd.get("offsets")) {
                        String meta = e.size() > 3 && !e.get(3).isNull() ? e.get(3).asText() : "";
                        offsets.put(new TopicPartition(e.get(0).asText(), e.get(1).asInt()),
                                new OffsetAndMetadata(e.get(2).asLong(), meta));
                    }
                    ObjectNode ev = event("committed", id);
                    try {
                        consumer.commitSync(offsets, Duration.ofSeconds(15));
                        ev.putNull("error");
                    } catch (RuntimeException e) {
                        ev.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
                    }
                    emit(ev);
                }
                case "committed" -> {
                    Set<TopicPartition> parts = new HashSet<>();
                    for (JsonNode e : cmd.get("partitions")) {
                        parts.add(new TopicPartition(e.get(0).asText(), e.get(1).asInt()));
                    }
                    ObjectNode ev = event("offsets", id);
                    ArrayNode out = ev.putArray("offsets");
                    for (Map.Entry<TopicPartition, OffsetAndMetadata> e
                            : consumer.committed(parts, Duration.ofSeconds(15)).entrySet()) {
                        ArrayNode row = out.addArray();
                        row.add(e.getKey().topic());
                        row.add(e.getKey().partition());
                        if (e.getValue() == null) {
                            row.addNull();
                            row.addNull();
                        } else {
                            row.add(e.getValue().offset());
                            row.add(e.getValue().metadata());
                        }
                    }
                    emit(ev);
                }
                default -> emit(event("bad_command", id).put("cmd", cmd.toString()));
            }
        }

        void error(RuntimeException e) {
            ObjectNode ev = event("error", id);
            ev.put("type", e.getClass().getName());
            ev.put("message", String.valueOf(e.getMessage()));
            emit(ev);
            stop = true;
        }
    }

    static final class ExitCalled extends RuntimeException {
        final int code;

        ExitCalled(int code) {
            super(null, null, false, false);
            this.code = code;
        }
    }

    /** kafka-consumer-groups in this JVM: its stdout/stderr captured, Exit.exit turned into a return. */
    static void tool(JsonNode cmd) {
        List<String> args = new ArrayList<>();
        cmd.get("args").forEach(a -> args.add(a.asText()));
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        PrintStream oldOut = System.out;
        PrintStream oldErr = System.err;
        int code = 0;
        synchronized (Driver.class) {
            System.setOut(new PrintStream(out, true, StandardCharsets.UTF_8));
            System.setErr(new PrintStream(err, true, StandardCharsets.UTF_8));
            Exit.setExitProcedure((c, msg) -> {
                throw new ExitCalled(c);
            });
            try {
                org.apache.kafka.tools.consumer.group.ConsumerGroupCommand.main(args.toArray(new String[0]));
            } catch (ExitCalled e) {
                code = e.code;
            } catch (RuntimeException e) {
                code = -1;
                e.printStackTrace(System.err);
            } finally {
                Exit.resetExitProcedure();
                System.setOut(oldOut);
                System.setErr(oldErr);
            }
        }
        ObjectNode ev = event("tool", null);
        ev.put("code", code);
        ev.put("out", out.toString(StandardCharsets.UTF_8));
        ev.put("err", err.toString(StandardCharsets.UTF_8));
        if (cmd.has("tag")) {
            ev.set("tag", cmd.get("tag"));
        }
        emit(ev);
    }

    public static void main(String[] argv) throws Exception {
        System.setOut(new PrintStream(new ByteArrayOutputStream())); // stray prints never reach the event stream
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        emit(event("ready", null));
        String line;
        while ((line = in.readLine()) != null) {
            JsonNode cmd = JSON.readTree(line);
            String what = cmd.get("cmd").asText();
            String id = cmd.has("id") ? cmd.get("id").asText() : null;
            switch (what) {
                case "start" -> {
                    Properties props = new Properties();
                    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
                    props.put(ConsumerConfig.CLIENT_ID_CONFIG, "java-" + id);
                    cmd.get("props").fields().forEachRemaining(e -> props.put(e.getKey(), e.getValue().asText()));
                    List<String> topics = new ArrayList<>();
                    cmd.get("topics").forEach(t -> topics.add(t.asText()));
                    Member m = new Member(id, props, topics);
                    MEMBERS.put(id, m);
                    Thread t = new Thread(m, "member-" + id);
                    t.setDaemon(true);
                    t.start();
                }
                case "tool" -> tool(cmd);
                case "exit" -> {
                    MEMBERS.values().forEach(m -> m.stop = true);
                    Thread.sleep(200);
                    System.exit(0);
                }
                default -> {
                    Member m = MEMBERS.get(id);
                    if (m == null) {
                        emit(event("no_member", id).put("cmd", what));
                    } else {
                        m.inbox.add(cmd);
                    }
                }
            }
        }
        Runtime.getRuntime().halt(3); // the parent is gone
    }
}
