package warren.bench;

import com.rabbitmq.stream.Address;
import com.rabbitmq.stream.ConfirmationHandler;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.ConsumerUpdateListener;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.Message;
import com.rabbitmq.stream.NoOffsetException;
import com.rabbitmq.stream.OffsetSpecification;
import com.rabbitmq.stream.Producer;
import com.rabbitmq.stream.StreamException;
import com.rabbitmq.stream.StreamStats;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentSkipListSet;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.BooleanSupplier;
import java.util.function.Function;

/**
 * One interop and throughput run of RabbitMQ's Java stream client (com.rabbitmq:stream-client)
 * against a broker's stream port: publish with confirms, consume from the first offset, named
 * producer deduplication, server-side offset tracking, a super stream, single active consumers
 * on a super stream. One line per check (ok / FAIL), then a summary with the rates; exit status
 * 1 if any check failed.
 */
public final class StreamJava {

  // ---- options -------------------------------------------------------------------------------
  String host = "127.0.0.1";
  int port = 5552;
  String user = "guest";
  String password = "guest";
  String vhost = "/";
  String label = "broker";
  int messages = 200_000;
  int size = 100;
  int dedupMessages = 1_000;
  int superMessages = 3_000;
  int timeoutS = 120;
  boolean superStream = true;
  boolean sac = true;
  boolean streamStats = true;
  /** Connect where the broker's metadata says (a cluster's leader and replicas) rather than
   *  mapping every advertised address to --host/--port. */
  boolean advertised = false;

  // ---- results -------------------------------------------------------------------------------
  int ok = 0;
  final List<String> failed = new ArrayList<>();
  double publishRate = Double.NaN;
  double consumeRate = Double.NaN;
  final List<AutoCloseable> open = new CopyOnWriteArrayList<>();

  public static void main(String[] args) throws Exception {
    StreamJava run = new StreamJava();
    run.parse(args);
    System.exit(run.run());
  }

  void parse(String[] args) {
    for (int i = 0; i < args.length; i++) {
      String a = args[i];
      switch (a) {
        case "--host": host = args[++i]; break;
        case "--port": port = Integer.parseInt(args[++i]); break;
        case "--user": user = args[++i]; break;
        case "--password": password = args[++i]; break;
        case "--vhost": vhost = args[++i]; break;
        case "--label": label = args[++i]; break;
        case "--messages": messages = Integer.parseInt(args[++i]); break;
        case "--size": size = Integer.parseInt(args[++i]); break;
        case "--dedup-messages": dedupMessages = Integer.parseInt(args[++i]); break;
        case "--super-messages": superMessages = Integer.parseInt(args[++i]); break;
        case "--timeout": timeoutS = Integer.parseInt(args[++i]); break;
        case "--no-super-stream": superStream = false; sac = false; break;
        case "--no-sac": sac = false; break;
        case "--no-stream-stats": streamStats = false; break;
        case "--advertised": advertised = true; break;
        case "-h": case "--help":
          System.out.println(
              "usage: java -jar stream-java.jar [--host H] [--port P] [--user U] [--password P]\n"
                  + "  [--vhost V] [--label NAME] [--messages N] [--size BYTES] [--dedup-messages N]\n"
                  + "  [--super-messages N] [--timeout S] [--no-super-stream] [--no-sac] [--no-stream-stats]\n  [--advertised]");
          System.exit(0);
        default:
          System.err.println("unknown argument: " + a);
          System.exit(2);
      }
    }
    if (messages < 2 || size < 1) {
      System.err.println("--messages must be at least 2 and --size at least 1");
      System.exit(2);
    }
  }

  // ---- reporting -----------------------------------------------------------------------------
  void check(String name, boolean pass, String detail) {
    System.out.println((pass ? "ok   " : "FAIL ") + name + ": " + detail);
    System.out.flush();
    if (pass) ok++;
    else failed.add(name);
  }

  interface Step {
    void run() throws Exception;
  }

  /** Runs a group of checks; an exception is a FAIL of that group, and the run goes on. */
  void section(String name, Step step) {
    try {
      step.run();
    } catch (Throwable t) {
      check(name, false, "exception " + describe(t));
      t.printStackTrace(System.err);
    }
  }

