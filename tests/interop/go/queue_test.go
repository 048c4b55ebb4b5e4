package interop

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestQueueDeclareServerNamed(t *testing.T) {
	c := newTC(t)
	_, ch := c.connCh()
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.trackQueue(q.Name)
		if !strings.HasPrefix(q.Name, "amq.gen-") {
			t.Fatalf("server-named queue %q lacks amq.gen- prefix", q.Name)
		}
		if q.Messages != 0 || q.Consumers != 0 {
			t.Fatalf("fresh queue counts %+v", q)
		}
		if seen[q.Name] {
			t.Fatalf("duplicate server-generated name %q", q.Name)
		}
		seen[q.Name] = true
		// usable through the default exchange
		publish(t, ch, "", q.Name, "hi")
		waitMessageCount(t, ch, q.Name, 1)
	}
}

func TestQueueDeclareOkCounts(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	for i := 0; i < 5; i++ {
		routed(t, pub, "", q, nil)
	}
	cch := c.ch(conn)
	if _, err := cch.Consume(q, "", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	cch2 := c.ch(conn)
	if err := cch2.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := cch2.Consume(q, "", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// all 5 are delivered (unacked) so none are ready; 2 consumers
	eventually(t, "5 delivered", func() bool {
		st, err := ch.QueueInspect(q)
		return err == nil && st.Messages == 0 && st.Consumers == 2
	})
	st, err := ch.QueueInspect(q)
	if err != nil {
		t.Fatal(err)
	}
	if st.Name != q || st.Consumers != 2 || st.Messages != 0 {
		t.Fatalf("inspect %+v", st)
	}
	// redeclare (non-passive) returns the same counts
	st2, err := ch.QueueDeclare(q, false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Consumers != 2 || st2.Messages != 0 {
		t.Fatalf("redeclare %+v", st2)
	}
	// closing the consumer channels requeues everything
	must(t, cch.Close())
	must(t, cch2.Close())
	waitMessageCount(t, ch, q, 5)
	if st := inspect(t, ch, q); st.Consumers != 0 {
		t.Fatalf("consumers %d after channel close", st.Consumers)
	}
}

func TestQueuePassive(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, nil)
	publish(t, ch, "", q, "1")
	publish(t, ch, "", q, "2")
	waitMessageCount(t, ch, q, 2)
	// passive ignores the other flags
	st, err := ch.QueueDeclarePassive(q, true, true, true, false, nil)
	if err != nil {
		t.Fatalf("passive with mismatching flags: %v", err)
	}
	if st.Messages != 2 {
		t.Fatalf("messages %d", st.Messages)
	}
	missing := c.name("missing")
	_, err = ch.QueueDeclarePassive(missing, false, false, false, false, nil)
	e := expectCode(t, err, amqp.NotFound, "passive of missing queue")
	if want := fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", missing); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	if !ch.IsClosed() || conn.IsClosed() {
		t.Fatal("404 must close the channel only")
	}
}

func TestQueueDurable(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.name("durable")
	c.trackQueue(q)
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	publishMsg(t, ch, "", q, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("p")})
	waitMessageCount(t, ch, q, 1)
	_, err := ch.QueueDeclare(q, false, false, false, false, nil)
	e := expectCode(t, err, amqp.PreconditionFailed, "redeclare durable as transient")
	if want := fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg 'durable' for queue '%s' in vhost '/': received 'false' but current is 'true'", q); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	ch = c.ch(conn)
	_, err = ch.QueueDeclare(q, true, true, false, false, nil)
	e = expectCode(t, err, amqp.PreconditionFailed, "redeclare with auto-delete")
	if want := fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue '%s' in vhost '/': received 'true' but current is 'false'", q); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	ch = c.ch(conn)
	d, ok, err := ch.Get(q, true)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	if d.DeliveryMode != amqp.Persistent {
		t.Fatalf("delivery mode %d", d.DeliveryMode)
	}
}

