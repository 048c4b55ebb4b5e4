package interop

import (
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestManyChannels(t *testing.T) {
	c := newTC(t)
	conn := c.conn()
	const n = 200
	chans := make([]*amqp.Channel, 0, n)
	for i := 0; i < n; i++ {
		chans = append(chans, c.ch(conn))
	}
	setup := c.ch(conn)
	q := c.queue(setup, nil)
	// every channel publishes one message
	for i, ch := range chans {
		publish(t, ch, "", q, fmt.Sprint(i))
	}
	waitMessageCount(t, setup, q, n)
	for i, ch := range chans {
		if err := ch.Close(); err != nil {
			t.Fatalf("close channel %d: %v", i, err)
		}
	}
	if n, err := setup.QueuePurge(q, false); err != nil || n != 200 {
		t.Fatalf("purge: %d, %v", n, err)
	}
}

func TestChannelCloseAndReopen(t *testing.T) {
	c := newTC(t)
	conn := c.conn()
	for i := 0; i < 50; i++ {
		ch := c.ch(conn)
		if err := ch.Close(); err != nil {
			t.Fatalf("iteration %d: close: %v", i, err)
		}
		if !ch.IsClosed() {
			t.Fatalf("iteration %d: channel not closed", i)
		}
		// double close is a no-op in the library
		if err := ch.Close(); err != nil {
			t.Fatalf("iteration %d: second close: %v", i, err)
		}
	}
	ch := c.ch(conn)
	q := c.queue(ch, nil)
	publish(t, ch, "", q, "after reopen")
	waitMessageCount(t, ch, q, 1)
	// operations on a closed channel fail locally with 504
	closed := c.ch(conn)
	closed.Close()
	_, err := closed.QueueDeclarePassive(q, false, false, false, false, nil)
	expectCode(t, err, amqp.ChannelError, "declare on closed channel")
}

func TestChannelFlowActiveTrue(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	// RabbitMQ answers channel.flow{active=true} with flow-ok{active=true}.
	if err := ch.Flow(true); err != nil {
		t.Fatalf("flow(true): %v", err)
	}
	q := c.queue(ch, nil)
	publish(t, ch, "", q, "x")
	waitMessageCount(t, ch, q, 1)
	if conn.IsClosed() {
		t.Fatal("connection closed")
	}
}

func TestChannelFlowActiveFalseIsNotImplemented(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	// RabbitMQ 3.10 does not implement client-initiated flow(active=false):
	// it closes the whole connection with 540 NOT_IMPLEMENTED "active=false".
	err := ch.Flow(false)
	e := expectCode(t, err, amqp.NotImplemented, "flow(false)")
	if e.Reason != "NOT_IMPLEMENTED - active=false" {
		t.Errorf("reason %q", e.Reason)
	}
	ce := waitErr(t, connClosed, "connection close after flow(false)")
	if ce.Code != amqp.NotImplemented || !ce.Server {
		t.Fatalf("connection close: %#v, want server 540", ce)
	}
}

func TestSoftErrorKeepsOtherChannels(t *testing.T) {
	c := newTC(t)
	conn := c.conn()
	good := c.ch(conn)
	bad := c.ch(conn)
	badClosed := bad.NotifyClose(make(chan *amqp.Error, 1))
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	q := c.queue(good, nil)

	missing := c.name("missing")
	_, err := bad.QueueDeclarePassive(missing, false, false, false, false, nil)
	e := expectCode(t, err, amqp.NotFound, "passive declare of missing queue")
	if want := fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", missing); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	ne := waitErr(t, badClosed, "channel close")
	if ne.Code != amqp.NotFound || !ne.Server {
		t.Fatalf("channel NotifyClose got %#v, want server 404", ne)
	}
	if !bad.IsClosed() {
		t.Fatal("channel with soft error is not closed")
	}
	// the connection and the other channel are unaffected
	publish(t, good, "", q, "after soft error")
	waitMessageCount(t, good, q, 1)
	fresh := c.ch(conn)
	if _, err := fresh.QueueDeclarePassive(q, false, false, false, false, nil); err != nil {
		t.Fatalf("new channel after soft error: %v", err)
	}
	select {
	case e := <-connClosed:
		t.Fatalf("connection closed after a soft error: %v", e)
	default:
	}
}

func TestHardErrorReusedConsumerTag(t *testing.T) {
	c := newTC(t)
	conn := c.conn()
	ch := c.ch(conn)
	other := c.ch(conn)
	otherClosed := other.NotifyClose(make(chan *amqp.Error, 1))
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	q := c.queue(ch, nil)
	tag := c.name("ctag")
	if _, err := ch.Consume(q, tag, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// Reusing a consumer tag on the same channel is a connection error in
	// RabbitMQ: 530 NOT_ALLOWED "attempt to reuse consumer tag '<tag>'".
	_, err := ch.Consume(q, tag, false, false, false, false, nil)
	e := expectCode(t, err, amqp.NotAllowed, "consume with reused tag")
	ce := waitErr(t, connClosed, "connection close")
	if ce.Code != amqp.NotAllowed || !ce.Server {
		t.Fatalf("connection NotifyClose: %#v, want server 530", ce)
	}
	if want := fmt.Sprintf("NOT_ALLOWED - attempt to reuse consumer tag '%s'", tag); ce.Reason != want {
		t.Errorf("reason %q, want %q", ce.Reason, want)
	}
	_ = e
	// every channel of the connection is gone
	oe := waitErr(t, otherClosed, "other channel close")
	if oe.Code != amqp.NotAllowed {
		t.Errorf("other channel got %#v", oe)
	}
	if !conn.IsClosed() {
		t.Fatal("connection still open after hard error")
	}
	if _, err := conn.Channel(); err == nil {
		t.Fatal("opened a channel on a connection closed by a hard error")
	}
}

func TestHardErrorDoesNotAffectOtherConnections(t *testing.T) {
	c := newTC(t)
	conn1, ch1 := c.connCh()
	_, ch2 := c.connCh()
	q := c.queue(ch2, nil)
	closed := conn1.NotifyClose(make(chan *amqp.Error, 1))
	err := ch1.Flow(false) // 540, see TestChannelFlowActiveFalseIsNotImplemented
	expectCode(t, err, amqp.NotImplemented, "flow(false)")
	waitErr(t, closed, "connection close")
	publish(t, ch2, "", q, "other connection still works")
	waitMessageCount(t, ch2, q, 1)
}

func TestAccessRefusedReservedNames(t *testing.T) {
	c := newTC(t)
	conn := c.conn()
	ch := c.ch(conn)
	// queue names starting with amq. are reserved: 403 ACCESS_REFUSED
	name := "amq." + c.name("q")
	_, err := ch.QueueDeclare(name, false, false, false, false, nil)
	e := expectCode(t, err, amqp.AccessRefused, "declare amq.* queue")
	if want := fmt.Sprintf("ACCESS_REFUSED - queue name '%s' contains reserved prefix 'amq.*'", name); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	ch = c.ch(conn)
	xname := "amq." + c.name("x")
	err = ch.ExchangeDeclare(xname, "direct", false, false, false, false, nil)
	e = expectCode(t, err, amqp.AccessRefused, "declare amq.* exchange")
	if want := fmt.Sprintf("ACCESS_REFUSED - exchange name '%s' contains reserved prefix 'amq.*'", xname); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	// deleting a built-in exchange is refused too
	ch = c.ch(conn)
	err = ch.ExchangeDelete("amq.direct", false, false)
	e = expectCode(t, err, amqp.AccessRefused, "delete amq.direct")
	if want := "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}
