package interop

// Access control, queue types, policies and the consistent-hash exchange, set up through the
// management HTTP API (net/http) and checked with amqp091-go. Written against RabbitMQ 3.10.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// api calls the management API as guest; body is JSON-encoded when not nil. It returns the
// status and the decoded JSON answer (nil when empty).
func api(t *testing.T, method, path string, body any) (int, any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, mgmtURL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("guest", "guest")
	req.Header.Set("content-type", "application/json")
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out any
	if len(bytes.TrimSpace(raw)) > 0 {
		_ = json.Unmarshal(raw, &out)
	}
	return resp.StatusCode, out
}

// mustAPI calls the API and fails unless the status is one of ok.
func mustAPI(t *testing.T, method, path string, body any, ok ...int) {
	t.Helper()
	st, out := api(t, method, path, body)
	for _, s := range ok {
		if st == s {
			return
		}
	}
	t.Fatalf("%s %s: status %d (%v), want one of %v", method, path, st, out, ok)
}

func esc(s string) string { return url.PathEscape(s) }

// tenant creates a user with permissions configure ^cfg, write ^w, read ^r on a fresh vhost;
// both are deleted at the end of the test.
func tenant(t *testing.T, c *tc) (user, vhost, amqpURL string) {
	t.Helper()
	user, vhost = c.name("user"), c.name("vhost")
	mustAPI(t, "PUT", "/api/users/"+esc(user), map[string]any{"password": "s3cret", "tags": ""}, 201, 204)
	t.Cleanup(func() { api(t, "DELETE", "/api/users/"+esc(user), nil) })
	mustAPI(t, "PUT", "/api/vhosts/"+esc(vhost), nil, 201, 204)
	t.Cleanup(func() { api(t, "DELETE", "/api/vhosts/"+esc(vhost), nil) })
	mustAPI(t, "PUT", "/api/permissions/"+esc(vhost)+"/"+esc(user),
		map[string]any{"configure": "^cfg", "write": "^w", "read": "^r"}, 201, 204)
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, "s3cret")
	u.Path = "/" + vhost
	u.RawPath = "/" + url.PathEscape(vhost)
	return user, vhost, u.String()
}

func TestAccessRefusedTexts(t *testing.T) {
	c := newTC(t)
	user, vhost, tenantURL := tenant(t, c)
	// guest (full permissions on a vhost it creates through the API) makes the objects.
	admin, err := c.dialURL(withVhost(t, vhost), amqp.Config{})
	if err != nil {
		t.Fatalf("dial as guest: %v", err)
	}
	defer admin.Close()
	ach, err := admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ach.QueueDeclare("cfgq", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	refused := func(kind, name string) string {
		return fmt.Sprintf("ACCESS_REFUSED - access to %s '%s' in vhost '%s' refused for user '%s'", kind, name, vhost, user)
	}
	conn, err := c.dialURL(tenantURL, amqp.Config{})
	if err != nil {
		t.Fatalf("dial as %s: %v", user, err)
	}
	defer conn.Close()
	cases := []struct {
		what, kind, name string
		op               func(ch *amqp.Channel) error
	}{
		{"queue.declare", "queue", "zz", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare("zz", false, false, false, false, nil)
			return err
		}},
		{"queue.bind", "queue", "cfgq", func(ch *amqp.Channel) error {
			return ch.QueueBind("cfgq", "k", "amq.direct", false, nil)
		}},
		{"basic.get", "queue", "cfgq", func(ch *amqp.Channel) error {
			_, _, err := ch.Get("cfgq", false)
			return err
		}},
		{"basic.consume", "queue", "cfgq", func(ch *amqp.Channel) error {
			_, err := ch.Consume("cfgq", "", false, false, false, false, nil)
			return err
		}},
		{"exchange.declare", "exchange", "zzx", func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare("zzx", "direct", false, false, false, false, nil)
		}},
		{"basic.publish", "exchange", "amq.default", func(ch *amqp.Channel) error {
			// Refused asynchronously: the channel is closed, the next call reports it.
			closed := ch.NotifyClose(make(chan *amqp.Error, 1))
			if err := ch.PublishWithContext(context.Background(), "", "cfgq", false, false, amqp.Publishing{Body: []byte("m")}); err != nil {
				return err
			}
			return waitErr(t, closed, "channel close after a refused publish")
		}},
	}
	for _, tt := range cases {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatalf("%s: open channel: %v", tt.what, err)
		}
		e := expectCode(t, tt.op(ch), amqp.AccessRefused, tt.what)
		if want := refused(tt.kind, tt.name); e.Reason != want {
			t.Errorf("%s: reason %q, want %q", tt.what, e.Reason, want)
		}
	}
	// Allowed by the patterns: configure ^cfg.
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("cfg-own", false, false, false, false, nil); err != nil {
		t.Fatalf("declare a queue the user may configure: %v", err)
	}
	// A vhost without a permission entry: 530 at connection.open.
	other := c.name("vhost")
	mustAPI(t, "PUT", "/api/vhosts/"+esc(other), nil, 201, 204)
	defer api(t, "DELETE", "/api/vhosts/"+esc(other), nil)
	u, _ := url.Parse(tenantURL)
	u.Path, u.RawPath = "/"+other, "/"+url.PathEscape(other)
	_, err = c.dialURL(u.String(), amqp.Config{})
	e := expectCode(t, err, amqp.NotAllowed, "connection.open to a vhost without permissions")
	if want := fmt.Sprintf("NOT_ALLOWED - access to vhost '%s' refused for user '%s'", other, user); e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}

