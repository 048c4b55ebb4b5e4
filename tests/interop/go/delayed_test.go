package interop

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The x-delayed-message exchange and retry back-off (docs/delayed.md). The reference RabbitMQ
// 3.10 has no delayed-message plugin and no x-delayed-retry-*, so these run against Warren only.

func TestDelayedExchangeHoldsByHeaderAndNegatesIt(t *testing.T) {
	skipUnlessWarren(t)
	c := newTC(t)
	_, ch := c.connCh()
	x := c.name("dx")
	c.trackExchange(x)
	must(t, ch.ExchangeDeclare(x, "x-delayed-message", false, false, false, false, amqp.Table{"x-delayed-type": "fanout"}))
	q := c.queue(ch, nil)
	must(t, ch.QueueBind(q, "", x, false, nil))
	must(t, ch.Confirm(false))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 2))
	start := time.Now()
	publishMsg(t, ch, x, "", amqp.Publishing{Body: []byte("later"), DeliveryMode: amqp.Persistent, Headers: amqp.Table{"x-delay": int32(700)}})
	publishMsg(t, ch, x, "", amqp.Publishing{Body: []byte("now")})
	for i := 0; i < 2; i++ {
		select {
		case cf := <-confirms:
			if !cf.Ack {
				t.Fatalf("publish %d nacked", cf.DeliveryTag)
			}
		case <-timeAfter():
			t.Fatal("no confirm")
		}
	}
	ds, err := ch.Consume(q, "", true, false, false, false, nil)
	must(t, err)
	got := recvN(t, ds, 2)
	if string(got[0].Body) != "now" || string(got[1].Body) != "later" {
		t.Fatalf("order %q, %q; want now, later", got[0].Body, got[1].Body)
	}
	if waited := time.Since(start); waited < 650*time.Millisecond {
		t.Fatalf("delivered after %v, before its 700 ms delay", waited)
	}
	if d, ok := got[1].Headers["x-delay"].(int32); !ok || d != -700 {
		t.Fatalf("x-delay on delivery = %#v, want int32(-700)", got[1].Headers["x-delay"])
	}
}

func TestRetryBackOffCountsAttempts(t *testing.T) {
	skipUnlessWarren(t)
	c := newTC(t)
	_, ch := c.connCh()
	q := c.queue(ch, amqp.Table{"x-delayed-retry-min": int32(200), "x-delayed-retry-multiplier": int32(2)})
	publish(t, ch, "", q, "job")
	ds, err := ch.Consume(q, "", false, false, false, false, nil)
	must(t, err)
	var last time.Time
	for attempt := 0; attempt < 3; attempt++ {
		d := recvN(t, ds, 1)[0]
		now := time.Now()
		if attempt > 0 {
			want := time.Duration(200<<(attempt-1)) * time.Millisecond
			if gap := now.Sub(last); gap < want-20*time.Millisecond {
				t.Fatalf("attempt %d came back after %v, want at least %v", attempt, gap, want)
			}
			if n, _ := d.Headers["x-delivery-count"].(int64); n != int64(attempt) {
				t.Fatalf("x-delivery-count = %#v on attempt %d", d.Headers["x-delivery-count"], attempt)
			}
		}
		last = now
		if attempt < 2 {
			must(t, d.Nack(false, true))
		} else {
			must(t, d.Ack(false))
		}
	}
}