  static String describe(Throwable t) {
    StringBuilder b = new StringBuilder();
    for (Throwable c = t; c != null; c = c.getCause()) {
      if (c != t) b.append(" <- caused by ");
      b.append(c.getClass().getName()).append(": ").append(c.getMessage());
      if (c instanceof StreamException && ((StreamException) c).getCode() != 0) {
        b.append(" (code ").append(((StreamException) c).getCode()).append(')');
      }
      if (c.getCause() == c) break;
    }
    return b.toString();
  }

  static void attempt(List<String> problems, String what, Step step) {
    try {
      step.run();
    } catch (Throwable t) {
      problems.add(what + ": " + describe(t));
      t.printStackTrace(System.err);
    }
  }

  static boolean await(BooleanSupplier cond, long timeoutMs) throws InterruptedException {
    long end = System.currentTimeMillis() + timeoutMs;
    while (!cond.getAsBoolean()) {
      if (System.currentTimeMillis() > end) return cond.getAsBoolean();
      Thread.sleep(20);
    }
    return true;
  }

  static String rate(double r) {
    return Double.isNaN(r) ? "n/a" : String.format("%.0f", r);
  }

  /** Message i's body: i as 8 big-endian bytes (as far as the size allows), then a pattern. */
  static byte[] body(long i, int size) {
    byte[] b = new byte[size];
    ByteBuffer.wrap(b, 0, Math.min(8, size)).put(
        Arrays.copyOfRange(ByteBuffer.allocate(8).putLong(i).array(), 0, Math.min(8, size)));
    for (int j = 8; j < size; j++) b[j] = (byte) (i * 31 + j);
    return b;
  }

  static long index(byte[] body) {
    byte[] eight = new byte[8];
    System.arraycopy(body, 0, eight, 0, Math.min(8, body.length));
    return ByteBuffer.wrap(eight).getLong();
  }

  /** Counts a producer's confirmations. */
  static final class Confirms implements ConfirmationHandler {
    final AtomicLong confirmed = new AtomicLong();
    final AtomicLong nacked = new AtomicLong();
    final Map<Short, AtomicLong> codes = new ConcurrentHashMap<>();

    @Override
    public void handle(com.rabbitmq.stream.ConfirmationStatus status) {
      if (status.isConfirmed()) confirmed.incrementAndGet();
      else {
        nacked.incrementAndGet();
        codes.computeIfAbsent(status.getCode(), c -> new AtomicLong()).incrementAndGet();
      }
    }

    long done() {
      return confirmed.get() + nacked.get();
    }

    String summary() {
      return "confirmed " + confirmed.get() + ", failed " + nacked.get()
          + (codes.isEmpty() ? "" : " (codes " + new TreeMap<>(codes) + ")");
    }
  }

  Environment env;

  <T extends AutoCloseable> T track(T c) {
    open.add(c);
    return c;
  }

  void close(AutoCloseable c) {
    if (c == null) return;
    open.remove(c);
    try {
      c.close();
    } catch (Exception e) {
      System.err.println("close: " + describe(e));
    }
  }

