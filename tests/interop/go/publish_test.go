package interop

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"reflect"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func brokerUser(t *testing.T) string {
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.User.Username()
}

func TestPropertiesRoundTrip(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, nil)
	ts := time.Unix(1700000000, 0)
	headers := amqp.Table{
		"string":   "hello wörld",
		"empty":    "",
		"int32":    int32(-123456),
		"int64":    int64(1) << 40,
		"int16":    int16(-1234),
		"int8":     int8(-12),
		"uint8":    uint8(200),
		"uint16":   uint16(60000),
		"uint32":   uint32(4000000000),
		"bool-t":   true,
		"bool-f":   false,
		"float64":  3.141592653589793,
		"float32":  float32(1.5),
		"nested":   amqp.Table{"a": int32(1), "b": amqp.Table{"deep": "yes"}},
		"array":    []interface{}{"x", int32(2), true, amqp.Table{"k": "v"}, []interface{}{int64(9)}},
		"emptyarr": []interface{}{},
		"time":     ts,
		"bytes":    []byte{0, 1, 2, 0xfe, 0xff},
		"decimal":  amqp.Decimal{Scale: 2, Value: 12345},
		"void":     nil,
	}
	msg := amqp.Publishing{
		Headers:         headers,
		ContentType:     "application/json",
		ContentEncoding: "gzip",
		DeliveryMode:    amqp.Persistent,
		Priority:        7,
		CorrelationId:   "corr-1",
		ReplyTo:         "reply-queue",
		Expiration:      "600000",
		MessageId:       "msg-1",
		Timestamp:       ts,
		Type:            "my.type",
		UserId:          brokerUser(t),
		AppId:           "go-interop",
		Body:            []byte(`{"k":"v"}`),
	}
	publishMsg(t, ch, "", q, msg)

	cch := c.ch(conn)
	ds, err := cch.Consume(q, "", false, false, false, false, nil)
	must(t, err)
	d := recv(t, ds)
	check := func(name string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %#v, want %#v", name, got, want)
		}
	}
	check("ContentType", d.ContentType, msg.ContentType)
	check("ContentEncoding", d.ContentEncoding, msg.ContentEncoding)
	check("DeliveryMode", d.DeliveryMode, msg.DeliveryMode)
	check("Priority", d.Priority, msg.Priority)
	check("CorrelationId", d.CorrelationId, msg.CorrelationId)
	check("ReplyTo", d.ReplyTo, msg.ReplyTo)
	check("Expiration", d.Expiration, msg.Expiration)
	check("MessageId", d.MessageId, msg.MessageId)
	check("Type", d.Type, msg.Type)
	check("UserId", d.UserId, msg.UserId)
	check("AppId", d.AppId, msg.AppId)
	check("Body", d.Body, msg.Body)
	if !d.Timestamp.Equal(ts) {
		t.Errorf("Timestamp %v, want %v", d.Timestamp, ts)
	}
	check("Exchange", d.Exchange, "")
	check("RoutingKey", d.RoutingKey, q)
	check("Redelivered", d.Redelivered, false)
	if len(d.Headers) != len(headers) {
		t.Errorf("header count %d, want %d (%v)", len(d.Headers), len(headers), keys(d.Headers))
	}
	for k, want := range headers {
		got, ok := d.Headers[k]
		if !ok {
			t.Errorf("header %q missing", k)
			continue
		}
		if wt, ok := want.(time.Time); ok {
			gt, ok := got.(time.Time)
			if !ok || !gt.Equal(wt) {
				t.Errorf("header %q: got %#v, want %v", k, got, wt)
			}
			continue
		}
		if k == "emptyarr" { // amqp091-go decodes an empty field array as a nil slice
			if ga, ok := got.([]interface{}); !ok || len(ga) != 0 {
				t.Errorf("header %q: got %#v, want an empty array", k, got)
			}
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("header %q: got %#v (%T), want %#v (%T)", k, got, got, want, want)
		}
	}
	must(t, d.Ack(false))
}

