package interop

// Dead-letter cycles and a message's whole key set at every exchange-to-exchange hop, as
// RabbitMQ 3.10 does them (issue 29; the Python twin, test_dead_letter_routing.py, has more
// cases). Both run against the reference RabbitMQ without WARREN_BIN and pass there.

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestDeadLetterCycleIsDroppedWhereItClosesAndDeliveredElsewhere(t *testing.T) {
	c := newTC(t)
	_, ch := c.connCh()
	dlx := c.exchange(ch, "fanout")
	q := c.queue(ch, amqp.Table{"x-message-ttl": int32(50), "x-dead-letter-exchange": dlx})
	observer := c.queue(ch, nil)
	for _, n := range []string{q, observer} {
		if err := ch.QueueBind(n, "", dlx, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	publish(t, ch, dlx, "k", "loop")
	eventually(t, "the observer to hold the message and its dead letter", func() bool {
		return inspect(t, ch, observer).Messages == 2
	})
	// A cycle that was not cut goes round every 50 ms.
	time.Sleep(1500 * time.Millisecond)
	if got := [2]int{inspect(t, ch, q).Messages, inspect(t, ch, observer).Messages}; got != [2]int{0, 2} {
		t.Fatalf("queue, observer hold %v; want [0 2]", got)
	}
}

func TestCCAndBCCKeysAreMatchedAtEveryHop(t *testing.T) {
	c := newTC(t)
	_, ch := c.connCh()
	x1 := c.exchange(ch, "direct")
	x2 := c.exchange(ch, "topic")
	q := c.queue(ch, nil)
	if err := ch.ExchangeBind(x2, "rk1", x1, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q, "rk2", x2, false, nil); err != nil {
		t.Fatal(err)
	}
	publishMsg(t, ch, x1, "", amqp.Publishing{Body: []byte("m"),
		Headers: amqp.Table{"CC": []interface{}{"rk1"}, "BCC": []interface{}{"rk2"}}})
	ds, err := ch.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := recv(t, ds)
	if string(d.Body) != "m" {
		t.Fatalf("body %q", d.Body)
	}
	if _, ok := d.Headers["BCC"]; ok {
		t.Fatalf("BCC header delivered: %v", d.Headers)
	}
	if cc, ok := d.Headers["CC"].([]interface{}); !ok || len(cc) != 1 || cc[0] != "rk1" {
		t.Fatalf("CC header %v; want [rk1]", d.Headers["CC"])
	}
}
