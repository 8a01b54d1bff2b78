package dev.streamapp.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.StoreBuilder;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.state.WindowStoreIterator;

/**
 * The dedup topology of streamapp-processor, written the way a Kafka Streams user writes it:
 * the id is read from the JSON value ("/id"); a persistent RocksDB window store (changelogged)
 * remembers when each id was first seen for the retention; a record whose id was seen within
 * the retention goes to the duplicates topic, any other to the output topic, keyed by its id.
 * processing.guarantee=exactly_once_v2, commit.interval.ms=100 (the same as the processor).
 *
 * <p>Usage: {@code DedupApp key=value ...} with bootstrap, application-id, input, output,
 * duplicates, state-dir, retention-ms, transactional-stores (true|false) and optionally
 * group-instance-id (static membership) and ready-file (touched each time the instance reaches
 * RUNNING). It runs until its stdin closes,
 * then closes cleanly. It prints one line per state change and per restored partition on
 * stdout, which the benchmark driver reads.
 */
public final class DedupApp {
  static final String STORE = "dedup-store";
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
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "1");
    props.put(StreamsConfig.STATE_DIR_CONFIG, required(args, "state-dir"));
    props.put(
        StreamsConfig.TRANSACTIONAL_STATE_STORES_CONFIG,
        args.getOrDefault("transactional-stores", "false"));
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    // Static membership, as streamapp-processor has (group.instance.id = pod name): a restarted
    // instance takes its partitions back without waiting for the old member's session to end.
    String instance = args.get("group-instance-id");
    if (instance != null) {
      props.put(
          StreamsConfig.mainConsumerPrefix(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG), instance);
    }

    Topology topology = topology(
        required(args, "input"), required(args, "output"), required(args, "duplicates"),
        retentionMs);
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

    // Runs until the driver closes stdin (a clean stop), or is killed.
    while (System.in.read() >= 0) {
      // Nothing to read: the driver only ever closes it.
    }
    streams.close(Duration.ofSeconds(60));
    say("closed");
  }

  static Topology topology(String input, String output, String duplicates, long retentionMs) {
    StoreBuilder<WindowStore<String, Long>> store = Stores.windowStoreBuilder(
        Stores.persistentWindowStore(
            STORE, Duration.ofMillis(retentionMs), Duration.ofMillis(retentionMs), false),
        Serdes.String(),
        Serdes.Long());
    Topology t = new Topology();
    t.addSource("input", Serdes.String().deserializer(), Serdes.ByteArray().deserializer(), input);
    t.addProcessor("dedup", () -> new Dedup(retentionMs), "input");
    t.addStateStore(store, "dedup");
    t.addSink(OUTPUT_SINK, output, Serdes.String().serializer(), Serdes.ByteArray().serializer(),
        "dedup");
    t.addSink(DUPLICATES_SINK, duplicates, Serdes.String().serializer(),
        Serdes.ByteArray().serializer(), "dedup");
    return t;
  }

  /** First occurrence → output; seen within the retention → duplicates. */
  static final class Dedup implements Processor<String, byte[], String, byte[]> {
    private static final ObjectMapper JSON = new ObjectMapper();
    private final long retentionMs;
    private ProcessorContext<String, byte[]> context;
    private WindowStore<String, Long> seen;

    Dedup(long retentionMs) {
      this.retentionMs = retentionMs;
    }

    @Override
    public void init(ProcessorContext<String, byte[]> context) {
      this.context = context;
      this.seen = context.getStateStore(STORE);
    }

    @Override
    public void process(Record<String, byte[]> record) {
      String id = idOf(record.value());
      if (id == null) {
        // The benchmark's input always carries an id; the processor would dead-letter this.
        throw new IllegalArgumentException("record without an id at " + record.timestamp());
      }
      long time = record.timestamp();
      boolean duplicate;
      try (WindowStoreIterator<Long> it =
          seen.fetch(id, time - retentionMs + 1, time + retentionMs - 1)) {
        duplicate = it.hasNext();
      }
      Record<String, byte[]> out = record.withKey(id);
      out.headers().add(DEDUP_ID_HEADER, id.getBytes(StandardCharsets.UTF_8));
      if (duplicate) {
        context.forward(out, DUPLICATES_SINK);
      } else {
        seen.put(id, time, time);
        context.forward(out, OUTPUT_SINK);
      }
    }

    private static String idOf(byte[] value) {
      if (value == null) {
        return null;
      }
      try {
        JsonNode id = JSON.readTree(value).at("/id");
        return id.isTextual() || id.isNumber() ? id.asText() : null;
      } catch (IOException e) {
        return null;
      }
    }
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