func TestQueueTypeValidation(t *testing.T) {
	c := newTC(t)
	conn := c.conn()
	cases := []struct {
		what                           string
		durable, exclusive, autoDelete bool
		qtype                          any
		text                           string
	}{
		{"quorum non-durable", false, false, false, "quorum", "invalid property 'non-durable' for queue '%s' in vhost '/'"},
		{"quorum exclusive", true, true, false, "quorum", "invalid property 'exclusive-owner' for queue '%s' in vhost '/'"},
		{"quorum auto-delete", true, false, true, "quorum", "invalid property 'auto-delete' for queue '%s' in vhost '/'"},
		{"stream non-durable", false, false, false, "stream", "invalid property 'non-durable' for queue '%s' in vhost '/'"},
		{"unknown type", true, false, false, "foo", "invalid arg 'x-queue-type' for queue '%s' in vhost '/': \"unsupported queue type 'foo'\""},
		{"not a string", true, false, false, int32(5), "invalid arg 'x-queue-type' for queue '%s' in vhost '/': {unacceptable_type,signedint}"},
	}
	for _, tt := range cases {
		ch := c.ch(conn)
		name := c.name("qt")
		c.trackQueue(name)
		_, err := ch.QueueDeclare(name, tt.durable, tt.autoDelete, tt.exclusive, false, amqp.Table{"x-queue-type": tt.qtype})
		e := expectCode(t, err, amqp.PreconditionFailed, tt.what)
		if want := "PRECONDITION_FAILED - " + fmt.Sprintf(tt.text, name); e.Reason != want {
			t.Errorf("%s: reason %q, want %q", tt.what, e.Reason, want)
		}
	}
	// quorum, durable: accepted, and a redeclare with the same arguments is equivalent.
	ch := c.ch(conn)
	name := c.name("quorum")
	c.trackQueue(name)
	for i := 0; i < 2; i++ {
		if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatalf("declare quorum queue: %v", err)
		}
	}
	publish(t, ch, "", name, "hello")
	waitMessageCount(t, ch, name, 1)
}

