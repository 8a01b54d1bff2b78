package dev.streamapp.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.LagInfo;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TaskMetadata;
import org.apache.kafka.streams.ThreadMetadata;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Named;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.processor.PunctuationType;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.StoreBuilder;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.state.WindowStoreIterator;

/**
 * The dedup topology of streamapp-processor, written the way a Kafka Streams user writes it:
 * the id is read from the JSON value ("/id"); with {@code repartition=true} the stream is
 * re-keyed by it ({@code selectKey}) and goes through the internal topic
 * {@code <application-id>-dedup-repartition} ({@code repartition()}), so that every repeat
 * reaches the task of its first occurrence whatever the input's keys; a persistent RocksDB
 * store (changelogged) remembers when each id was first seen for the retention; a record whose
 * id was seen within the retention goes to the duplicates topic, any other to the output topic,
 * keyed by its id. processing.guarantee=exactly_once_v2, commit.interval.ms=100 (the same as the
 * processor).
 *
 * <p>The store is one of:
 *
 * <ul>
 *   <li>{@code store=window}: a window store (retention and window size = the retention), a
 *       range fetch over the retention per record; expiry is the store's own, by segment;
 *   <li>{@code store=kv}: a key-value store with a point lookup per record (id → first seen);
 *       expiry is a stream-time punctuation every half retention that deletes the entries
 *       older than the retention.
 * </ul>
 *
 * <p>Usage: {@code DedupApp key=value ...} with bootstrap, application-id, input, output,
 * duplicates, state-dir, retention-ms, store (window|kv), repartition (true|false),
 * transactional-stores (true|false), and optionally linger-ms and batch-size (the producer's;
 * absent: Kafka Streams' defaults), cache-bytes (absent or 0: the store is not cached, the
 * default of a store builder; otherwise caching on with this statestore.cache.max.bytes),
 * group-instance-id (static membership), ready-file (touched each time the instance reaches
 * RUNNING), standby-replicas ({@code num.standby.replicas}, default 0), stream-threads
 * ({@code num.stream.threads}, default 1), tasks-file (rewritten
 * every half second with the stateful tasks this instance runs, the standby copies of their
 * store it keeps and the copies' total lag behind the changelog's last record,
 * {@code active=N standby-copies=N standby-lag=M}), and any {@code consumer.<setting>=value} (a consumer
 * setting, e.g. {@code consumer.session.timeout.ms}). It runs until its stdin closes, then closes
 * cleanly. It prints one line per state
 * change and per restored partition on stdout, which the benchmark driver reads.
 */
