package interop

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// fill publishes n messages "0".."n-1" with confirms.
func fill(t *testing.T, pub *amqp.Channel, q string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if !pubConfirm(t, pub, "", q, false, amqp.Publishing{Body: []byte(strconv.Itoa(i))}) {
			t.Fatalf("message %d nacked", i)
		}
	}
}

func bodies(ds []amqp.Delivery) string {
	var s []string
	for _, d := range ds {
		s = append(s, string(d.Body))
	}
	return strings.Join(s, ",")
}

// Short quiet period used to check that the broker holds deliveries back.
const quiet = 300 * time.Millisecond

func TestQosPrefetchPerConsumer(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	fill(t, pub, q, 10)
	cch := c.ch(c.conn())
	must(t, cch.Qos(3, 0, false))
	ds, err := cch.Consume(q, "", false, false, false, false, nil)
	must(t, err)
	first := recvN(t, ds, 3)
	if bodies(first) != "0,1,2" {
		t.Fatalf("first deliveries %s", bodies(first))
	}
	expectNoDelivery(t, ds, quiet)
	waitMessageCount(t, ch, q, 7)
	must(t, first[0].Ack(false))
	if d := recv(t, ds); string(d.Body) != "3" {
		t.Fatalf("after one ack got %q", d.Body)
	}
	expectNoDelivery(t, ds, quiet)
	// ack the remaining two with one multiple ack: two more arrive
	must(t, first[2].Ack(true))
	more := recvN(t, ds, 2)
	if bodies(more) != "4,5" {
		t.Fatalf("after multiple ack got %s", bodies(more))
	}
	expectNoDelivery(t, ds, quiet)
	// raising the prefetch on the fly lets the rest flow
	must(t, cch.Qos(0, 0, false)) // 0 = unlimited, applies to new consumers only
	ds2, err := cch.Consume(q, "", false, false, false, false, nil)
	must(t, err)
	rest := recvN(t, ds2, 4)
	if bodies(rest) != "6,7,8,9" {
		t.Fatalf("unlimited consumer got %s", bodies(rest))
	}
}

func TestQosPrefetchTwoConsumersSameChannel(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q1 := c.queue(ch, nil)
	q2 := c.queue(ch, nil)
	fill(t, pub, q1, 5)
	fill(t, pub, q2, 5)
	cch := c.ch(c.conn())
	// per-consumer (global=false): each consumer gets its own 2
	must(t, cch.Qos(2, 0, false))
	ds1, err := cch.Consume(q1, "", false, false, false, false, nil)
	must(t, err)
	ds2, err := cch.Consume(q2, "", false, false, false, false, nil)
	must(t, err)
	recvN(t, ds1, 2)
	recvN(t, ds2, 2)
	expectNoDelivery(t, ds1, quiet)
	expectNoDelivery(t, ds2, quiet)
}

func TestQosGlobal(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q1 := c.queue(ch, nil)
	q2 := c.queue(ch, nil)
	fill(t, pub, q1, 5)
	fill(t, pub, q2, 5)
	cch := c.ch(c.conn())
	// global=true: the limit is shared by all consumers on the channel
	must(t, cch.Qos(3, 0, true))
	ds1, err := cch.Consume(q1, "", false, false, false, false, nil)
	must(t, err)
	ds2, err := cch.Consume(q2, "", false, false, false, false, nil)
	must(t, err)
	var got []amqp.Delivery
	timeout := time.After(waitTimeout)
	for len(got) < 3 {
		select {
		case d := <-ds1:
			got = append(got, d)
		case d := <-ds2:
			got = append(got, d)
		case <-timeout:
			t.Fatalf("only %d deliveries with global prefetch 3", len(got))
		}
	}
	select {
	case d := <-ds1:
		t.Fatalf("4th delivery with global prefetch 3: %q", d.Body)
	case d := <-ds2:
		t.Fatalf("4th delivery with global prefetch 3: %q", d.Body)
	case <-time.After(quiet):
	}
	must(t, got[0].Ack(false))
	select {
	case <-ds1:
	case <-ds2:
	case <-timeAfter():
		t.Fatal("no delivery after ack with global prefetch")
	}
}

func TestQosPrefetchSizeNotImplemented(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	// RabbitMQ does not implement prefetch_size: connection error 540.
	err := ch.Qos(0, 1000, false)
	expectCode(t, err, amqp.NotImplemented, "qos with prefetch size")
	e := waitErr(t, closed, "connection close")
	if want := "NOT_IMPLEMENTED - prefetch_size!=0 (1000)"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}

