package interop

// Through any node, the same guarantees (issue 32), in cluster mode only: the suite talks to
// node 2 and min-masters places the queues on node 1 or 3. A reply never comes before its
// effect on the queue's node; the Go client sends its next request right after a reply, so a
// reply sent early is seen. tests/interop/python/test_through_any_node.py has the rest.

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func throughAnyNode(t *testing.T) {
	t.Helper()
	if sessionCluster == nil {
		t.Skip("cluster mode only (WARREN_CLUSTER=1; tests/interop/cluster_mode.sh)")
	}
}

// fillQueue publishes n messages body-0..body-(n-1) with confirms.
func fillQueue(t *testing.T, c *tc, conn *amqp.Connection, q string, n int) {
	t.Helper()
	ch := c.confirmCh(conn)
	for i := 0; i < n; i++ {
		if !pubConfirm(t, ch, "", q, false, amqp.Publishing{Body: []byte(fmt.Sprintf("body-%d", i))}) {
			t.Fatalf("publish %d to %s nacked", i, q)
		}
	}
	if err := ch.Close(); err != nil {
		t.Fatalf("closing the publishing channel: %v", err)
	}
}

// getAll takes what a run of basic.get (auto-ack) finds: bodies and how many were redelivered.
func getAll(t *testing.T, ch *amqp.Channel, q string) (map[string]bool, int) {
	t.Helper()
	seen, redelivered := map[string]bool{}, 0
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatalf("basic.get: %v", err)
		}
		if !ok {
			return seen, redelivered
		}
		seen[string(d.Body)] = true
		if d.Redelivered {
			redelivered++
		}
	}
}

// (2) A channel whose consumer holds unacked deliveries closes; right after its close-ok, gets
// on another channel (opened before) find every message back, redelivered.
func TestThroughAnyNodeChannelCloseOkAfterTheRequeue(t *testing.T) {
	throughAnyNode(t)
	c := newTC(t)
	conn := c.conn()
	setup := c.ch(conn)
	q := c.queue(setup, nil)
	const n = 500
	fillQueue(t, c, conn, q, n)
	for round := 0; round < 5; round++ {
		other := c.ch(conn)
		ch := c.ch(conn)
		if err := ch.Qos(n, 0, false); err != nil {
			t.Fatal(err)
		}
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		recvN(t, ds, n)
		if err := ch.Close(); err != nil {
			t.Fatal(err)
		}
		seen, redelivered := getAll(t, other, q)
		if len(seen) != n || redelivered != n {
			t.Fatalf("round %d: right after close-ok, %d of %d messages back (%d redelivered)", round, len(seen), n, redelivered)
		}
		fillQueue(t, c, conn, q, n)
		_ = other.Close()
	}
}

// (1) Prefetch 1: consume, take one, cancel, ack. After the cancel-ok nothing more is delivered
// to the cancelled consumer; the other messages stay in the queue, never redelivered.
func TestThroughAnyNodeNoDeliveryAfterCancelOk(t *testing.T) {
	throughAnyNode(t)
	c := newTC(t)
	conn := c.conn()
	setup := c.ch(conn)
	q := c.queue(setup, nil)
	for round := 0; round < 5; round++ {
		fillQueue(t, c, conn, q, 3)
		ch := c.ch(conn)
		if err := ch.Qos(1, 0, false); err != nil {
			t.Fatal(err)
		}
		tag := fmt.Sprintf("ctag-%d", round)
		ds, err := ch.Consume(q, tag, false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		first := recv(t, ds)
		if err := ch.Cancel(tag, false); err != nil {
			t.Fatal(err)
		}
		if err := first.Ack(false); err != nil {
			t.Fatal(err)
		}
		// The library closes ds once the cancel-ok came: a delivery after it would be
		// held by the channel, unacked, and missing from the queue below.
		for d := range ds {
			t.Fatalf("round %d: delivered after cancel-ok: %q", round, d.Body)
		}
		time.Sleep(200 * time.Millisecond)
		seen, redelivered := getAll(t, c.ch(conn), q)
		if len(seen) != 2 || redelivered != 0 {
			t.Fatalf("round %d: %d of 2 messages left in the queue (%d redelivered)", round, len(seen), redelivered)
		}
		_ = ch.Close()
	}
}

// (3) The cancel-ok of an auto-delete queue's last consumer comes once the queue is deleted.
func TestThroughAnyNodeAutoDeleteGoneWithCancelOk(t *testing.T) {
	throughAnyNode(t)
	c := newTC(t)
	conn := c.conn()
	for round := 0; round < 5; round++ {
		q := c.name("ad")
		c.trackQueue(q)
		ch, probe := c.ch(conn), c.ch(conn)
		if _, err := ch.QueueDeclare(q, false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
		tag := fmt.Sprintf("ad-%d", round)
		if _, err := ch.Consume(q, tag, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.Cancel(tag, false); err != nil {
			t.Fatal(err)
		}
		_, err := probe.QueueDeclarePassive(q, false, true, false, false, nil)
		expectCode(t, err, 404, fmt.Sprintf("round %d: passive declare right after the last cancel-ok", round))
	}
}

// (5) A connection's exclusive queue is released with its connection.close-ok.
func TestThroughAnyNodeExclusiveReleasedWithCloseOk(t *testing.T) {
	throughAnyNode(t)
	c := newTC(t)
	next := c.ch(c.conn())
	for round := 0; round < 5; round++ {
		q := c.name("ex")
		first := c.conn()
		if _, err := c.ch(first).QueueDeclare(q, false, false, true, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := first.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := next.QueueDeclare(q, false, false, true, false, nil); err != nil {
			t.Fatalf("round %d: declaring the closed connection's exclusive queue: %v", round, err)
		}
		if _, err := next.QueueDelete(q, false, false, false); err != nil {
			t.Fatal(err)
		}
	}
}
