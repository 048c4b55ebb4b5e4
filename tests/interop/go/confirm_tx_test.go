package interop

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestConfirmsNotifyPublish(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, nil)
	pub := c.ch(conn)
	confirms := pub.NotifyPublish(make(chan amqp.Confirmation, 1000))
	must(t, pub.Confirm(false))
	const n = 500
	if got := pub.GetNextPublishSeqNo(); got != 1 {
		t.Fatalf("next publish seq %d, want 1", got)
	}
	for i := 0; i < n; i++ {
		publish(t, pub, "", q, strconv.Itoa(i))
	}
	if got := pub.GetNextPublishSeqNo(); got != n+1 {
		t.Fatalf("next publish seq %d, want %d", got, n+1)
	}
	for i := 1; i <= n; i++ {
		select {
		case cf, ok := <-confirms:
			if !ok {
				t.Fatalf("confirm listener closed at %d", i)
			}
			if !cf.Ack {
				t.Fatalf("publish %d nacked", i)
			}
			if cf.DeliveryTag != uint64(i) {
				t.Fatalf("confirm %d has delivery tag %d", i, cf.DeliveryTag)
			}
		case <-timeAfter():
			t.Fatalf("timed out waiting for confirm %d of %d", i, n)
		}
	}
	waitMessageCount(t, ch, q, n)
}

func TestConfirmsDeferred(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, nil)
	x := c.exchange(ch, "direct")
	pub := c.confirmCh(conn)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var dcs []*amqp.DeferredConfirmation
	for i := 0; i < 50; i++ {
		ex, key := "", q
		if i%5 == 4 {
			ex, key = x, "unroutable" // unroutable messages are acked too
		}
		dc, err := pub.PublishWithDeferredConfirmWithContext(ctx, ex, key, false, false, amqp.Publishing{Body: []byte(strconv.Itoa(i))})
		must(t, err)
		if dc.DeliveryTag != uint64(i+1) {
			t.Fatalf("deferred confirm %d has tag %d", i, dc.DeliveryTag)
		}
		dcs = append(dcs, dc)
	}
	for i, dc := range dcs {
		ack, err := dc.WaitContext(ctx)
		if err != nil {
			t.Fatalf("confirm %d: %v", i, err)
		}
		if !ack {
			t.Fatalf("publish %d nacked", i)
		}
	}
	waitMessageCount(t, ch, q, 40)
}

func TestConfirmSelectTwice(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, nil)
	// Note: amqp091-go's Confirm(noWait=true) waits for a select-ok that a
	// conforming broker never sends, so only the waiting form is used here.
	pub := c.confirmCh(conn)
	for i := 0; i < 5; i++ {
		if !pubConfirm(t, pub, "", q, false, amqp.Publishing{Body: []byte("x")}) {
			t.Fatal("nacked")
		}
	}
	// confirm.select again on a confirm channel is fine
	must(t, pub.Confirm(false))
	if !pubConfirm(t, pub, "", q, false, amqp.Publishing{Body: []byte("y")}) {
		t.Fatal("nacked")
	}
}

func TestConfirmsNackRejectPublish(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	pub := c.confirmCh(conn)
	if !pubConfirm(t, pub, "", q, false, amqp.Publishing{Body: []byte("first")}) {
		t.Fatal("first publish nacked")
	}
	if pubConfirm(t, pub, "", q, false, amqp.Publishing{Body: []byte("second")}) {
		t.Fatal("publish to a full reject-publish queue was acked, want nack")
	}
	if pubConfirm(t, pub, "", q, false, amqp.Publishing{Body: []byte("third")}) {
		t.Fatal("third publish acked, want nack")
	}
	// after making room, publishing is accepted again
	if got := drainBodies(t, ch, q); len(got) != 1 || got[0] != "first" {
		t.Fatalf("queue held %q", got)
	}
	if !pubConfirm(t, pub, "", q, false, amqp.Publishing{Body: []byte("fourth")}) {
		t.Fatal("publish after drain nacked")
	}
	// a nacked message is not enqueued, and the channel stays open
	if pub.IsClosed() {
		t.Fatal("channel closed after nack")
	}
	waitMessageCount(t, ch, q, 1)

	// without confirms, reject-publish silently drops
	plain := c.ch(conn)
	publish(t, plain, "", q, "dropped")
	if pubConfirm(t, pub, "", q, false, amqp.Publishing{Body: []byte("after")}) {
		t.Fatal("publish to a full queue acked") // still full ("fourth")
	}
	if got := drainBodies(t, ch, q); len(got) != 1 || got[0] != "fourth" {
		t.Fatalf("queue held %q", got)
	}
}