func TestAutoAckConsume(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	fill(t, pub, q, 5)
	cch := c.ch(conn)
	must(t, cch.Qos(1, 0, false)) // prefetch does not limit no-ack consumers
	ds, err := cch.Consume(q, "", true, false, false, false, nil)
	must(t, err)
	got := recvN(t, ds, 5)
	if bodies(got) != "0,1,2,3,4" {
		t.Fatalf("got %s", bodies(got))
	}
	for i, d := range got {
		if d.DeliveryTag != uint64(i+1) {
			t.Fatalf("delivery tag %d at %d", d.DeliveryTag, i)
		}
	}
	// closing the channel does not bring anything back
	must(t, cch.Close())
	time.Sleep(100 * time.Millisecond)
	if st := inspect(t, ch, q); st.Messages != 0 {
		t.Fatalf("auto-acked messages came back: %d", st.Messages)
	}
}

func TestExclusiveConsumer(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, nil)
	ech := c.ch(conn)
	_, err := ech.Consume(q, "", false, true, false, false, nil)
	must(t, err)
	other := c.ch(c.conn())
	_, err = other.Consume(q, "", false, false, false, false, nil)
	e := expectCode(t, err, amqp.AccessRefused, "consume next to an exclusive consumer")
	if want := fmt.Sprintf("ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use", q); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	// and the reverse: exclusive consume on a queue that already has a consumer
	q2 := c.queue(ch, nil)
	_, err = ech.Consume(q2, "", false, false, false, false, nil)
	must(t, err)
	other = c.ch(c.conn())
	_, err = other.Consume(q2, "", false, true, false, false, nil)
	e = expectCode(t, err, amqp.AccessRefused, "exclusive consume on a queue in use")
	if want := fmt.Sprintf("ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use", q2); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	// consuming from a missing queue: 404
	other = c.ch(c.conn())
	missing := c.name("missing")
	_, err = other.Consume(missing, "", false, false, false, false, nil)
	e = expectCode(t, err, amqp.NotFound, "consume missing queue")
	if want := fmt.Sprintf("NOT_FOUND - no queue '%s' in vhost '/'", missing); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}

func TestConsumerTagAndCancel(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	cch := c.ch(conn)
	tag := c.name("tag")
	ds, err := cch.Consume(q, tag, false, false, false, false, nil)
	must(t, err)
	fill(t, pub, q, 2)
	d := recv(t, ds)
	if d.ConsumerTag != tag {
		t.Fatalf("consumer tag %q, want %q", d.ConsumerTag, tag)
	}
	must(t, d.Ack(false))
	d = recv(t, ds) // unacked
	if st := inspect(t, ch, q); st.Consumers != 1 {
		t.Fatalf("consumers %d", st.Consumers)
	}
	must(t, cch.Cancel(tag, false))
	// the delivery channel closes after cancel-ok
	select {
	case extra, ok := <-ds:
		if ok {
			t.Fatalf("delivery after cancel: %q", extra.Body)
		}
	case <-timeAfter():
		t.Fatal("deliveries not closed after cancel")
	}
	if st := inspect(t, ch, q); st.Consumers != 0 {
		t.Fatalf("consumers %d after cancel", st.Consumers)
	}
	// messages published after the cancel stay in the queue
	fill(t, pub, q, 1)
	waitMessageCount(t, ch, q, 1)
	// an unacked delivery of a cancelled consumer can still be acked
	must(t, d.Ack(false))
	// cancelling an unknown tag is not an error in RabbitMQ
	if err := cch.Cancel("no-such-tag", false); err != nil {
		t.Fatalf("cancel unknown tag: %v", err)
	}
	// the channel is still healthy
	if _, err := cch.QueueDeclarePassive(q, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// library-generated tags (amqp091-go always sends its own) are echoed
	ds2, err := cch.Consume(q, "", false, false, false, false, nil)
	must(t, err)
	d2 := recv(t, ds2)
	if !strings.HasPrefix(d2.ConsumerTag, "ctag-") {
		t.Fatalf("consumer tag %q", d2.ConsumerTag)
	}
}

func TestNotifyCancelOnQueueDelete(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, nil)
	cch := c.ch(conn)
	cancels := cch.NotifyCancel(make(chan string, 1))
	tag := c.name("tag")
	ds, err := cch.Consume(q, tag, false, false, false, false, nil)
	must(t, err)
	_, err = ch.QueueDelete(q, false, false, false)
	must(t, err)
	select {
	case got := <-cancels:
		if got != tag {
			t.Fatalf("cancel for %q, want %q", got, tag)
		}
	case <-timeAfter():
		t.Fatal("no basic.cancel from the server after queue.delete")
	}
	select {
	case _, ok := <-ds:
		if ok {
			t.Fatal("delivery after server cancel")
		}
	case <-timeAfter():
		t.Fatal("deliveries not closed after server cancel")
	}
	// the channel stays open
	if cch.IsClosed() {
		t.Fatal("channel closed by consumer cancel notification")
	}
	q2 := c.queue(cch, nil)
	publish(t, cch, "", q2, "x")
	waitMessageCount(t, cch, q2, 1)
}