  // ---- the run -------------------------------------------------------------------------------
  int run() throws Exception {
    String uid = Long.toString(System.currentTimeMillis(), 36)
        + Integer.toString(ThreadLocalRandom.current().nextInt(1 << 20), 36);
    Address target = new Address(host, port);
    System.out.println("# stream-client 1.2.0 against " + label + " at " + host + ":" + port
        + ", " + messages + " messages of " + size + " bytes, run " + uid);
    try {
      com.rabbitmq.stream.EnvironmentBuilder b = Environment.builder()
          .host(host).port(port)
          .username(user).password(password).virtualHost(vhost);
      if (!advertised) {
        // the broker advertises its own host:port for each stream's leader and replicas
        b = b.addressResolver(a -> target);
      }
      env = b.build();
      check("connect", true, "environment to " + host + ":" + port);
    } catch (Throwable t) {
      check("connect", false, describe(t));
      return summary();
    }

    String stream = "java-stream-" + uid;
    String dedupStream = "java-dedup-" + uid;
    String superName = "java-super-" + uid;
    String sacName = "java-sac-" + uid;
    List<String> streams = new ArrayList<>();
    List<String> superStreams = new ArrayList<>();

    boolean created = false;
    try {
      env.streamCreator().stream(stream).create();
      streams.add(stream);
      created = env.streamExists(stream);
      check("create stream", created, stream + (created ? " exists" : " not found after create"));
    } catch (Throwable t) {
      check("create stream", false, describe(t));
    }
    if (created) {
      section("publish", () -> publish(stream));
      if (streamStats) {
        section("stream stats", () -> {
          StreamStats st = env.queryStreamStats(stream);
          check("stream stats", st.firstOffset() == 0 && st.committedChunkId() >= 0,
              "first offset " + st.firstOffset() + ", committed chunk id " + st.committedChunkId());
        });
      } else {
        System.out.println("skip stream stats: --no-stream-stats");
      }
      section("consume", () -> consume(stream));
      section("offset tracking", () -> offsetTracking(stream, "tracker-" + uid));
    }
    section("deduplication", () -> {
      env.streamCreator().stream(dedupStream).create();
      streams.add(dedupStream);
      deduplication(dedupStream, "dedup-producer-" + uid);
    });
    if (superStream) {
      section("super stream", () -> {
        env.streamCreator().name(superName).superStream().partitions(3).creator().create();
        superStreams.add(superName);
        superStreamCheck(superName);
      });
    } else {
      System.out.println("skip super stream: --no-super-stream");
    }
    if (sac) {
      section("single active consumer", () -> {
        env.streamCreator().name(sacName).superStream().partitions(3).creator().create();
        superStreams.add(sacName);
        singleActiveConsumer(sacName, "sac-app-" + uid);
      });
    } else {
      System.out.println("skip single active consumer on a super stream: "
          + (superStream ? "--no-sac" : "--no-super-stream"));
    }

    for (AutoCloseable c : open) close(c);
    // each deletion and each look-up after it on its own, so one failure leaves the rest tried
    List<String> problems = new ArrayList<>();
    List<String> toCheck = new ArrayList<>();
    for (String s : streams) {
      attempt(problems, "deleteStream(" + s + ")", () -> env.deleteStream(s));
      toCheck.add(s);
    }
    for (String s : superStreams) {
      attempt(problems, "deleteSuperStream(" + s + ")", () -> env.deleteSuperStream(s));
      for (int p = 0; p < 3; p++) toCheck.add(s + "-" + p);
    }
    // a look-up that throws is likely to throw for each (and may take the client's 3 x 10 s)
    int looked = 0;
    for (String s : toCheck) {
      int before = problems.size();
      attempt(problems, "streamExists(" + s + ")", () -> {
        if (env.streamExists(s)) throw new IllegalStateException("still exists");
      });
      looked++;
      if (problems.size() > before && !problems.get(before).endsWith("still exists")) {
        if (looked < toCheck.size()) {
          problems.add((toCheck.size() - looked) + " more streams not looked up");
        }
        break;
      }
    }
    check("delete", problems.isEmpty(), problems.isEmpty()
        ? "deleted " + streams.size() + " streams and " + superStreams.size()
            + " super streams, none of the " + toCheck.size() + " streams left"
        : problems.size() + " problems: " + String.join("; ", problems));
    try {
      env.close();
    } catch (Throwable t) {
      System.err.println("environment close: " + describe(t));
    }
    return summary();
  }

  int summary() {
    System.out.println("summary " + label + ": publish " + rate(publishRate) + " msg/s, consume "
        + rate(consumeRate) + " msg/s (" + messages + " x " + size + " B); checks " + ok + " ok, "
        + failed.size() + " FAIL" + (failed.isEmpty() ? "" : " " + failed));
    return failed.isEmpty() ? 0 : 1;
  }