// A policy's message-ttl applies to matching queues (existing ones too); expired messages are
// dead-lettered to the policy's dead-letter settings with reason "expired".
func TestPolicyMessageTTL(t *testing.T) {
	c := newTC(t)
	conn, ch := c.connCh()
	prefix := c.name("ttlpol")
	target := prefix + "-q"
	c.trackQueue(target)
	if _, err := ch.QueueDeclare(target, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	dlq := c.queue(ch, nil)
	unmatched := c.queue(ch, nil)
	mustAPI(t, "PUT", "/api/policies/%2F/"+esc(prefix), map[string]any{
		"pattern": "^" + prefix, "apply-to": "queues", "priority": 1,
		"definition": map[string]any{"message-ttl": 0, "dead-letter-exchange": "", "dead-letter-routing-key": dlq},
	}, 201, 204)
	defer api(t, "DELETE", "/api/policies/%2F/"+esc(prefix), nil)
	// RabbitMQ applies a policy asynchronously: publish until one comes out dead-lettered.
	eventually(t, "a message expired by the policy's TTL", func() bool {
		publish(t, ch, "", target, "m")
		return inspect(t, ch, dlq).Messages > 0
	})
	d, ok, err := ch.Get(dlq, true)
	if err != nil || !ok {
		t.Fatalf("get from the dead-letter queue: ok=%v err=%v", ok, err)
	}
	deaths, _ := d.Headers["x-death"].([]any)
	if len(deaths) == 0 {
		t.Fatalf("no x-death header: %v", d.Headers)
	}
	death, _ := deaths[0].(amqp.Table)
	if death["reason"] != "expired" || death["queue"] != target {
		t.Errorf("x-death %v, want reason expired from queue %s", death, target)
	}
	// A queue the pattern does not match keeps its messages.
	publish(t, ch, "", unmatched, "kept")
	waitMessageCount(t, ch, unmatched, 1)
	_ = conn
}

// chx declares a consistent-hash exchange, skipping on a RabbitMQ without the plugin.
func (c *tc) chx(conn *amqp.Connection, args amqp.Table) string {
	c.t.Helper()
	ch := c.ch(conn)
	name := c.name("chx")
	c.trackExchange(name)
	err := ch.ExchangeDeclare(name, "x-consistent-hash", false, false, false, false, args)
	if e := amqpErr(err); e != nil && e.Code == amqp.CommandInvalid && strings.Contains(e.Reason, "unknown exchange type") {
		c.t.Skip("RabbitMQ without rabbitmq_consistent_hash_exchange enabled")
	}
	if err != nil {
		c.t.Fatalf("declare x-consistent-hash: %v", err)
	}
	return name
}

func TestConsistentHashExchange(t *testing.T) {
	const n = 3000
	c := newTC(t)
	conn := c.conn()
	x := c.chx(conn, nil)
	ch := c.confirmCh(conn)
	weights := []int{1, 2, 3}
	var queues []string
	for _, w := range weights {
		q := c.queue(ch, nil)
		if err := ch.QueueBind(q, strconv.Itoa(w), x, false, nil); err != nil {
			t.Fatalf("bind with weight %d: %v", w, err)
		}
		queues = append(queues, q)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var confirms []*amqp.DeferredConfirmation
	for i := 0; i < n; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, x, fmt.Sprintf("order-%d", i), false, false,
			amqp.Publishing{Body: []byte(strconv.Itoa(i))})
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		if ack, err := dc.WaitContext(ctx); err != nil || !ack {
			t.Fatalf("confirm: ack=%v err=%v", ack, err)
		}
	}
	seen := make(map[string]int)
	total := 0
	for _, w := range weights {
		total += w
	}
	for qi, q := range queues {
		bodies := drainBodies(t, ch, q)
		for _, b := range bodies {
			if prev, dup := seen[b]; dup {
				t.Fatalf("message %s in queues %d and %d", b, prev, qi)
			}
			seen[b] = qi
		}
		share := float64(len(bodies)) / n
		want := float64(weights[qi]) / float64(total)
		// About 6 standard deviations at n.
		if share < want-0.04 || share > want+0.04 {
			t.Errorf("queue %d (weight %d): share %.3f, want %.3f", qi, weights[qi], share, want)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d of %d messages routed", len(seen), n)
	}

	// Binding keys are weights: a non-integer or non-positive one is refused.
	for key, text := range map[string]string{
		"abc": `PRECONDITION_FAILED - The binding key must be an integer: <<"abc">>`,
		"0":   "PRECONDITION_FAILED - The binding key must be greater than 0",
	} {
		bch := c.ch(conn)
		err := bch.QueueBind(queues[0], key, x, false, nil)
		e := expectCode(t, err, amqp.PreconditionFailed, "bind with key "+key)
		if e.Reason != text {
			t.Errorf("bind %q: reason %q, want %q", key, e.Reason, text)
		}
	}
}

func TestConsistentHashOnHeader(t *testing.T) {
	c := newTC(t)
	conn := c.conn()
	x := c.chx(conn, amqp.Table{"hash-header": "tenant"})
	ch := c.confirmCh(conn)
	var queues []string
	for i := 0; i < 3; i++ {
		q := c.queue(ch, nil)
		if err := ch.QueueBind(q, "10", x, false, nil); err != nil {
			t.Fatal(err)
		}
		queues = append(queues, q)
	}
	// One header value, many routing keys: one queue gets them all.
	for i := 0; i < 50; i++ {
		routed(t, ch, x, fmt.Sprintf("k%d", i), amqp.Table{"tenant": "acme"})
	}
	full := 0
	for _, q := range queues {
		switch got := len(drainBodies(t, ch, q)); got {
		case 0:
		case 50:
			full++
		default:
			t.Errorf("queue %s got %d of one tenant's 50 messages", q, got)
		}
	}
	if full != 1 {
		t.Errorf("%d queues got the tenant's messages, want 1", full)
	}
	// Mutually exclusive arguments: 406.
	bch := c.ch(conn)
	err := bch.ExchangeDeclare(c.name("chx"), "x-consistent-hash", false, true, false, false,
		amqp.Table{"hash-header": "h", "hash-property": "message_id"})
	e := expectCode(t, err, amqp.PreconditionFailed, "hash-header with hash-property")
	if want := "PRECONDITION_FAILED - hash-header and hash-property are mutually exclusive"; e.Reason != want {
		t.Errorf("reason %q, want %q", e.Reason, want)
	}
}