func TestGetAndGetEmpty(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	_, ok, err := ch.Get(q, false)
	if err != nil || ok {
		t.Fatalf("get on empty queue: ok=%v err=%v", ok, err)
	}
	fill(t, pub, q, 3)
	d, ok, err := ch.Get(q, false)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if string(d.Body) != "0" || d.MessageCount != 2 || d.DeliveryTag != 1 || d.Redelivered ||
		d.Exchange != "" || d.RoutingKey != q {
		t.Fatalf("get-ok %+v", d)
	}
	must(t, d.Ack(false))
	d, ok, err = ch.Get(q, true)
	if err != nil || !ok || string(d.Body) != "1" || d.MessageCount != 1 || d.DeliveryTag != 2 {
		t.Fatalf("second get %v %v %+v", ok, err, d)
	}
	d, ok, err = ch.Get(q, true)
	if err != nil || !ok || string(d.Body) != "2" || d.MessageCount != 0 {
		t.Fatalf("third get %v %v %+v", ok, err, d)
	}
	_, ok, err = ch.Get(q, true)
	if err != nil || ok {
		t.Fatalf("get after drain: ok=%v err=%v", ok, err)
	}
	missing := c.name("missing")
	_, _, err = ch.Get(missing, true)
	expectCode(t, err, amqp.NotFound, "get from missing queue")
}

func TestAckMultiple(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	fill(t, pub, q, 6)
	cch := c.ch(conn)
	ds, err := cch.Consume(q, "", false, false, false, false, nil)
	must(t, err)
	got := recvN(t, ds, 6)
	must(t, got[3].Ack(true)) // acks 1..4
	must(t, cch.Cancel(got[0].ConsumerTag, false))
	must(t, cch.Close()) // 5 and 6 go back
	waitMessageCount(t, ch, q, 2)
	left := drainBodies(t, ch, q)
	if strings.Join(left, ",") != "4,5" {
		t.Fatalf("left %v", left)
	}
}

func TestNackRequeueKeepsOrder(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	fill(t, pub, q, 5)
	gch := c.ch(conn)
	var ds []amqp.Delivery
	for i := 0; i < 3; i++ {
		d, ok, err := gch.Get(q, false)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		ds = append(ds, d)
	}
	// nack 0,1,2 with requeue (multiple): they return to their original
	// position at the head of the queue, marked redelivered
	must(t, ds[2].Nack(true, true))
	waitMessageCount(t, ch, q, 5)
	for i := 0; i < 5; i++ {
		d, ok, err := gch.Get(q, false)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if string(d.Body) != strconv.Itoa(i) {
			t.Fatalf("position %d: got %q", i, d.Body)
		}
		if d.Redelivered != (i < 3) {
			t.Fatalf("message %d redelivered=%v", i, d.Redelivered)
		}
		ds = append(ds, d)
	}
	// single nack, no requeue: dropped
	must(t, ds[3].Nack(false, false))
	// reject with requeue
	must(t, ds[4].Reject(true))
	// reject without requeue
	must(t, ds[5].Reject(false))
	must(t, gch.Ack(ds[7].DeliveryTag, true)) // acks the rest
	waitMessageCount(t, ch, q, 1)
	d, ok, err := gch.Get(q, true)
	if err != nil || !ok || string(d.Body) != "1" || !d.Redelivered {
		t.Fatalf("remaining %v %v %+v", ok, err, d)
	}
}