  // 200k messages through one producer, every one confirmed.
  void publish(String stream) throws Exception {
    Producer producer = track(env.producerBuilder().stream(stream).build());
    Confirms confirms = new Confirms();
    long t0 = System.nanoTime();
    for (int i = 0; i < messages; i++) {
      producer.send(producer.messageBuilder().addData(body(i, size)).build(), confirms);
    }
    boolean all = await(() -> confirms.done() >= messages, timeoutS * 1000L);
    double secs = (System.nanoTime() - t0) / 1e9;
    if (all) publishRate = messages / secs;
    check("publish", all && confirms.confirmed.get() == messages && confirms.nacked.get() == 0,
        messages + " sent, " + confirms.summary()
            + (all ? String.format(" in %.2f s, %s msg/s", secs, rate(publishRate))
                : " after waiting " + timeoutS + " s"));
    close(producer);
  }

  // All of them back from the first offset: offsets 0..N-1 in order, the bodies as sent.
  void consume(String stream) throws Exception {
    AtomicLong count = new AtomicLong();
    AtomicLong wrongOffset = new AtomicLong();
    AtomicLong wrongBody = new AtomicLong();
    AtomicReference<String> firstProblem = new AtomicReference<>();
    CountDownLatch all = new CountDownLatch(1);
    long t0 = System.nanoTime();
    AtomicLong tEnd = new AtomicLong();
    Consumer consumer = track(env.consumerBuilder().stream(stream)
        .offset(OffsetSpecification.first())
        .messageHandler((ctx, msg) -> {
          long n = count.getAndIncrement();
          if (ctx.offset() != n) {
            wrongOffset.incrementAndGet();
            firstProblem.compareAndSet(null, "message #" + n + " at offset " + ctx.offset());
          } else if (!Arrays.equals(msg.getBodyAsBinary(), body(n, size))) {
            wrongBody.incrementAndGet();
            firstProblem.compareAndSet(null, "offset " + n + ": body of " + msg.getBodyAsBinary().length
                + " bytes, index " + index(msg.getBodyAsBinary()));
          }
          if (n + 1 == messages) {
            tEnd.set(System.nanoTime());
            all.countDown();
          }
        })
        .build());
    boolean got = all.await(timeoutS, TimeUnit.SECONDS);
    double secs = ((got ? tEnd.get() : System.nanoTime()) - t0) / 1e9;
    if (got) consumeRate = messages / secs;
    Thread.sleep(500); // nothing beyond the N should follow
    check("consume", got && count.get() == messages && wrongOffset.get() == 0 && wrongBody.get() == 0,
        count.get() + " of " + messages + " received, " + wrongOffset.get() + " out of order, "
            + wrongBody.get() + " with a wrong body"
            + (firstProblem.get() == null ? "" : " (first: " + firstProblem.get() + ")")
            + (got ? String.format(" in %.2f s, %s msg/s", secs, rate(consumeRate))
                : " after waiting " + timeoutS + " s"));
    close(consumer);
  }

  // Server-side offsets: a named consumer stores offset T (store offset), storedOffset() reads it
  // back (query offset), a restarted consumer of that name resumes at T+1, and the environment's
  // storeOffset under another reference is read back too.
  void offsetTracking(String stream, String ref) throws Exception {
    long target = messages / 2;
    CountDownLatch reached = new CountDownLatch(1);
    Consumer consumer = track(env.consumerBuilder().stream(stream).name(ref)
        .offset(OffsetSpecification.first())
        .manualTrackingStrategy().builder()
        .messageHandler((ctx, msg) -> {
          if (ctx.offset() == target) {
            ctx.storeOffset();
            reached.countDown();
          }
        })
        .build());
    if (!reached.await(timeoutS, TimeUnit.SECONDS)) {
      check("store offset", false, "offset " + target + " never delivered to the named consumer");
      close(consumer);
      return;
    }
    AtomicLong stored = new AtomicLong(-1);
    AtomicReference<String> error = new AtomicReference<>();
    boolean back = await(() -> {
      try {
        stored.set(consumer.storedOffset());
        return stored.get() == target;
      } catch (NoOffsetException e) {
        error.set(describe(e));
        return false;
      }
    }, 10_000);
    check("store offset", back, "consumer '" + ref + "' stored " + target + ", storedOffset() = "
        + stored.get() + (back || error.get() == null ? "" : " (last: " + error.get() + ")"));
    close(consumer);

    // the client looks the stored offset up when a named, tracking consumer subscribes
    AtomicLong first = new AtomicLong(-1);
    Consumer again = track(env.consumerBuilder().stream(stream).name(ref)
        .offset(OffsetSpecification.first())
        .manualTrackingStrategy().builder()
        .messageHandler((ctx, msg) -> first.compareAndSet(-1, ctx.offset()))
        .build());
    await(() -> first.get() >= 0, 10_000);
    check("resume after stored offset", first.get() == target + 1,
        "a new consumer '" + ref + "' started at offset " + first.get() + ", expected " + (target + 1));
    close(again);

    String ref2 = ref + "-env";
    long envOffset = 42;
    env.storeOffset(ref2, stream, envOffset);
    Consumer probe = track(env.consumerBuilder().stream(stream).name(ref2)
        .offset(OffsetSpecification.next())
        .manualTrackingStrategy().builder()
        .messageHandler((ctx, msg) -> {})
        .build());
    AtomicLong envStored = new AtomicLong(-1);
    error.set(null);
    boolean envBack = await(() -> {
      try {
        envStored.set(probe.storedOffset());
        return envStored.get() == envOffset;
      } catch (NoOffsetException e) {
        error.set(describe(e));
        return false;
      }
    }, 10_000);
    check("environment storeOffset", envBack, "env.storeOffset('" + ref2 + "', " + envOffset
        + "), storedOffset() = " + envStored.get()
        + (envBack || error.get() == null ? "" : " (last: " + error.get() + ")"));
    close(probe);
  }

