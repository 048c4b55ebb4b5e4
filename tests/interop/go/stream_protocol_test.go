package interop

// RabbitMQ's stream protocol with RabbitMQ's Go stream client: a stream declared, messages
// published with confirms and read back from the first offset with their application
// properties. Against the suite's broker: the session Warren (its --stream-port) or RabbitMQ
// 3.10 with its stream plugin (STREAM_PORT, default 5553).

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/amqp"
	"github.com/rabbitmq/rabbitmq-stream-go-client/pkg/stream"
)

// streamPort is the broker's stream protocol port (set by TestMain for a session Warren).
var streamPort int

func streamEnv(t *testing.T) *stream.Environment {
	t.Helper()
	if clusterModeOn() {
		t.Skip("the stream protocol runs on a single node")
	}
	port := streamPort
	if port == 0 {
		port = 5553
		if p, err := strconv.Atoi(os.Getenv("STREAM_PORT")); err == nil {
			port = p
		}
	}
	env, err := stream.NewEnvironment(stream.NewEnvironmentOptions().
		SetHost("127.0.0.1").SetPort(port).SetUser("guest").SetPassword("guest"))
	if err != nil {
		t.Fatalf("stream environment: %v", err)
	}
	t.Cleanup(func() { _ = env.Close() })
	return env
}

func TestStreamProtocolPublishAndConsume(t *testing.T) {
	env := streamEnv(t)
	name := fmt.Sprintf("go-stream-%d", time.Now().UnixNano())
	if err := env.DeclareStream(name, stream.NewStreamOptions().SetMaxLengthBytes(stream.ByteCapacity{}.MB(10))); err != nil {
		t.Fatalf("declare: %v", err)
	}
	defer func() { _ = env.DeleteStream(name) }()
	// Declared again as it is: "already exists", which the client takes as done; with other
	// arguments: a failed precondition.
	if err := env.DeclareStream(name, stream.NewStreamOptions().SetMaxLengthBytes(stream.ByteCapacity{}.MB(10))); err != nil {
		t.Fatalf("declaring it again: %v", err)
	}
	if err := env.DeclareStream(name, nil); err != stream.PreconditionFailed {
		t.Fatalf("declaring it with other arguments: %v, want PreconditionFailed", err)
	}

	producer, err := env.NewProducer(name, nil)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	confirms := producer.NotifyPublishConfirmation()
	const n = 100
	for i := 0; i < n; i++ {
		m := amqp.NewMessage([]byte(fmt.Sprintf("m%d", i)))
		m.ApplicationProperties = map[string]any{"i": int64(i)}
		if err := producer.Send(m); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	confirmed := 0
	deadline := time.After(20 * time.Second)
	for confirmed < n {
		select {
		case batch := <-confirms:
			for _, c := range batch {
				if !c.IsConfirmed() {
					t.Fatalf("publish %d not confirmed: %v", c.GetPublishingId(), c.GetError())
				}
				confirmed++
			}
		case <-deadline:
			t.Fatalf("%d of %d confirmed", confirmed, n)
		}
	}
	_ = producer.Close()

	var mu sync.Mutex
	var offsets []int64
	var bodies []string
	var props []any
	done := make(chan struct{})
	consumer, err := env.NewConsumer(name, func(ctx stream.ConsumerContext, m *amqp.Message) {
		mu.Lock()
		defer mu.Unlock()
		offsets = append(offsets, ctx.Consumer.GetOffset())
		bodies = append(bodies, string(m.GetData()))
		props = append(props, m.ApplicationProperties["i"])
		if len(bodies) == n {
			close(done)
		}
	}, stream.NewConsumerOptions().SetOffset(stream.OffsetSpecification{}.First()))
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer func() { _ = consumer.Close() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		mu.Lock()
		t.Fatalf("%d of %d delivered", len(bodies), n)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := 0; i < n; i++ {
		if offsets[i] != int64(i) || bodies[i] != fmt.Sprintf("m%d", i) || fmt.Sprint(props[i]) != fmt.Sprint(i) {
			t.Fatalf("delivery %d: offset %d, body %q, i %v", i, offsets[i], bodies[i], props[i])
		}
	}
}