func TestNackRequeueToConsumer(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	fill(t, pub, q, 3)
	cch := c.ch(conn)
	must(t, cch.Qos(1, 0, false))
	ds, err := cch.Consume(q, "", false, false, false, false, nil)
	must(t, err)
	d := recv(t, ds)
	if string(d.Body) != "0" || d.Redelivered {
		t.Fatalf("first %+v", d)
	}
	must(t, d.Nack(false, true))
	d = recv(t, ds)
	if string(d.Body) != "0" || !d.Redelivered {
		t.Fatalf("after nack requeue got %q redelivered=%v", d.Body, d.Redelivered)
	}
	must(t, d.Ack(false))
	d = recv(t, ds)
	if string(d.Body) != "1" || d.Redelivered {
		t.Fatalf("next %q redelivered=%v", d.Body, d.Redelivered)
	}
	must(t, d.Reject(false))
	d = recv(t, ds)
	if string(d.Body) != "2" {
		t.Fatalf("last %q", d.Body)
	}
	must(t, d.Ack(false))
	waitMessageCount(t, ch, q, 0)
}

func TestUnknownDeliveryTag(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, nil)
	ach := c.ch(conn)
	closed := ach.NotifyClose(make(chan *amqp.Error, 1))
	must(t, ach.Ack(99, false))
	e := waitErr(t, closed, "ack of unknown delivery tag")
	if e.Code != amqp.PreconditionFailed || !e.Server {
		t.Fatalf("close %#v, want server 406", e)
	}
	if want := "PRECONDITION_FAILED - unknown delivery tag 99"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	if conn.IsClosed() {
		t.Fatal("connection closed by a soft error")
	}
	// double ack is the same error
	pub := c.confirmCh(conn)
	fill(t, pub, q, 1)
	gch := c.ch(conn)
	closed = gch.NotifyClose(make(chan *amqp.Error, 1))
	d, ok, err := gch.Get(q, false)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	must(t, d.Ack(false))
	must(t, d.Ack(false))
	e = waitErr(t, closed, "double ack")
	if e.Code != amqp.PreconditionFailed || e.Reason != fmt.Sprintf("PRECONDITION_FAILED - unknown delivery tag %d", d.DeliveryTag) {
		t.Fatalf("double ack close %#v", e)
	}
	// nack and reject of unknown tags likewise
	for _, op := range []string{"nack", "reject"} {
		xch := c.ch(conn)
		closed := xch.NotifyClose(make(chan *amqp.Error, 1))
		if op == "nack" {
			must(t, xch.Nack(5, false, true))
		} else {
			must(t, xch.Reject(5, true))
		}
		e := waitErr(t, closed, op+" of unknown delivery tag")
		if e.Code != amqp.PreconditionFailed || e.Reason != "PRECONDITION_FAILED - unknown delivery tag 5" {
			t.Fatalf("%s close %#v", op, e)
		}
	}
}

func TestRecover(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	fill(t, pub, q, 3)
	cch := c.ch(conn)
	ds, err := cch.Consume(q, "", false, false, false, false, nil)
	must(t, err)
	first := recvN(t, ds, 3)
	must(t, first[0].Ack(false))
	must(t, cch.Recover(true))
	again := recvN(t, ds, 2)
	if bodies(again) != "1,2" {
		t.Fatalf("redelivered %s", bodies(again))
	}
	for _, d := range again {
		if !d.Redelivered {
			t.Fatalf("recovered message %q not marked redelivered", d.Body)
		}
		if d.DeliveryTag <= 3 {
			t.Fatalf("recovered message reused delivery tag %d", d.DeliveryTag)
		}
	}
	must(t, again[1].Ack(true))
	waitMessageCount(t, ch, q, 0)
	// the old tags are gone
	closed := cch.NotifyClose(make(chan *amqp.Error, 1))
	must(t, first[1].Ack(false))
	e := waitErr(t, closed, "ack of a pre-recover tag")
	if e.Code != amqp.PreconditionFailed {
		t.Fatalf("close %#v", e)
	}
}

func TestRecoverNoRequeueNotImplemented(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	err := ch.Recover(false)
	// RabbitMQ: basic.recover{requeue=false} is a 540 connection error.
	expectCode(t, err, amqp.NotImplemented, "recover(false)")
	e := waitErr(t, closed, "connection close")
	if want := "NOT_IMPLEMENTED - requeue=false"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}