  // A named producer publishes ids 1..M; a second one of the same name re-sends 1..M and then
  // M+1..M+K: the stream must hold M+K messages, each once.
  void deduplication(String stream, String producerName) throws Exception {
    int m = dedupMessages;
    int k = dedupMessages / 2;
    Producer first = track(env.producerBuilder().stream(stream).name(producerName).build());
    Confirms c1 = new Confirms();
    for (int id = 1; id <= m; id++) {
      first.send(first.messageBuilder().publishingId(id).addData(body(id, size)).build(), c1);
    }
    boolean all1 = await(() -> c1.done() >= m, timeoutS * 1000L);
    check("dedup first producer", all1 && c1.confirmed.get() == m,
        "'" + producerName + "' published ids 1.." + m + ": " + c1.summary());
    close(first);

    Producer second = track(env.producerBuilder().stream(stream).name(producerName).build());
    long last = second.getLastPublishingId();
    check("query publisher sequence", last == m,
        "a new producer '" + producerName + "' sees last publishing id " + last + ", expected " + m);
    Confirms c2 = new Confirms();
    for (int id = 1; id <= m + k; id++) {
      second.send(second.messageBuilder().publishingId(id).addData(body(id, size)).build(), c2);
    }
    boolean all2 = await(() -> c2.done() >= m + k, timeoutS * 1000L);
    check("dedup re-send answered", all2,
        "re-sent ids 1.." + m + " and new " + (m + 1) + ".." + (m + k) + ": " + c2.summary());
    close(second);

    Map<Long, AtomicLong> seen = new ConcurrentHashMap<>();
    AtomicLong count = new AtomicLong();
    Consumer consumer = track(env.consumerBuilder().stream(stream)
        .offset(OffsetSpecification.first())
        .messageHandler((ctx, msg) -> {
          count.incrementAndGet();
          seen.computeIfAbsent(index(msg.getBodyAsBinary()), x -> new AtomicLong()).incrementAndGet();
        })
        .build());
    await(() -> count.get() >= m + k, 30_000);
    Thread.sleep(1000); // a duplicate would show as more
    long twice = seen.values().stream().filter(v -> v.get() > 1).count();
    boolean exact = count.get() == m + k && seen.size() == m + k && twice == 0;
    for (long id = 1; exact && id <= m + k; id++) exact = seen.containsKey(id);
    check("deduplication", exact, "stream holds " + count.get() + " messages (expected " + (m + k)
        + "), " + seen.size() + " distinct ids, " + twice + " stored more than once");
    close(consumer);
  }

  static final Function<Message, String> MESSAGE_ID = msg -> msg.getProperties().getMessageIdAsString();