func TestMinimalPropertiesRoundTrip(t *testing.T) {
	c := newTC(t)
	_, ch := c.connCh()
	q := c.queue(ch, nil)
	publishMsg(t, ch, "", q, amqp.Publishing{Body: []byte("bare")})
	var d amqp.Delivery
	eventually(t, "get", func() bool {
		var ok bool
		var err error
		d, ok, err = ch.Get(q, true)
		must(t, err)
		return ok
	})
	if d.ContentType != "" || d.DeliveryMode != 0 || d.Priority != 0 || d.Headers != nil ||
		d.MessageId != "" || !d.Timestamp.IsZero() || d.Expiration != "" || d.UserId != "" {
		t.Fatalf("properties appeared out of nowhere: %+v", d)
	}
}

func TestUserIdMismatch(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, nil)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	publishMsg(t, ch, "", q, amqp.Publishing{UserId: "someone-else", Body: []byte("x")})
	e := waitErr(t, closed, "publish with foreign user-id")
	if e.Code != amqp.PreconditionFailed {
		t.Fatalf("close %#v, want 406", e)
	}
	if want := fmt.Sprintf("PRECONDITION_FAILED - user_id property set to 'someone-else' but authenticated user was '%s'", brokerUser(t)); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	ch2 := c.ch(conn)
	if st := inspect(t, ch2, q); st.Messages != 0 {
		t.Fatalf("rejected message was enqueued")
	}
}

func TestBodySizes(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	// frame_max is 131072; body frames carry at most 131064 bytes
	sizes := []int{0, 1, 131063, 131064, 131065, 262128, 2 * 1024 * 1024}
	for _, n := range sizes {
		body := make([]byte, n)
		for i := range body {
			body[i] = byte(i*31 + n)
		}
		if !pubConfirm(t, pub, "", q, false, amqp.Publishing{Body: body, MessageId: strconv.Itoa(n)}) {
			t.Fatalf("size %d nacked", n)
		}
	}
	ds, err := ch.Consume(q, "", true, false, false, false, nil)
	must(t, err)
	for _, n := range sizes {
		d := recv(t, ds)
		if d.MessageId != strconv.Itoa(n) {
			t.Fatalf("order: got message %s, want %d", d.MessageId, n)
		}
		if len(d.Body) != n {
			t.Fatalf("size %d: got %d bytes", n, len(d.Body))
		}
		for i := range d.Body {
			if d.Body[i] != byte(i*31+n) {
				t.Fatalf("size %d: byte %d differs", n, i)
			}
		}
	}
}

func TestEmptyBodyGet(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	if !pubConfirm(t, pub, "", q, false, amqp.Publishing{ContentType: "text/plain"}) {
		t.Fatal("nacked")
	}
	d, ok, err := ch.Get(q, false)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if len(d.Body) != 0 || d.ContentType != "text/plain" {
		t.Fatalf("got %+v", d)
	}
	must(t, d.Ack(false))
}

func TestMandatoryNoRoute(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	returns := pub.NotifyReturn(make(chan amqp.Return, 4))
	x := c.exchange(ch, "direct")
	q := c.queue(ch, nil)
	must(t, ch.QueueBind(q, "bound", x, false, nil))

	msg := amqp.Publishing{MessageId: "m1", ContentType: "text/plain", Headers: amqp.Table{"h": "v"}, Body: []byte("unroutable")}
	// The return arrives before the confirm, and the confirm is an ack.
	if !pubConfirm(t, pub, x, "unbound", true, msg) {
		t.Fatal("unroutable mandatory message nacked; RabbitMQ acks it")
	}
	var r amqp.Return
	select {
	case r = <-returns:
	case <-timeAfter():
		t.Fatal("no basic.return")
	}
	if r.ReplyCode != amqp.NoRoute || r.ReplyText != "NO_ROUTE" {
		t.Fatalf("return %d %q, want 312 NO_ROUTE", r.ReplyCode, r.ReplyText)
	}
	if r.Exchange != x || r.RoutingKey != "unbound" || string(r.Body) != "unroutable" ||
		r.MessageId != "m1" || r.ContentType != "text/plain" || r.Headers["h"] != "v" {
		t.Fatalf("return contents %+v", r)
	}
	// mandatory and routable: no return
	if !pubConfirm(t, pub, x, "bound", true, amqp.Publishing{Body: []byte("ok")}) {
		t.Fatal("nacked")
	}
	// mandatory to the default exchange with a missing queue: returned
	if !pubConfirm(t, pub, "", c.name("missing"), true, amqp.Publishing{Body: []byte("nowhere")}) {
		t.Fatal("nacked")
	}
	select {
	case r = <-returns:
		if string(r.Body) != "nowhere" || r.ReplyCode != 312 {
			t.Fatalf("unexpected return %+v", r)
		}
	case <-timeAfter():
		t.Fatal("no basic.return for default exchange")
	}
	// not mandatory and unroutable: silently dropped
	if !pubConfirm(t, pub, x, "unbound", false, amqp.Publishing{Body: []byte("dropped")}) {
		t.Fatal("nacked")
	}
	select {
	case r := <-returns:
		t.Fatalf("unexpected return %+v", r)
	default:
	}
	waitMessageCount(t, ch, q, 1)
	// also without confirm mode
	plain := c.ch(conn)
	pr := plain.NotifyReturn(make(chan amqp.Return, 1))
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	must(t, plain.PublishWithContext(ctx, x, "nope", true, false, amqp.Publishing{Body: []byte("r")}))
	select {
	case r := <-pr:
		if r.ReplyCode != 312 {
			t.Fatalf("return %+v", r)
		}
	case <-timeAfter():
		t.Fatal("no basic.return without confirms")
	}
}