func TestConfirmAndTxAreExclusive(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	must(t, ch.Tx())
	err := ch.Confirm(false)
	e := expectCode(t, err, amqp.PreconditionFailed, "confirm.select on a tx channel")
	if want := "PRECONDITION_FAILED - cannot switch from tx to confirm mode"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	ch = c.confirmCh(conn)
	err = ch.Tx()
	e = expectCode(t, err, amqp.PreconditionFailed, "tx.select on a confirm channel")
	if want := "PRECONDITION_FAILED - cannot switch from confirm to tx mode"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}

func TestTxPublishCommitRollback(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, nil)
	tx := c.ch(conn)
	must(t, tx.Tx())
	must(t, tx.Tx()) // selecting twice is fine
	for i := 0; i < 3; i++ {
		publish(t, tx, "", q, strconv.Itoa(i))
	}
	// uncommitted publishes are invisible
	if st := inspect(t, ch, q); st.Messages != 0 {
		t.Fatalf("uncommitted publishes visible: %d", st.Messages)
	}
	must(t, tx.TxCommit())
	if st := inspect(t, ch, q); st.Messages != 3 {
		t.Fatalf("after commit %d messages, want 3", st.Messages)
	}
	publish(t, tx, "", q, "rolled-back-1")
	publish(t, tx, "", q, "rolled-back-2")
	must(t, tx.TxRollback())
	if st := inspect(t, ch, q); st.Messages != 3 {
		t.Fatalf("after rollback %d messages, want 3", st.Messages)
	}
	// the channel stays transactional: a new tx starts right away
	publish(t, tx, "", q, "3")
	must(t, tx.TxCommit())
	if got := drainBodies(t, ch, q); len(got) != 4 || got[3] != "3" {
		t.Fatalf("queue %q", got)
	}
	// an empty commit/rollback is fine
	must(t, tx.TxCommit())
	must(t, tx.TxRollback())
}

func TestTxAcks(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, nil)
	pub := c.confirmCh(conn)
	fill(t, pub, q, 4)
	tx := c.ch(conn)
	must(t, tx.Tx())
	var ds []amqp.Delivery
	for i := 0; i < 3; i++ {
		d, ok, err := tx.Get(q, false)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		ds = append(ds, d)
	}
	must(t, ds[0].Ack(false))
	must(t, ds[1].Reject(true)) // requeue inside the tx
	must(t, tx.TxRollback())
	// rolled-back acks/rejects leave the messages unacked (not requeued)
	if st := inspect(t, ch, q); st.Messages != 1 {
		t.Fatalf("after rollback %d ready, want 1", st.Messages)
	}
	// ack 0 and 1 (multiple) and nack-requeue 2, then commit
	must(t, ds[1].Ack(true))
	must(t, ds[2].Nack(false, true))
	if st := inspect(t, ch, q); st.Messages != 1 {
		t.Fatalf("uncommitted ack/nack took effect: %d ready", st.Messages)
	}
	must(t, tx.TxCommit())
	waitMessageCount(t, ch, q, 2)
	// closing the channel has nothing left to requeue
	must(t, tx.Close())
	waitMessageCount(t, ch, q, 2)
	got := drainBodies(t, ch, q)
	if len(got) != 2 || got[0] != "2" || got[1] != "3" {
		t.Fatalf("left %q, want [2 3]", got)
	}
}

func TestTxCommitWithoutSelect(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	err := ch.TxCommit()
	e := expectCode(t, err, amqp.PreconditionFailed, "tx.commit without tx.select")
	if want := "PRECONDITION_FAILED - channel is not transactional"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	if !ch.IsClosed() || conn.IsClosed() {
		t.Fatal("406 must close only the channel")
	}
	ch = c.ch(conn)
	err = ch.TxRollback()
	e = expectCode(t, err, amqp.PreconditionFailed, "tx.rollback without tx.select")
	if want := "PRECONDITION_FAILED - channel is not transactional"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}

// A confirm channel closed with publishes still unconfirmed: its close-ok ends it, so no
// basic.ack follows (amqp091-go closes the connection on a method for a closed channel, 504),
// nor reaches the next channel given the same number. Persistent messages to a durable queue
// are confirmed after an fsync, and through a cluster node by the queue's node: both later
// than the close.
func TestNoConfirmAfterChannelCloseOk(t *testing.T) {
	c := newTC(t)
	conn := c.conn()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	setup := c.ch(conn)
	q := c.name("q")
	c.trackQueue(q)
	if _, err := setup.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 5; round++ {
		ch := c.confirmCh(conn)
		for i := 0; i < 500; i++ {
			publishMsg(t, ch, "", q, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(fmt.Sprintf("m-%d", i))})
		}
		if err := ch.Close(); err != nil {
			t.Fatalf("round %d: channel.close: %v", round, err)
		}
		// The next channel (same number) works, and the connection stays open.
		next := c.ch(conn)
		if _, err := next.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
			t.Fatalf("round %d: on the next channel: %v", round, err)
		}
		_ = next.Close()
		select {
		case e := <-closed:
			t.Fatalf("round %d: connection closed: %v", round, e)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