  // Hash routing (the client hashes the message id over the partitions the broker lists) and
  // key routing (the broker's route command), one super stream consumer: each message once, a
  // key-routed one on the partition of its key.
  void superStreamCheck(String name) throws Exception {
    List<String> missing = new ArrayList<>();
    for (int p = 0; p < 3; p++) if (!env.streamExists(name + "-" + p)) missing.add(name + "-" + p);
    check("create super stream", missing.isEmpty(),
        missing.isEmpty() ? name + " with partitions " + name + "-0..2" : "missing partitions " + missing);

    int n = superMessages;
    int keyed = 300;
    Producer hashed = track(env.producerBuilder().superStream(name)
        .routing(MESSAGE_ID).producerBuilder().build());
    Confirms c1 = new Confirms();
    for (int i = 0; i < n; i++) {
      hashed.send(hashed.messageBuilder().properties().messageId("h-" + i).messageBuilder()
          .addData(body(i, size)).build(), c1);
    }
    // key routing: the routing key is the partition's binding key ("0", "1", "2")
    Producer byKey = track(env.producerBuilder().superStream(name)
        .routing(msg -> String.valueOf(Long.parseLong(MESSAGE_ID.apply(msg).substring(2)) % 3))
        .key().producerBuilder().build());
    Confirms c2 = new Confirms();
    for (int i = 0; i < keyed; i++) {
      byKey.send(byKey.messageBuilder().properties().messageId("k-" + i).messageBuilder()
          .addData(body(i, size)).build(), c2);
    }
    boolean all = await(() -> c1.done() >= n && c2.done() >= keyed, timeoutS * 1000L);
    check("super stream publish", all && c1.confirmed.get() == n && c2.confirmed.get() == keyed,
        "hash-routed " + n + ": " + c1.summary() + "; key-routed " + keyed + ": " + c2.summary());
    close(hashed);
    close(byKey);

    Map<String, AtomicLong> seen = new ConcurrentHashMap<>();
    Map<String, AtomicLong> perPartition = new ConcurrentHashMap<>();
    Set<String> misrouted = new ConcurrentSkipListSet<>();
    AtomicLong count = new AtomicLong();
    Consumer consumer = track(env.consumerBuilder().superStream(name)
        .offset(OffsetSpecification.first())
        .messageHandler((ctx, msg) -> {
          String id = MESSAGE_ID.apply(msg);
          seen.computeIfAbsent(id, x -> new AtomicLong()).incrementAndGet();
          perPartition.computeIfAbsent(ctx.stream(), x -> new AtomicLong()).incrementAndGet();
          if (id.startsWith("k-")
              && !ctx.stream().equals(name + "-" + (Long.parseLong(id.substring(2)) % 3))) {
            misrouted.add(id + "@" + ctx.stream());
          }
          count.incrementAndGet();
        })
        .build());
    await(() -> count.get() >= n + keyed, 30_000);
    Thread.sleep(1000);
    long twice = seen.values().stream().filter(v -> v.get() > 1).count();
    check("super stream consume", count.get() == n + keyed && seen.size() == n + keyed && twice == 0,
        count.get() + " received of " + (n + keyed) + ", " + seen.size() + " distinct, " + twice
            + " more than once; per partition " + new TreeMap<>(perPartition));
    check("super stream key routing", misrouted.isEmpty() && perPartition.size() == 3,
        misrouted.isEmpty() ? "every key-routed message on the partition of its key"
            : misrouted.size() + " on another partition, e.g. " + misrouted.iterator().next());
    close(consumer);
  }