func TestQueueArgumentMismatch(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, amqp.Table{"x-message-ttl": int32(60000)})
	// same args: fine
	if _, err := ch.QueueDeclare(q, false, false, false, false, amqp.Table{"x-message-ttl": int32(60000)}); err != nil {
		t.Fatal(err)
	}
	_, err := ch.QueueDeclare(q, false, false, false, false, amqp.Table{"x-message-ttl": int32(1000)})
	e := expectCode(t, err, amqp.PreconditionFailed, "redeclare with other ttl")
	if want := fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '%s' in vhost '/': received '1000' but current is '60000'", q); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	ch = c.ch(conn)
	bad := c.name("badarg")
	c.trackQueue(bad)
	_, err = ch.QueueDeclare(bad, false, false, false, false, amqp.Table{"x-max-length": "ten"})
	e = expectCode(t, err, amqp.PreconditionFailed, "declare with a string x-max-length")
	if want := fmt.Sprintf("PRECONDITION_FAILED - invalid arg 'x-max-length' for queue '%s' in vhost '/': \"expected integer, got longstr\"", bad); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}

func TestQueueExclusive(t *testing.T) {
	c := newTC(t)
	owner, ch := c.connCh()
	q := c.name("excl")
	c.trackQueue(q)
	if _, err := ch.QueueDeclare(q, false, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
	// the owner can use it freely
	publish(t, ch, "", q, "mine")
	waitMessageCount(t, ch, q, 1)

	other := c.conn()
	wantText := fmt.Sprintf("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '%s' in vhost '/'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.", q)
	och := c.ch(other)
	_, err := och.QueueDeclare(q, false, false, true, false, nil)
	e := expectCode(t, err, amqp.ResourceLocked, "declare exclusive queue from another connection")
	if e.Reason != wantText {
		t.Errorf("reason %q, want %q", e.Reason, wantText)
	}
	och = c.ch(other)
	_, err = och.QueueDeclarePassive(q, false, false, true, false, nil)
	expectCode(t, err, amqp.ResourceLocked, "passive declare of exclusive queue from another connection")
	och = c.ch(other)
	_, err = och.Consume(q, "", false, false, false, false, nil)
	expectCode(t, err, amqp.ResourceLocked, "consume exclusive queue from another connection")
	och = c.ch(other)
	_, _, err = och.Get(q, false)
	expectCode(t, err, amqp.ResourceLocked, "get from exclusive queue from another connection")
	och = c.ch(other)
	_, err = och.QueueDelete(q, false, false, false)
	expectCode(t, err, amqp.ResourceLocked, "delete exclusive queue from another connection")
	och = c.ch(other)
	_, err = och.QueuePurge(q, false)
	expectCode(t, err, amqp.ResourceLocked, "purge exclusive queue from another connection")
	// publishing to it from another connection is allowed
	och = c.ch(other)
	publish(t, och, "", q, "theirs")
	waitMessageCount(t, ch, q, 2)

	// the exclusive queue goes away with its connection
	must(t, owner.Close())
	och = c.ch(other)
	eventually(t, "exclusive queue deleted with its connection", func() bool {
		_, err := och.QueueDeclarePassive(q, false, false, false, false, nil)
		if err != nil {
			och = c.ch(other)
			return amqpErr(err) != nil && amqpErr(err).Code == amqp.NotFound
		}
		return false
	})
}

func TestQueueAutoDelete(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.name("autodel")
	c.trackQueue(q)
	if _, err := ch.QueueDeclare(q, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// without any consumer ever, an auto-delete queue stays
	publish(t, ch, "", q, "x")
	waitMessageCount(t, ch, q, 1)
	cch := c.ch(conn)
	_, err := cch.Consume(q, "c1", false, false, false, false, nil)
	must(t, err)
	_, err = cch.Consume(q, "c2", false, false, false, false, nil)
	must(t, err)
	must(t, cch.Cancel("c1", false))
	if st := inspect(t, ch, q); st.Consumers != 1 {
		t.Fatalf("consumers %d after first cancel", st.Consumers)
	}
	must(t, cch.Cancel("c2", false))
	// the last consumer is gone: the queue is deleted
	eventually(t, "auto-delete queue deleted after last cancel", func() bool {
		_, err := ch.QueueDeclarePassive(q, false, true, false, false, nil)
		if err != nil {
			ch = c.ch(conn)
			return amqpErr(err) != nil && amqpErr(err).Code == amqp.NotFound
		}
		return false
	})
	// also when the consumer's channel closes
	q2 := c.name("autodel2")
	c.trackQueue(q2)
	_, err = ch.QueueDeclare(q2, false, true, false, false, nil)
	must(t, err)
	cch = c.ch(conn)
	_, err = cch.Consume(q2, "", true, false, false, false, nil)
	must(t, err)
	must(t, cch.Close())
	eventually(t, "auto-delete queue deleted after consumer channel close", func() bool {
		_, err := ch.QueueDeclarePassive(q2, false, true, false, false, nil)
		if err != nil {
			ch = c.ch(conn)
			return amqpErr(err) != nil && amqpErr(err).Code == amqp.NotFound
		}
		return false
	})
}

// bindingCase publishes each key (with headers) and returns the bodies that
// arrived in q, sorted.
func routeAll(t *testing.T, pub, ch *amqp.Channel, x, q string, msgs []struct {
	key     string
	headers amqp.Table
}) []string {
	t.Helper()
	for _, m := range msgs {
		routed(t, pub, x, m.key, m.headers)
	}
	got := drainBodies(t, ch, q)
	sort.Strings(got)
	return got
}

type keyed = struct {
	key     string
	headers amqp.Table
}

func TestBindDirect(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	x := c.exchange(ch, "direct")
	q := c.queue(ch, nil)
	must(t, ch.QueueBind(q, "red", x, false, nil))
	must(t, ch.QueueBind(q, "green", x, false, nil))
	must(t, ch.QueueBind(q, "green", x, false, nil)) // duplicate bind is idempotent
	got := routeAll(t, pub, ch, x, q, []keyed{{"red", nil}, {"green", nil}, {"blue", nil}, {"Red", nil}})
	if fmt.Sprint(got) != "[green red]" {
		t.Fatalf("direct routing got %v", got)
	}
	must(t, ch.QueueUnbind(q, "red", x, nil))
	got = routeAll(t, pub, ch, x, q, []keyed{{"red", nil}, {"green", nil}})
	if fmt.Sprint(got) != "[green]" {
		t.Fatalf("after unbind got %v", got)
	}
	// unbinding something that is not bound is fine
	must(t, ch.QueueUnbind(q, "never-bound", x, nil))
	// binding a missing queue / to a missing exchange: 404
	missing := c.name("missing")
	err := ch.QueueBind(missing, "k", x, false, nil)
	e := expectCode(t, err, amqp.NotFound, "bind missing queue")
	if want := fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", missing); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	ch = c.ch(conn)
	err = ch.QueueBind(q, "k", missing, false, nil)
	e = expectCode(t, err, amqp.NotFound, "bind to missing exchange")
	if want := fmt.Sprintf("NOT_FOUND - no exchange '%s' in vhost '/'", missing); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}

func TestBindTopic(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	x := c.exchange(ch, "topic")
	cases := []struct {
		pattern string
		match   []string
	}{
		{"a.*.c", []string{"a.b.c", "a..c"}},
		{"a.#", []string{"a", "a.b", "a.b.c", "a.b.c.d", "a.c", "a..c"}},
		{"#.c", []string{"c", "a.c", "a.b.c", "a..c", "b.a.c"}},
		// RabbitMQ: the empty routing key has zero words, so "*" does not match
		// it (but "#" does); "a..c" has an empty middle word that "*" matches.
		{"*", []string{"a", "c"}},
		{"#", []string{"a", "a.b", "a.b.c", "a.b.c.d", "c", "a.c", "a..c", "", "x.y", "b.a.c"}},
		{"a.#.c", []string{"a.c", "a.b.c", "a..c"}},
		{"*.a.#", []string{"b.a.c"}},
		{"x.y", []string{"x.y"}},
	}
	keys := []string{"a", "a.b", "a.b.c", "a.b.c.d", "c", "a.c", "a..c", "", "x.y", "b.a.c"}
	for _, tc := range cases {
		q := c.queue(ch, nil)
		must(t, ch.QueueBind(q, tc.pattern, x, false, nil))
		var msgs []keyed
		for _, k := range keys {
			msgs = append(msgs, keyed{k, nil})
		}
		got := routeAll(t, pub, ch, x, q, msgs)
		want := append([]string(nil), tc.match...)
		sort.Strings(want)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("pattern %q: matched %q, want %q", tc.pattern, got, want)
		}
		must(t, ch.QueueUnbind(q, tc.pattern, x, nil))
	}
}

func TestBindFanout(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	x := c.exchange(ch, "fanout")
	qs := []string{c.queue(ch, nil), c.queue(ch, nil), c.queue(ch, nil)}
	for i, q := range qs {
		must(t, ch.QueueBind(q, fmt.Sprint("ignored-", i), x, false, nil))
	}
	routed(t, pub, x, "anything", nil)
	routed(t, pub, x, "", nil)
	for _, q := range qs {
		if got := drainBodies(t, ch, q); fmt.Sprint(got) != "[anything ]" {
			t.Fatalf("queue %s got %q", q, got)
		}
	}
	must(t, ch.QueueUnbind(qs[0], "ignored-0", x, nil))
	routed(t, pub, x, "again", nil)
	if got := drainBodies(t, ch, qs[0]); len(got) != 0 {
		t.Fatalf("unbound queue got %q", got)
	}
	if got := drainBodies(t, ch, qs[1]); fmt.Sprint(got) != "[again]" {
		t.Fatalf("queue got %q", got)
	}
}

func TestBindHeaders(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	x := c.exchange(ch, "headers")
	all := c.queue(ch, nil)
	anyq := c.queue(ch, nil)
	dflt := c.queue(ch, nil)
	must(t, ch.QueueBind(all, "", x, false, amqp.Table{"x-match": "all", "format": "pdf", "type": "report"}))
	must(t, ch.QueueBind(anyq, "", x, false, amqp.Table{"x-match": "any", "format": "pdf", "type": "report"}))
	// x-match defaults to all
	must(t, ch.QueueBind(dflt, "", x, false, amqp.Table{"format": "zip"}))
	msgs := []keyed{
		{"both", amqp.Table{"format": "pdf", "type": "report"}},
		{"both-plus-extra", amqp.Table{"format": "pdf", "type": "report", "extra": int32(1)}},
		{"format-only", amqp.Table{"format": "pdf"}},
		{"type-only", amqp.Table{"type": "report"}},
		{"wrong-value", amqp.Table{"format": "doc", "type": "log"}},
		{"zip", amqp.Table{"format": "zip"}},
		{"no-headers", nil},
	}
	for _, m := range msgs {
		routed(t, pub, x, m.key, m.headers)
	}
	check := func(q string, want ...string) {
		t.Helper()
		got := drainBodies(t, ch, q)
		sort.Strings(got)
		sort.Strings(want)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	check(all, "both", "both-plus-extra")
	check(anyq, "both", "both-plus-extra", "format-only", "type-only")
	check(dflt, "zip")

	// unbind needs the same arguments
	must(t, ch.QueueUnbind(all, "", x, amqp.Table{"x-match": "all", "format": "pdf", "type": "report"}))
	routed(t, pub, x, "after-unbind", amqp.Table{"format": "pdf", "type": "report"})
	check(all)
	check(anyq, "after-unbind")

	// a value-typed match: int32 header against int32 binding
	num := c.queue(ch, nil)
	must(t, ch.QueueBind(num, "", x, false, amqp.Table{"x-match": "all", "n": int32(42)}))
	routed(t, pub, x, "n42", amqp.Table{"n": int32(42)})
	routed(t, pub, x, "n43", amqp.Table{"n": int32(43)})
	check(num, "n42")
}

func TestQueuePurge(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	for i := 0; i < 7; i++ {
		routed(t, pub, "", q, nil)
	}
	// 2 are delivered and unacked: purge only removes ready messages
	g1, ok, err := ch.Get(q, false)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	_, ok, err = ch.Get(q, false)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	n, err := ch.QueuePurge(q, false)
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 {
		t.Fatalf("purge count %d, want 5", n)
	}
	if st := inspect(t, ch, q); st.Messages != 0 {
		t.Fatalf("messages after purge %d", st.Messages)
	}
	n, err = ch.QueuePurge(q, false)
	if err != nil || n != 0 {
		t.Fatalf("second purge %d %v", n, err)
	}
	// the unacked ones come back when rejected
	must(t, g1.Reject(true))
	must(t, ch.Nack(0, true, true)) // nack the rest (multiple, tag 0 = all)
	waitMessageCount(t, ch, q, 2)
	missing := c.name("missing")
	_, err = ch.QueuePurge(missing, false)
	e := expectCode(t, err, amqp.NotFound, "purge missing queue")
	if want := fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", missing); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}

func TestQueueDelete(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	for i := 0; i < 4; i++ {
		routed(t, pub, "", q, nil)
	}
	// if-empty on a non-empty queue: 406
	_, err := ch.QueueDelete(q, false, true, false)
	e := expectCode(t, err, amqp.PreconditionFailed, "delete if-empty")
	if want := fmt.Sprintf("PRECONDITION_FAILED - queue '%s' in vhost '/' not empty", q); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	// if-unused on a queue with a consumer: 406
	cch := c.ch(conn)
	must(t, cch.Qos(1, 0, false))
	ds, err := cch.Consume(q, "", false, false, false, false, nil)
	must(t, err)
	recv(t, ds) // one unacked
	ch = c.ch(conn)
	_, err = ch.QueueDelete(q, true, false, false)
	e = expectCode(t, err, amqp.PreconditionFailed, "delete if-unused")
	if want := fmt.Sprintf("PRECONDITION_FAILED - queue '%s' in vhost '/' in use", q); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	// plain delete: count is the number of ready messages (unacked excluded)
	ch = c.ch(conn)
	cancels := cch.NotifyCancel(make(chan string, 1))
	n, err := ch.QueueDelete(q, false, false, false)
	must(t, err)
	if n != 3 {
		t.Fatalf("delete count %d, want 3 (4 messages, 1 unacked)", n)
	}
	select {
	case <-cancels:
	case <-timeAfter():
		t.Fatal("no basic.cancel after queue deletion")
	}
	_, err = ch.QueueDeclarePassive(q, false, false, false, false, nil)
	expectCode(t, err, amqp.NotFound, "passive after delete")
	// deleting a missing queue is delete-ok with count 0 in RabbitMQ 3.10
	ch = c.ch(conn)
	n, err = ch.QueueDelete(c.name("missing"), false, false, false)
	if err != nil || n != 0 {
		t.Fatalf("delete missing queue: %d %v", n, err)
	}
	n, err = ch.QueueDelete(c.name("missing"), true, true, false)
	if err != nil || n != 0 {
		t.Fatalf("delete if-unused if-empty missing queue: %d %v", n, err)
	}
	// if-empty/if-unused on an empty unused queue succeed
	q2 := c.queue(ch, nil)
	n, err = ch.QueueDelete(q2, true, true, false)
	if err != nil || n != 0 {
		t.Fatalf("conditional delete of empty unused queue: %d %v", n, err)
	}
}
