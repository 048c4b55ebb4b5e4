package interop

import (
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestExchangeDeclareEachType(t *testing.T) {
	c := newTC(t)
	_, ch := c.connCh()
	for _, kind := range []string{"direct", "fanout", "topic", "headers"} {
		for _, durable := range []bool{false, true} {
			name := c.name("x-" + kind)
			c.trackExchange(name)
			if err := ch.ExchangeDeclare(name, kind, durable, false, false, false, nil); err != nil {
				t.Fatalf("declare %s durable=%v: %v", kind, durable, err)
			}
			// identical redeclare is fine
			if err := ch.ExchangeDeclare(name, kind, durable, false, false, false, nil); err != nil {
				t.Fatalf("redeclare %s: %v", kind, err)
			}
			// passive declare of an existing exchange is fine, whatever the flags
			if err := ch.ExchangeDeclarePassive(name, "", false, false, false, false, nil); err != nil {
				t.Fatalf("passive %s: %v", kind, err)
			}
			if err := ch.ExchangeDelete(name, false, false); err != nil {
				t.Fatalf("delete %s: %v", kind, err)
			}
		}
	}
	// noWait declare works and is visible afterwards
	name := c.name("x-nowait")
	c.trackExchange(name)
	if err := ch.ExchangeDeclare(name, "topic", false, false, false, true, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclarePassive(name, "topic", false, false, false, false, nil); err != nil {
		t.Fatalf("passive after nowait declare: %v", err)
	}
}

func TestExchangeBuiltinsExist(t *testing.T) {
	c := newTC(t)
	_, ch := c.connCh()
	for _, x := range []string{"amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"} {
		if err := ch.ExchangeDeclarePassive(x, "", false, false, false, false, nil); err != nil {
			t.Fatalf("passive %s: %v", x, err)
		}
	}
	// redeclaring a built-in with its own properties is allowed
	if err := ch.ExchangeDeclare("amq.direct", "direct", true, false, false, false, nil); err != nil {
		t.Fatalf("redeclare amq.direct: %v", err)
	}
}

func TestExchangePassiveMissing(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	name := c.name("missing")
	err := ch.ExchangeDeclarePassive(name, "direct", false, false, false, false, nil)
	e := expectCode(t, err, amqp.NotFound, "passive declare of missing exchange")
	if want := fmt.Sprintf("NOT_FOUND - no exchange '%s' in vhost '/'", name); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	ne := waitErr(t, closed, "channel close")
	if ne.Code != 404 || !ne.Server {
		t.Fatalf("NotifyClose %#v", ne)
	}
	if !ch.IsClosed() {
		t.Fatal("channel still open")
	}
	if conn.IsClosed() {
		t.Fatal("connection closed by a soft error")
	}
}

func TestExchangeRedeclareMismatch(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	name := c.exchange(ch, "direct")

	err := ch.ExchangeDeclare(name, "fanout", false, false, false, false, nil)
	e := expectCode(t, err, amqp.PreconditionFailed, "redeclare with another type")
	if want := fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg 'type' for exchange '%s' in vhost '/': received 'fanout' but current is 'direct'", name); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}

	ch = c.ch(conn)
	err = ch.ExchangeDeclare(name, "direct", true, false, false, false, nil)
	e = expectCode(t, err, amqp.PreconditionFailed, "redeclare with other durability")
	if want := fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg 'durable' for exchange '%s' in vhost '/': received 'true' but current is 'false'", name); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}

	ch = c.ch(conn)
	err = ch.ExchangeDeclare(name, "direct", false, true, false, false, nil)
	e = expectCode(t, err, amqp.PreconditionFailed, "redeclare with other auto-delete")
	if want := fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg 'auto_delete' for exchange '%s' in vhost '/': received 'true' but current is 'false'", name); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	if conn.IsClosed() {
		t.Fatal("connection closed by a soft error")
	}
}

func TestExchangeDeclareUnknownType(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	name := c.name("x-badtype")
	c.trackExchange(name)
	err := ch.ExchangeDeclare(name, "no-such-type", false, false, false, false, nil)
	// RabbitMQ treats an unknown exchange type as a connection error:
	// 503 COMMAND_INVALID "unknown exchange type 'no-such-type'".
	e := expectCode(t, err, amqp.CommandInvalid, "declare unknown exchange type")
	if want := "COMMAND_INVALID - unknown exchange type 'no-such-type'"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	ce := waitErr(t, connClosed, "connection close")
	if ce.Code != amqp.CommandInvalid {
		t.Fatalf("connection close %#v", ce)
	}
}

func TestExchangeToExchangeBinding(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	src := c.exchange(ch, "topic")
	dst := c.exchange(ch, "fanout")
	q := c.queue(ch, nil)
	if err := ch.QueueBind(q, "", dst, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeBind(dst, "a.*", src, false, nil); err != nil {
		t.Fatalf("exchange.bind: %v", err)
	}
	routed(t, pub, src, "a.one", nil)
	routed(t, pub, src, "b.two", nil) // does not match a.*
	routed(t, pub, src, "a.three", nil)
	if got := drainBodies(t, ch, q); fmt.Sprint(got) != "[a.one a.three]" {
		t.Fatalf("via e2e binding got %v", got)
	}
	if err := ch.ExchangeUnbind(dst, "a.*", src, false, nil); err != nil {
		t.Fatalf("exchange.unbind: %v", err)
	}
	routed(t, pub, src, "a.four", nil)
	if st := inspect(t, ch, q); st.Messages != 0 {
		t.Fatalf("message routed after exchange.unbind: %d", st.Messages)
	}
	// unbinding a binding that does not exist is not an error in RabbitMQ
	if err := ch.ExchangeUnbind(dst, "a.*", src, false, nil); err != nil {
		t.Fatalf("second exchange.unbind: %v", err)
	}
	// binding from a missing source is 404
	missing := c.name("missing")
	err := ch.ExchangeBind(dst, "k", missing, false, nil)
	e := expectCode(t, err, amqp.NotFound, "bind from missing exchange")
	if want := fmt.Sprintf("NOT_FOUND - no exchange '%s' in vhost '/'", missing); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}

func TestExchangeToExchangeChainAndLoop(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	x1 := c.exchange(ch, "direct")
	x2 := c.exchange(ch, "direct")
	x3 := c.exchange(ch, "fanout")
	q := c.queue(ch, nil)
	must(t, ch.ExchangeBind(x2, "k", x1, false, nil))
	must(t, ch.ExchangeBind(x3, "k", x2, false, nil))
	must(t, ch.ExchangeBind(x1, "k", x3, false, nil)) // a cycle: must not loop forever
	must(t, ch.QueueBind(q, "", x3, false, nil))
	// also bind the queue directly to x1, so it is reachable twice:
	must(t, ch.QueueBind(q, "k", x1, false, nil))
	routed(t, pub, x1, "k", nil)
	// a queue receives at most one copy of a message, however many routes
	if got := drainBodies(t, ch, q); len(got) != 1 {
		t.Fatalf("got %d copies, want 1: %v", len(got), got)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestExchangeDeleteIfUnused(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	x := c.exchange(ch, "direct")
	q := c.queue(ch, nil)
	must(t, ch.QueueBind(q, "k", x, false, nil))
	err := ch.ExchangeDelete(x, true, false)
	e := expectCode(t, err, amqp.PreconditionFailed, "delete if-unused of a bound exchange")
	if want := fmt.Sprintf("PRECONDITION_FAILED - exchange '%s' in vhost '/' in use", x); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	ch = c.ch(conn)
	if err := ch.ExchangeDeclarePassive(x, "direct", false, false, false, false, nil); err != nil {
		t.Fatalf("exchange gone after refused delete: %v", err)
	}
	// A source of an exchange-to-exchange binding is "in use" as well.
	x2 := c.exchange(ch, "fanout")
	must(t, ch.ExchangeBind(x2, "", x, false, nil))
	must(t, ch.QueueUnbind(q, "k", x, nil))
	err = ch.ExchangeDelete(x, true, false)
	expectCode(t, err, amqp.PreconditionFailed, "delete if-unused of an e2e source")
	ch = c.ch(conn)
	must(t, ch.ExchangeUnbind(x2, "", x, false, nil))
	if err := ch.ExchangeDelete(x, true, false); err != nil {
		t.Fatalf("delete if-unused of unbound exchange: %v", err)
	}
	err = ch.ExchangeDeclarePassive(x, "direct", false, false, false, false, nil)
	expectCode(t, err, amqp.NotFound, "passive after delete")
	// plain delete of a bound exchange removes its bindings too
	ch = c.ch(conn)
	x3 := c.exchange(ch, "direct")
	must(t, ch.QueueBind(q, "k", x3, false, nil))
	must(t, ch.ExchangeDelete(x3, false, false))
	if st := inspect(t, ch, q); st.Messages != 0 {
		t.Fatal("unexpected messages")
	}
}

func TestExchangeDeleteMissingIsOK(t *testing.T) {
	c := newTC(t)
	_, ch := c.connCh()
	// RabbitMQ 3.10 answers exchange.delete of a missing exchange with delete-ok.
	if err := ch.ExchangeDelete(c.name("missing"), false, false); err != nil {
		t.Fatalf("delete missing exchange: %v", err)
	}
	if err := ch.ExchangeDelete(c.name("missing"), true, false); err != nil {
		t.Fatalf("delete if-unused missing exchange: %v", err)
	}
}

func TestExchangeInternal(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	internal := c.name("x-internal")
	c.trackExchange(internal)
	must(t, ch.ExchangeDeclare(internal, "fanout", false, false, true, false, nil))
	front := c.exchange(ch, "direct")
	q := c.queue(ch, nil)
	must(t, ch.QueueBind(q, "", internal, false, nil))
	must(t, ch.ExchangeBind(internal, "k", front, false, nil))
	// reachable through an e2e binding
	routed(t, pub, front, "k", nil)
	waitMessageCount(t, ch, q, 1)

	// but publishing to it directly is refused: 403 and the channel closes
	closed := pub.NotifyClose(make(chan *amqp.Error, 1))
	publish(t, pub, internal, "", "direct to internal")
	e := waitErr(t, closed, "publish to internal exchange")
	if e.Code != amqp.AccessRefused || !e.Server {
		t.Fatalf("close %#v, want server 403", e)
	}
	if want := fmt.Sprintf("ACCESS_REFUSED - cannot publish to internal exchange '%s' in vhost '/'", internal); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	if conn.IsClosed() {
		t.Fatal("connection closed by a soft error")
	}
	waitMessageCount(t, ch, q, 1)
}

func TestPublishToMissingExchange(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	missing := c.name("missing")
	publish(t, ch, missing, "k", "lost")
	e := waitErr(t, closed, "publish to missing exchange")
	if e.Code != amqp.NotFound {
		t.Fatalf("close %#v, want 404", e)
	}
	if want := fmt.Sprintf("NOT_FOUND - no exchange '%s' in vhost '/'", missing); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	if conn.IsClosed() {
		t.Fatal("connection closed by a soft error")
	}
}

func TestDefaultExchange(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	routed(t, pub, "", q, nil)
	waitMessageCount(t, ch, q, 1)
	// RabbitMQ refuses any declare (even passive) of the default exchange
	// by its empty name: 403 "operation not permitted on the default exchange".
	err := ch.ExchangeDeclarePassive("", "direct", false, false, false, false, nil)
	e := expectCode(t, err, amqp.AccessRefused, "passive declare of default exchange")
	if want := "ACCESS_REFUSED - operation not permitted on the default exchange"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	// binding to the default exchange is refused the same way
	ch = c.ch(conn)
	err = ch.QueueBind(q, "other", "", false, nil)
	e = expectCode(t, err, amqp.AccessRefused, "bind to default exchange")
	if want := "ACCESS_REFUSED - operation not permitted on the default exchange"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	// and so is deleting it
	ch = c.ch(conn)
	err = ch.ExchangeDelete("", false, false)
	e = expectCode(t, err, amqp.AccessRefused, "delete default exchange")
	if want := "ACCESS_REFUSED - operation not permitted on the default exchange"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}

func TestExchangeAutoDelete(t *testing.T) {
	c := newTC(t)
	_, ch := c.connCh()
	x := c.name("x-autodel")
	c.trackExchange(x)
	must(t, ch.ExchangeDeclare(x, "direct", false, true, false, false, nil))
	// without bindings it just stays
	if err := ch.ExchangeDeclarePassive(x, "direct", false, true, false, false, nil); err != nil {
		t.Fatalf("auto-delete exchange vanished before any binding: %v", err)
	}
	q1 := c.queue(ch, nil)
	q2 := c.queue(ch, nil)
	must(t, ch.QueueBind(q1, "a", x, false, nil))
	must(t, ch.QueueBind(q2, "b", x, false, nil))
	must(t, ch.QueueUnbind(q1, "a", x, nil))
	if err := ch.ExchangeDeclarePassive(x, "direct", false, true, false, false, nil); err != nil {
		t.Fatalf("auto-delete exchange deleted while still bound: %v", err)
	}
	must(t, ch.QueueUnbind(q2, "b", x, nil))
	err := ch.ExchangeDeclarePassive(x, "direct", false, true, false, false, nil)
	expectCode(t, err, amqp.NotFound, "auto-delete exchange after last unbind")
}

func TestAlternateExchange(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	ae := c.exchange(ch, "fanout")
	x := c.name("x-with-ae")
	c.trackExchange(x)
	must(t, ch.ExchangeDeclare(x, "direct", false, false, false, false, amqp.Table{"alternate-exchange": ae}))
	main := c.queue(ch, nil)
	unrouted := c.queue(ch, nil)
	must(t, ch.QueueBind(main, "k", x, false, nil))
	must(t, ch.QueueBind(unrouted, "", ae, false, nil))
	returns := pub.NotifyReturn(make(chan amqp.Return, 4))
	routed(t, pub, x, "k", nil)
	// mandatory + routed via the AE: not returned
	if !pubConfirm(t, pub, x, "nope", true, amqp.Publishing{Body: []byte("nope")}) {
		t.Fatal("nacked")
	}
	if got := drainBodies(t, ch, main); fmt.Sprint(got) != "[k]" {
		t.Fatalf("main queue %v", got)
	}
	if got := drainBodies(t, ch, unrouted); fmt.Sprint(got) != "[nope]" {
		t.Fatalf("alternate queue %v", got)
	}
	select {
	case r := <-returns:
		t.Fatalf("message routed via alternate exchange was returned: %+v", r)
	default:
	}
}
