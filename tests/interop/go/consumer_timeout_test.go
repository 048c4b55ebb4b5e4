package interop

import (
	"os"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Consumer timeout (docs/consumer-timeout.md): RabbitMQ 3.10 has only the global 30-minute
// timeout that closes the channel, so these run against Warren only. amqp091-go announces
// consumer_cancel_notify and hands the server's basic.cancel to NotifyCancel.

// A timeout fires within its value plus one check period (1 s); this bounds it generously.
const expiryWait = 6 * time.Second

func skipUnlessWarren(t *testing.T) {
	if os.Getenv("WARREN_BIN") == "" {
		t.Skip("per-consumer timeouts and cancel-on-timeout are RabbitMQ 4.3's; the reference is 3.10: Warren only (WARREN_BIN)")
	}
}

func TestConsumerTimeoutCancelsAndRequeues(t *testing.T) {
	skipUnlessWarren(t)
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, nil)
	publish(t, ch, "", q, "a")
	publish(t, ch, "", q, "b")
	cch := c.ch(conn)
	cancels := cch.NotifyCancel(make(chan string, 1))
	tag := c.name("tag")
	ds, err := cch.Consume(q, tag, false, false, false, false, amqp.Table{"x-consumer-timeout": int32(1000)})
	must(t, err)
	held := recvN(t, ds, 2)
	select {
	case got := <-cancels:
		if got != tag {
			t.Fatalf("cancel for %q, want %q", got, tag)
		}
	case <-time.After(expiryWait):
		t.Fatal("no basic.cancel after the consumer timeout")
	}
	select {
	case _, ok := <-ds:
		if ok {
			t.Fatal("delivery after the timeout's cancel")
		}
	case <-timeAfter():
		t.Fatal("deliveries not closed after the timeout's cancel")
	}
	// Late acks of the reclaimed tags are ignored: the channel stays open.
	must(t, held[0].Ack(false))
	must(t, held[1].Nack(false, true))
	if got := inspect(t, cch, q); got.Messages != 2 || got.Consumers != 0 {
		t.Fatalf("after the timeout: %d messages, %d consumers; want 2, 0", got.Messages, got.Consumers)
	}
	// Both come back, flagged redelivered, on the same channel.
	ds2, err := cch.Consume(q, "", false, false, false, false, nil)
	must(t, err)
	for _, d := range recvN(t, ds2, 2) {
		if !d.Redelivered {
			t.Fatalf("requeued message %q not flagged redelivered", d.Body)
		}
		must(t, d.Ack(false))
	}
	waitMessageCount(t, ch, q, 0)
	if cch.IsClosed() {
		t.Fatal("channel closed by the consumer timeout")
	}
}

func TestConsumerTimeoutLeaseExtension(t *testing.T) {
	skipUnlessWarren(t)
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, amqp.Table{"x-consumer-timeout": int32(1000)})
	publish(t, ch, "", q, "slow")
	// Confirm mode: a lease request is confirmed like any publish.
	cch := c.confirmCh(conn)
	cancels := cch.NotifyCancel(make(chan string, 1))
	ds, err := cch.Consume(q, "", false, false, false, false, nil)
	must(t, err)
	d := recv(t, ds)
	// Three times the timeout; each request asks for 2 s from now (the body, in ms).
	until := time.Now().Add(3 * time.Second)
	for time.Now().Before(until) {
		lease := amqp.Publishing{Body: []byte("2000")}
		if !pubConfirm(t, cch, "amq.warren.lease", strconv.FormatUint(d.DeliveryTag, 10), false, lease) {
			t.Fatal("lease extension nacked")
		}
		select {
		case tag := <-cancels:
			t.Fatalf("consumer %q cancelled although its lease was extended", tag)
		case <-time.After(300 * time.Millisecond):
		}
	}
	must(t, d.Ack(false))
	waitMessageCount(t, ch, q, 0)
	if got := inspect(t, ch, q); got.Consumers != 1 {
		t.Fatalf("%d consumers, want 1", got.Consumers)
	}
}