public final class DedupApp {
  static final String STORE = "dedup-store";
  static final String DEDUP = "dedup";
  static final String OUTPUT_SINK = "output";
  static final String DUPLICATES_SINK = "duplicates";
  /** The header streamapp-processor adds to output and duplicates: the dedup id. */
  static final String DEDUP_ID_HEADER = "streamapp.dedup.id";

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = parse(argv);
    long retentionMs = Long.parseLong(args.getOrDefault("retention-ms", "3600000"));
    String readyFile = args.get("ready-file");

    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, required(args, "application-id"));
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, required(args, "bootstrap"));
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, "100");
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, args.getOrDefault("stream-threads", "1"));
    props.put(StreamsConfig.STATE_DIR_CONFIG, required(args, "state-dir"));
    props.put(
        StreamsConfig.TRANSACTIONAL_STATE_STORES_CONFIG,
        args.getOrDefault("transactional-stores", "false"));
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    for (String[] knob : new String[][] {
        {"linger-ms", ProducerConfig.LINGER_MS_CONFIG},
        {"batch-size", ProducerConfig.BATCH_SIZE_CONFIG}}) {
      if (args.containsKey(knob[0])) {
        props.put(StreamsConfig.producerPrefix(knob[1]), args.get(knob[0]));
      }
    }
    props.put(
        StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, args.getOrDefault("standby-replicas", "0"));
    args.forEach((key, value) -> {
      if (key.startsWith("consumer.")) {
        props.put(key, value);
      }
    });
    long cacheBytes = Long.parseLong(args.getOrDefault("cache-bytes", "0"));
    if (cacheBytes > 0) {
      props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, Long.toString(cacheBytes));
    }
    // Static membership, as streamapp-processor has (group.instance.id = pod name): a restarted
    // instance takes its partitions back without waiting for the old member's session to end.
    String instance = args.get("group-instance-id");
    if (instance != null) {
      props.put(
          StreamsConfig.mainConsumerPrefix(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG), instance);
    }

    Topology topology = topology(
        required(args, "input"), required(args, "output"), required(args, "duplicates"),
        retentionMs, args.getOrDefault("store", "window"),
        Boolean.parseBoolean(args.getOrDefault("repartition", "false")), cacheBytes > 0, props);
    KafkaStreams streams = new KafkaStreams(topology, props);
    streams.setStateListener((now, before) -> {
      say("state " + before + " -> " + now);
      if (now == KafkaStreams.State.RUNNING && readyFile != null) {
        try {
          Files.write(Path.of(readyFile), new byte[0]);
        } catch (IOException e) {
          throw new RuntimeException(e);
        }
      }
    });
    streams.setGlobalStateRestoreListener(new RestoreCounter());
    streams.setUncaughtExceptionHandler(e -> {
      e.printStackTrace();
      return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
    });
    streams.start();
    String tasksFile = args.get("tasks-file");
    if (tasksFile != null) {
      // With the repartition stage, the store's tasks are those of the second sub-topology.
      int statefulSubtopology = Boolean.parseBoolean(args.getOrDefault("repartition", "false"))
          ? 1 : 0;
      Thread reporter =
          new Thread(() -> reportTasks(streams, statefulSubtopology, Path.of(tasksFile)));
      reporter.setDaemon(true);
      reporter.start();
    }

    // Runs until the driver closes stdin (a clean stop), or is killed.
    while (System.in.read() >= 0) {
      // Nothing to read: the driver only ever closes it.
    }
    streams.close(Duration.ofSeconds(60));
    say("closed");
  }

  static Topology topology(
      String input, String output, String duplicates, long retentionMs, String storeKind,
      boolean repartition, boolean caching, Properties props) {
    boolean kv = switch (storeKind) {
      case "kv" -> true;
      case "window" -> false;
      default -> throw new IllegalArgumentException("store=" + storeKind + ": window or kv");
    };
    StoreBuilder<?> store = kv
        ? Stores.keyValueStoreBuilder(
            Stores.persistentKeyValueStore(STORE), Serdes.String(), Serdes.Long())
        : Stores.windowStoreBuilder(
            Stores.persistentWindowStore(
                STORE, Duration.ofMillis(retentionMs), Duration.ofMillis(retentionMs), false),
            Serdes.String(),
            Serdes.Long());
    if (caching) {
      store.withCachingEnabled();
    }
    StreamsBuilder builder = new StreamsBuilder();
    builder.addStateStore(store);
    KStream<String, byte[]> stream = builder.stream(
        input, Consumed.with(Serdes.String(), Serdes.ByteArray()).withName("input"));
    if (repartition) {
      // What a Kafka Streams user writes when the input is not keyed by the dedup id.
      stream = stream
          .selectKey((key, value) -> requireId(value), Named.as("select-id"))
          .repartition(Repartitioned.<String, byte[]>as(DEDUP)
              .withKeySerde(Serdes.String())
              .withValueSerde(Serdes.ByteArray()));
    }
    stream.process(
        () -> kv ? new KeyValueDedup(retentionMs, repartition)
            : new WindowDedup(retentionMs, repartition),
        Named.as(DEDUP), STORE);
    // Two named sinks under the dedup processor, which forwards to one or the other.
    Topology t = builder.build(props);
    t.addSink(OUTPUT_SINK, output, Serdes.String().serializer(), Serdes.ByteArray().serializer(),
        DEDUP);
    t.addSink(DUPLICATES_SINK, duplicates, Serdes.String().serializer(),
        Serdes.ByteArray().serializer(), DEDUP);
    return t;
  }

  /** First occurrence → output; seen within the retention → duplicates. */
  abstract static class Dedup implements Processor<String, byte[], String, byte[]> {
    final long retentionMs;
    /** Whether the record key is the id already (re-keyed by the repartition step). */
    private final boolean keyedById;
    ProcessorContext<String, byte[]> context;

    Dedup(long retentionMs, boolean keyedById) {
      this.retentionMs = retentionMs;
      this.keyedById = keyedById;
    }

    @Override
    public void init(ProcessorContext<String, byte[]> context) {
      this.context = context;
    }

    /** Whether `id` was first seen within the retention before `time`; remembers it if not. */
    abstract boolean seenBefore(String id, long time);

    @Override
    public void process(Record<String, byte[]> record) {
      String id = keyedById ? record.key() : requireId(record.value());
      boolean duplicate = seenBefore(id, record.timestamp());
      Record<String, byte[]> out = record.withKey(id);
      out.headers().add(DEDUP_ID_HEADER, id.getBytes(StandardCharsets.UTF_8));
      context.forward(out, duplicate ? DUPLICATES_SINK : OUTPUT_SINK);
    }
  }

  /** A window store: a range fetch over the retention per record. */
  static final class WindowDedup extends Dedup {
    private WindowStore<String, Long> seen;

    WindowDedup(long retentionMs, boolean keyedById) {
      super(retentionMs, keyedById);
    }

    @Override
    public void init(ProcessorContext<String, byte[]> context) {
      super.init(context);
      this.seen = context.getStateStore(STORE);
    }

    @Override
    boolean seenBefore(String id, long time) {
      try (WindowStoreIterator<Long> it =
          seen.fetch(id, time - retentionMs + 1, time + retentionMs - 1)) {
        if (it.hasNext()) {
          return true;
        }
      }
      seen.put(id, time, time);
      return false;
    }
  }

  /** A key-value store: a point lookup per record, expiry by a stream-time punctuation. */
  static final class KeyValueDedup extends Dedup {
    private KeyValueStore<String, Long> seen;

    KeyValueDedup(long retentionMs, boolean keyedById) {
      super(retentionMs, keyedById);
    }

    @Override
    public void init(ProcessorContext<String, byte[]> context) {
      super.init(context);
      this.seen = context.getStateStore(STORE);
      context.schedule(
          Duration.ofMillis(Math.max(1, retentionMs / 2)), PunctuationType.STREAM_TIME,
          this::expire);
    }

    @Override
    boolean seenBefore(String id, long time) {
      Long first = seen.get(id);
      if (first != null && time - first < retentionMs) {
        return true;
      }
      seen.put(id, time);
      return false;
    }

    /** Deletes the ids first seen more than the retention before stream time `now`. */
    private void expire(long now) {
      List<String> expired = new ArrayList<>();
      try (KeyValueIterator<String, Long> it = seen.all()) {
        while (it.hasNext()) {
          KeyValue<String, Long> entry = it.next();
          if (entry.value <= now - retentionMs) {
            expired.add(entry.key);
          }
        }
      }
      for (String id : expired) {
        seen.delete(id);
      }
    }
  }

  private static final ObjectMapper JSON = new ObjectMapper();

  /** The id at "/id" of a JSON value; the benchmark's input always carries one. */
  static String requireId(byte[] value) {
    if (value != null) {
      try {
        JsonNode id = JSON.readTree(value).at("/id");
        if (id.isTextual() || id.isNumber()) {
          return id.asText();
        }
      } catch (IOException e) {
        // Falls through: the processor would dead-letter this record.
      }
    }
    throw new IllegalArgumentException("a record without an id");
  }

  /** Prints what each partition restored, and the running total. */
  static final class RestoreCounter implements StateRestoreListener {
    private final AtomicLong total = new AtomicLong();

    @Override
    public void onRestoreStart(TopicPartition tp, String store, long start, long end) {
      say("restore-start " + tp + " offsets " + start + ".." + end);
    }

    @Override
    public void onBatchRestored(TopicPartition tp, String store, long batchEnd, long n) {}

    @Override
    public void onRestoreEnd(TopicPartition tp, String store, long restored) {
      say("restored " + tp + " " + restored + " records; total " + total.addAndGet(restored));
    }
  }

  /** Every half second: the stateful tasks this instance runs, its standby copies, their lag. */
  static void reportTasks(KafkaStreams streams, int statefulSubtopology, Path file) {
    Path next = file.resolveSibling(file.getFileName() + ".next");
    while (true) {
      try {
        Thread.sleep(500);
        int active = 0;
        Set<Integer> standbys = new HashSet<>();
        for (ThreadMetadata thread : streams.metadataForLocalThreads()) {
          for (TaskMetadata task : thread.activeTasks()) {
            if (task.taskId().subtopology() == statefulSubtopology) {
              active++;
            }
          }
          for (TaskMetadata task : thread.standbyTasks()) {
            standbys.add(task.taskId().partition());
          }
        }
        Map<Integer, LagInfo> lags =
            streams.allLocalStorePartitionLags().getOrDefault(STORE, Map.of());
        long lag = 0;
        for (int partition : standbys) {
          LagInfo info = lags.get(partition);
          // A copy not yet started has no position: not caught up. A caught-up copy's position
          // is just past the last record, before the commit marker that ends the changelog
          // under exactly-once: that one offset is not lag.
          lag += info == null ? Long.MAX_VALUE / 1024 : Math.max(0, info.offsetLag() - 1);
        }
        Files.writeString(
            next,
            "active=" + active + " standby-copies=" + standbys.size() + " standby-lag=" + lag
                + "\n");
        Files.move(next, file, StandardCopyOption.REPLACE_EXISTING,
            StandardCopyOption.ATOMIC_MOVE);
      } catch (InterruptedException e) {
        return;
      } catch (Exception e) {
        // Not running (starting, rebalancing, closing): the last report stands.
      }
    }
  }

  static void say(String line) {
    System.out.println(System.currentTimeMillis() + " " + line);
    System.out.flush();
  }

  static Map<String, String> parse(String[] argv) {
    Map<String, String> args = new HashMap<>();
    for (String a : argv) {
      int eq = a.indexOf('=');
      if (eq < 0) {
        throw new IllegalArgumentException("expected key=value, got " + a);
      }
      args.put(a.substring(0, eq), a.substring(eq + 1));
    }
    return args;
  }

  static String required(Map<String, String> args, String name) {
    String v = args.get(name);
    if (v == null) {
      throw new IllegalArgumentException("missing " + name + "=...");
    }
    return v;
  }

  private DedupApp() {}
}