func TestChannelCloseRequeuesUnacked(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	fill(t, pub, q, 4)
	cch := c.ch(conn)
	ds, err := cch.Consume(q, "", false, false, false, false, nil)
	must(t, err)
	got := recvN(t, ds, 4)
	must(t, got[1].Ack(false))
	must(t, cch.Close())
	waitMessageCount(t, ch, q, 3)
	// requeued in original order, marked redelivered
	gch := c.ch(conn)
	for _, want := range []string{"0", "2", "3"} {
		d, ok, err := gch.Get(q, true)
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		if string(d.Body) != want || !d.Redelivered {
			t.Fatalf("got %q redelivered=%v, want %q redelivered", d.Body, d.Redelivered, want)
		}
	}
	// and when the whole connection closes
	fill(t, pub, q, 2)
	conn2 := c.conn()
	cch2 := c.ch(conn2)
	ds2, err := cch2.Consume(q, "", false, false, false, false, nil)
	must(t, err)
	recvN(t, ds2, 2)
	must(t, conn2.Close())
	waitMessageCount(t, ch, q, 2)
}

func TestRoundRobinConsumers(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	cch := c.ch(conn)
	ds1, err := cch.Consume(q, "", true, false, false, false, nil)
	must(t, err)
	ds2, err := cch.Consume(q, "", true, false, false, false, nil)
	must(t, err)
	fill(t, pub, q, 10)
	n1, n2 := 0, 0
	timeout := time.After(waitTimeout)
	for n1+n2 < 10 {
		select {
		case <-ds1:
			n1++
		case <-ds2:
			n2++
		case <-timeout:
			t.Fatalf("got %d+%d of 10", n1, n2)
		}
	}
	// RabbitMQ round-robins between consumers with free capacity
	if n1 != 5 || n2 != 5 {
		t.Fatalf("distribution %d/%d, want 5/5", n1, n2)
	}
}

func TestDirectReplyTo(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, nil)
	// server side: consumes requests and answers to ReplyTo
	srv := c.ch(c.conn())
	reqs, err := srv.Consume(q, "", true, false, false, false, nil)
	must(t, err)
	// client side: consume the pseudo-queue (no-ack is mandatory), then publish
	cli := c.ch(conn)
	replies, err := cli.Consume("amq.rabbitmq.reply-to", "", true, false, false, false, nil)
	must(t, err)
	publishMsg(t, cli, "", q, amqp.Publishing{ReplyTo: "amq.rabbitmq.reply-to", CorrelationId: "c1", Body: []byte("ping")})
	req := recv(t, reqs)
	if !strings.HasPrefix(req.ReplyTo, "amq.rabbitmq.reply-to.") {
		t.Fatalf("request ReplyTo %q, want amq.rabbitmq.reply-to.<token>", req.ReplyTo)
	}
	publishMsg(t, srv, "", req.ReplyTo, amqp.Publishing{CorrelationId: req.CorrelationId, Body: []byte("pong")})
	rep := recv(t, replies)
	if string(rep.Body) != "pong" || rep.CorrelationId != "c1" {
		t.Fatalf("reply %+v", rep)
	}
	if rep.RoutingKey != req.ReplyTo || rep.Exchange != "" {
		t.Fatalf("reply routed via %q/%q", rep.Exchange, rep.RoutingKey)
	}

	// consuming the pseudo-queue with acks is refused
	bad := c.ch(conn)
	_, err = bad.Consume("amq.rabbitmq.reply-to", "", false, false, false, false, nil)
	e := expectCode(t, err, amqp.PreconditionFailed, "reply-to consumer with acks")
	if want := "PRECONDITION_FAILED - reply consumer cannot acknowledge"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	// publishing with ReplyTo amq.rabbitmq.reply-to without such a consumer
	bad = c.ch(conn)
	closed := bad.NotifyClose(make(chan *amqp.Error, 1))
	publishMsg(t, bad, "", q, amqp.Publishing{ReplyTo: "amq.rabbitmq.reply-to", Body: []byte("x")})
	e = waitErr(t, closed, "reply-to without consumer")
	if e.Code != amqp.PreconditionFailed || e.Reason != "PRECONDITION_FAILED - fast reply consumer does not exist" {
		t.Fatalf("close %#v", e)
	}
}

func TestConsumerPriority(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	cch := c.ch(c.conn())
	must(t, cch.Qos(3, 0, false))
	low, err := cch.Consume(q, "", false, false, false, false, amqp.Table{"x-priority": int32(1)})
	must(t, err)
	high, err := cch.Consume(q, "", false, false, false, false, amqp.Table{"x-priority": int32(10)})
	must(t, err)
	fill(t, pub, q, 5)
	// the high-priority consumer is served while it has prefetch room; the
	// rest goes to the low-priority one
	h := recvN(t, high, 3)
	l := recvN(t, low, 2)
	if bodies(h) != "0,1,2" || bodies(l) != "3,4" {
		t.Fatalf("high got %s, low got %s", bodies(h), bodies(l))
	}
}