func TestImmediateIsNotImplemented(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	q := c.queue(ch, nil)
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	must(t, ch.PublishWithContext(ctx, "", q, false, true, amqp.Publishing{Body: []byte("now")}))
	// RabbitMQ 3.x dropped support for immediate: connection error 540.
	e := waitErr(t, closed, "publish immediate")
	if e.Code != amqp.NotImplemented || !e.Server {
		t.Fatalf("close %#v, want server 540", e)
	}
	if want := "NOT_IMPLEMENTED - immediate=true"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}

func TestPerMessageTTL(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, nil)
	// expiration 0 with no consumer: expired at once
	if !pubConfirm(t, pub, "", q, false, amqp.Publishing{Expiration: "0", Body: []byte("gone")}) {
		t.Fatal("nacked")
	}
	if !pubConfirm(t, pub, "", q, false, amqp.Publishing{Expiration: "3600000", Body: []byte("kept")}) {
		t.Fatal("nacked")
	}
	if got := drainBodies(t, ch, q); fmt.Sprint(got) != "[kept]" {
		t.Fatalf("got %q", got)
	}
	// invalid expiration: 406 channel error
	closed := pub.NotifyClose(make(chan *amqp.Error, 1))
	publishMsg(t, pub, "", q, amqp.Publishing{Expiration: "soon", Body: []byte("bad")})
	e := waitErr(t, closed, "publish with bad expiration")
	if e.Code != amqp.PreconditionFailed {
		t.Fatalf("close %#v, want 406", e)
	}
	if want := "PRECONDITION_FAILED - invalid expiration 'soon': no_integer"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
	// A number followed by more: RabbitMQ 3.10 names what is left over.
	pub2 := c.confirmCh(conn)
	closed2 := pub2.NotifyClose(make(chan *amqp.Error, 1))
	publishMsg(t, pub2, "", q, amqp.Publishing{Expiration: "100abc", Body: []byte("bad")})
	e = waitErr(t, closed2, "publish with a leftover after the expiration")
	if want := `PRECONDITION_FAILED - invalid expiration '100abc': {leftover_string,"abc"}`; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}

func TestQueueTTLAndMaxLength(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	// x-max-length with the default overflow (drop-head): oldest dropped
	q := c.queue(ch, amqp.Table{"x-max-length": int32(3)})
	for i := 1; i <= 5; i++ {
		if !pubConfirm(t, pub, "", q, false, amqp.Publishing{Body: []byte(strconv.Itoa(i))}) {
			t.Fatal("nacked")
		}
	}
	if got := drainBodies(t, ch, q); fmt.Sprint(got) != "[3 4 5]" {
		t.Fatalf("drop-head kept %q", got)
	}
	// x-message-ttl 0: nothing stays without a consumer
	q0 := c.queue(ch, amqp.Table{"x-message-ttl": int32(0)})
	if !pubConfirm(t, pub, "", q0, false, amqp.Publishing{Body: []byte("x")}) {
		t.Fatal("nacked")
	}
	if got := drainBodies(t, ch, q0); len(got) != 0 {
		t.Fatalf("ttl 0 queue kept %q", got)
	}
}

