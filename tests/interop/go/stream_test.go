package interop

import (
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A stream (x-queue-type=stream): publish with confirms, then read from an integer offset;
// every delivery carries its offset in the x-stream-offset header (a long), and acks do not
// remove anything: a second reader from "first" sees the whole stream.
func TestStreamConsumeFromOffset(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.name("stream")
	_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "stream"})
	must(t, err)
	c.trackQueue(q)
	pub := c.confirmCh(conn)
	for i := 0; i < 10; i++ {
		if !pubConfirm(t, pub, "", q, false, amqp.Publishing{Body: []byte(fmt.Sprint(i))}) {
			t.Fatalf("message %d nacked", i)
		}
	}
	read := func(offset interface{}, n int) []amqp.Delivery {
		cch := c.ch(c.conn())
		must(t, cch.Qos(5, 0, false))
		ds, err := cch.Consume(q, "", false, false, false, false, amqp.Table{"x-stream-offset": offset})
		must(t, err)
		var got []amqp.Delivery
		for len(got) < n {
			d := recv(t, ds)
			must(t, d.Ack(false))
			got = append(got, d)
		}
		return got
	}
	got := read(int64(4), 6)
	if bodies(got) != "4,5,6,7,8,9" {
		t.Fatalf("from offset 4 got %s", bodies(got))
	}
	for i, d := range got {
		if off, ok := d.Headers["x-stream-offset"].(int64); !ok || off != int64(4+i) {
			t.Fatalf("delivery %d: x-stream-offset %#v", i, d.Headers["x-stream-offset"])
		}
	}
	if all := read("first", 10); bodies(all) != "0,1,2,3,4,5,6,7,8,9" {
		t.Fatalf("from first got %s", bodies(all))
	}
}

// basic.get on a stream closes the connection with RabbitMQ's 540.
func TestStreamGetRefused(t *testing.T) {
	c := newTC(t)
	_, ch := c.connCh()
	q := c.name("stream")
	_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "stream"})
	must(t, err)
	c.trackQueue(q)
	_, _, err = ch.Get(q, false)
	e := expectCode(t, err, 540, "basic.get on a stream")
	want := fmt.Sprintf("NOT_IMPLEMENTED - basic.get not supported by stream queues queue '%s' in vhost '/'", q)
	if e.Reason != want {
		t.Fatalf("reason %q, want %q", e.Reason, want)
	}
}