  // Two single active consumers of one name on a 3-partition super stream, both subscribed
  // before anything is published: each message reaches exactly one of them, each partition is
  // consumed by exactly one, the two share the partitions; after A closes, B gets every
  // partition and what is published then, once. Offsets are kept in the application (the
  // client's documented external-store pattern): an activated consumer resumes after the last
  // offset seen on that partition.
  void singleActiveConsumer(String name, String app) throws Exception {
    Map<String, Long> lastSeen = new ConcurrentHashMap<>();
    Map<String, Set<String>> consumersOf = new ConcurrentHashMap<>();
    Map<String, AtomicLong> seen = new ConcurrentHashMap<>();
    Map<String, String> activeOn = new ConcurrentHashMap<>(); // partition -> last activated
    List<String> updates = new CopyOnWriteArrayList<>();
    AtomicLong count = new AtomicLong();

    Function<String, Consumer> build = who -> env.consumerBuilder().superStream(name).name(app)
        .singleActiveConsumer()
        .offset(OffsetSpecification.first())
        .noTrackingStrategy()
        .consumerUpdateListener(ctx -> {
          updates.add(who + (ctx.isActive() ? "+" : "-") + ctx.stream().substring(name.length()));
          if (ctx.isActive()) activeOn.put(ctx.stream(), who);
          else activeOn.remove(ctx.stream(), who);
          Long last = lastSeen.get(ctx.stream());
          return last == null ? OffsetSpecification.first() : OffsetSpecification.offset(last + 1);
        })
        .messageHandler((ctx, msg) -> {
          lastSeen.merge(ctx.stream(), ctx.offset(), Math::max);
          consumersOf.computeIfAbsent(ctx.stream(), x -> new ConcurrentSkipListSet<>()).add(who);
          seen.computeIfAbsent(MESSAGE_ID.apply(msg), x -> new AtomicLong()).incrementAndGet();
          count.incrementAndGet();
        })
        .build();

    Consumer a = track(build.apply("A"));
    Thread.sleep(1000);
    Consumer b = track(build.apply("B"));
    Thread.sleep(3000); // the group settles: the partitions are shared out

    int n = superMessages;
    Producer producer = track(env.producerBuilder().superStream(name)
        .routing(MESSAGE_ID).producerBuilder().build());
    Confirms c1 = new Confirms();
    for (int i = 0; i < n; i++) {
      producer.send(producer.messageBuilder().properties().messageId("s-" + i).messageBuilder()
          .addData(body(i, size)).build(), c1);
    }
    boolean all = await(() -> c1.done() >= n, timeoutS * 1000L);
    check("sac publish", all && c1.confirmed.get() == n, n + " hash-routed: " + c1.summary());
    await(() -> count.get() >= n, 30_000);
    Thread.sleep(1000);

    long twice = seen.values().stream().filter(v -> v.get() > 1).count();
    check("sac each message once", count.get() == n && seen.size() == n && twice == 0,
        count.get() + " received of " + n + ", " + seen.size() + " distinct, " + twice
            + " more than once");
    Map<String, Set<String>> byPartition = new TreeMap<>();
    consumersOf.forEach((p, s) -> byPartition.put(p.substring(name.length()), new TreeSet<>(s)));
    boolean onePer = consumersOf.size() == 3 && consumersOf.values().stream().allMatch(s -> s.size() == 1);
    Set<String> who = new TreeSet<>();
    consumersOf.values().forEach(who::addAll);
    check("sac one consumer per partition", onePer,
        "consumers per partition " + byPartition + "; consumer updates " + updates);
    check("sac partitions shared", who.size() == 2,
        who.size() == 2 ? "both consumers active" : "only " + who + " received messages");

    // failover: A goes, B takes over its partitions
    close(a);
    Thread.sleep(3000);
    consumersOf.clear();
    seen.clear();
    count.set(0);
    int n2 = 300;
    Confirms c2 = new Confirms();
    for (int i = 0; i < n2; i++) {
      producer.send(producer.messageBuilder().properties().messageId("t-" + i).messageBuilder()
          .addData(body(i, size)).build(), c2);
    }
    await(() -> c2.done() >= n2, timeoutS * 1000L);
    await(() -> count.get() >= n2, 30_000);
    Thread.sleep(1000);
    twice = seen.values().stream().filter(v -> v.get() > 1).count();
    Map<String, Set<String>> after = new TreeMap<>();
    consumersOf.forEach((p, s) -> after.put(p.substring(name.length()), new TreeSet<>(s)));
    boolean onlyB = consumersOf.size() == 3
        && consumersOf.values().stream().allMatch(s -> s.equals(Set.of("B")));
    check("sac failover", onlyB && count.get() == n2 && seen.size() == n2 && twice == 0,
        "after A closed: " + count.get() + " of " + n2 + " received (" + c2.summary() + "), "
            + twice + " more than once, consumers per partition " + after
            + "; consumer updates " + updates);
    close(producer);
    close(b);
  }
}