func TestPriorityQueue(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	q := c.queue(ch, amqp.Table{"x-max-priority": int32(10)})
	for i, p := range []uint8{1, 5, 0, 9, 5, 10, 200} {
		msg := amqp.Publishing{Priority: p, Body: []byte(fmt.Sprintf("p%d-%d", p, i))}
		if !pubConfirm(t, pub, "", q, false, msg) {
			t.Fatal("nacked")
		}
	}
	// highest first; priorities above x-max-priority count as the maximum;
	// FIFO within a priority
	got := drainBodies(t, ch, q)
	want := "[p10-5 p200-6 p9-3 p5-1 p5-4 p1-0 p0-2]"
	if fmt.Sprint(got) != want {
		t.Fatalf("priority order %v, want %v", got, want)
	}
}

func TestDeadLettering(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	pub := c.confirmCh(conn)
	dlx := c.exchange(ch, "fanout")
	dlq := c.queue(ch, nil)
	must(t, ch.QueueBind(dlq, "", dlx, false, nil))
	q := c.queue(ch, amqp.Table{"x-dead-letter-exchange": dlx})
	if !pubConfirm(t, pub, "", q, false, amqp.Publishing{MessageId: "dead", Body: []byte("bye")}) {
		t.Fatal("nacked")
	}
	d, ok, err := ch.Get(q, false)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	must(t, d.Reject(false))
	var dd amqp.Delivery
	eventually(t, "dead-lettered message", func() bool {
		var err error
		dd, ok, err = ch.Get(dlq, true)
		must(t, err)
		return ok
	})
	if string(dd.Body) != "bye" || dd.MessageId != "dead" {
		t.Fatalf("dead-lettered %+v", dd)
	}
	// routing key is kept; exchange is the DLX
	if dd.Exchange != dlx || dd.RoutingKey != q {
		t.Fatalf("dead-lettered via %q/%q", dd.Exchange, dd.RoutingKey)
	}
	deaths, ok := dd.Headers["x-death"].([]interface{})
	if !ok || len(deaths) != 1 {
		t.Fatalf("x-death %#v", dd.Headers["x-death"])
	}
	death, ok := deaths[0].(amqp.Table)
	if !ok {
		t.Fatalf("x-death[0] %#v", deaths[0])
	}
	if death["reason"] != "rejected" || death["queue"] != q || death["exchange"] != "" || death["count"] != int64(1) {
		t.Fatalf("x-death entry %#v", death)
	}
	if rks, ok := death["routing-keys"].([]interface{}); !ok || len(rks) != 1 || rks[0] != q {
		t.Fatalf("x-death routing-keys %#v", death["routing-keys"])
	}
	if _, ok := death["time"].(time.Time); !ok {
		t.Fatalf("x-death time %#v", death["time"])
	}
	if dd.Headers["x-first-death-reason"] != "rejected" || dd.Headers["x-first-death-queue"] != q ||
		dd.Headers["x-first-death-exchange"] != "" {
		t.Fatalf("x-first-death-* headers %#v", dd.Headers)
	}
}

func TestTenThousandInOrder(t *testing.T) {
	c := newTC(t)
	_, pch := c.connCh()
	q := c.queue(pch, nil)
	_, cch := c.connCh()
	must(t, cch.Qos(500, 0, false))
	ds, err := cch.Consume(q, "", false, false, false, false, nil)
	must(t, err)
	const n = 10000
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for i := 0; i < n; i++ {
			if err := pch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{Body: []byte(strconv.Itoa(i))}); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	timeout := time.After(30 * time.Second)
	for i := 0; i < n; i++ {
		select {
		case d, ok := <-ds:
			if !ok {
				t.Fatalf("deliveries closed at %d", i)
			}
			if !bytes.Equal(d.Body, []byte(strconv.Itoa(i))) {
				t.Fatalf("message %d out of order: got %q", i, d.Body)
			}
			if d.DeliveryTag != uint64(i+1) {
				t.Fatalf("delivery tag %d, want %d", d.DeliveryTag, i+1)
			}
			if i%100 == 99 {
				must(t, d.Ack(true))
			}
		case <-timeout:
			t.Fatalf("timed out after %d of %d messages", i, n)
		}
	}
	if err := <-errc; err != nil {
		t.Fatalf("publisher: %v", err)
	}
	waitMessageCount(t, pch, q, 0)
}
