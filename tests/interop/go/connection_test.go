package interop

import (
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// withUserinfo returns brokerURL with the credentials replaced.
func withUserinfo(t *testing.T, user, pass string) string {
	t.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, pass)
	return u.String()
}

// withVhost returns brokerURL with the vhost path replaced.
func withVhost(t *testing.T, vhost string) string {
	t.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + url.PathEscape(vhost)
	u.RawPath = ""
	return u.String()
}

func TestDialPlain(t *testing.T) {
	c := newTC(t)
	conn := c.connCfg(amqp.Config{SASL: []amqp.Authentication{&amqp.PlainAuth{Username: "guest", Password: "guest"}}})
	if conn.IsClosed() {
		t.Fatal("connection closed right after dial")
	}
	if got := conn.Config.SASL[0].Mechanism(); got != "PLAIN" {
		t.Fatalf("mechanism %q, want PLAIN", got)
	}
	if conn.Major != 0 || conn.Minor != 9 {
		t.Fatalf("connection.start version %d-%d, want 0-9", conn.Major, conn.Minor)
	}
	if conn.Config.Vhost != "/" {
		t.Fatalf("vhost %q, want /", conn.Config.Vhost)
	}
	if len(conn.Locales) == 0 || conn.Locales[0] != "en_US" {
		t.Fatalf("locales %v, want en_US", conn.Locales)
	}
	ch := c.ch(conn)
	if err := ch.Close(); err != nil {
		t.Fatalf("channel close: %v", err)
	}
	if err := conn.Close(); err != nil {
		t.Fatalf("connection close: %v", err)
	}
	if !conn.IsClosed() {
		t.Fatal("connection not closed after Close")
	}
}

func TestDialAMQPLAIN(t *testing.T) {
	c := newTC(t)
	conn := c.connCfg(amqp.Config{SASL: []amqp.Authentication{&amqp.AMQPlainAuth{Username: "guest", Password: "guest"}}})
	if got := conn.Config.SASL[0].Mechanism(); got != "AMQPLAIN" {
		t.Fatalf("mechanism %q, want AMQPLAIN", got)
	}
	ch := c.ch(conn)
	q := c.queue(ch, nil)
	if st := inspect(t, ch, q); st.Messages != 0 {
		t.Fatalf("fresh queue has %d messages", st.Messages)
	}
}

func TestDialWrongPassword(t *testing.T) {
	c := newTC(t)
	conn, err := c.dialURL(withUserinfo(t, "guest", "definitely-wrong"), amqp.Config{})
	if err == nil {
		conn.Close()
		t.Fatal("dial with a wrong password succeeded")
	}
	// amqp091-go does not advertise authentication_failure_close, so RabbitMQ
	// just drops the socket and the client reports ErrCredentials (403).
	e := expectCode(t, err, amqp.AccessRefused, "dial with wrong password")
	t.Logf("wrong password: %v (server=%v)", e, e.Server)
}

func TestDialUnknownUser(t *testing.T) {
	c := newTC(t)
	conn, err := c.dialURL(withUserinfo(t, "no-such-user-"+c.name("u"), "x"), amqp.Config{})
	if err == nil {
		conn.Close()
		t.Fatal("dial with an unknown user succeeded")
	}
	expectCode(t, err, amqp.AccessRefused, "dial with unknown user")
}

func TestDialUnknownVhost(t *testing.T) {
	c := newTC(t)
	vhost := c.name("vhost")
	conn, err := c.dialURL(withVhost(t, vhost), amqp.Config{})
	if err == nil {
		conn.Close()
		t.Fatal("dial to an unknown vhost succeeded")
	}
	e := expectCode(t, err, amqp.NotAllowed, "dial unknown vhost")
	if !e.Server {
		t.Fatalf("expected the 530 to come from the server, got %#v", e)
	}
	// RabbitMQ: "NOT_ALLOWED - vhost <name> not found"
	if want := "NOT_ALLOWED - vhost " + vhost + " not found"; e.Reason != want {
		t.Fatalf("reason %q, want %q", e.Reason, want)
	}
}

func TestServerProperties(t *testing.T) {
	c := newTC(t)
	conn := c.conn()
	p := conn.Properties
	for _, k := range []string{"product", "version", "platform", "copyright", "information", "cluster_name"} {
		v, ok := p[k]
		if !ok {
			t.Errorf("server property %q missing (have %v)", k, keys(p))
			continue
		}
		s, ok := v.(string)
		if !ok || s == "" {
			t.Errorf("server property %q = %#v, want a non-empty longstr", k, v)
		}
	}
	caps, ok := p["capabilities"].(amqp.Table)
	if !ok {
		t.Fatalf("capabilities missing or not a table: %#v", p["capabilities"])
	}
	for _, k := range []string{
		"publisher_confirms", "exchange_exchange_bindings", "basic.nack",
		"consumer_cancel_notify", "connection.blocked", "consumer_priorities",
		"authentication_failure_close", "per_consumer_qos", "direct_reply_to",
	} {
		v, ok := caps[k]
		if !ok {
			t.Errorf("capability %q missing (have %v)", k, keys(caps))
			continue
		}
		if b, ok := v.(bool); !ok || !b {
			t.Errorf("capability %q = %#v, want true", k, v)
		}
	}
	if conn.Locales[0] != "en_US" {
		t.Errorf("locales %v", conn.Locales)
	}
}

func keys(t amqp.Table) []string {
	out := make([]string, 0, len(t))
	for k := range t {
		out = append(out, k)
	}
	return out
}

func TestTuneNegotiation(t *testing.T) {
	c := newTC(t)
	conn := c.connCfg(amqp.Config{Heartbeat: 5 * time.Second, ChannelMax: 10, FrameSize: 8192})
	if conn.Config.Heartbeat != 5*time.Second {
		t.Errorf("heartbeat %v, want 5s", conn.Config.Heartbeat)
	}
	if conn.Config.ChannelMax != 10 {
		t.Errorf("channel max %d, want 10", conn.Config.ChannelMax)
	}
	if conn.Config.FrameSize != 8192 {
		t.Errorf("frame size %d, want 8192", conn.Config.FrameSize)
	}
	// The negotiated limits must work in practice: 10 channels, and a body
	// much larger than the frame size (split into many body frames).
	var chans []*amqp.Channel
	for i := 0; i < 10; i++ {
		chans = append(chans, c.ch(conn))
	}
	if _, err := conn.Channel(); err == nil { // refused by the client's allocator
		t.Errorf("11th channel opened with channel_max=10")
	}
	ch := chans[9]
	q := c.queue(ch, nil)
	body := make([]byte, 100_000)
	for i := range body {
		body[i] = byte(i * 7)
	}
	publishMsg(t, ch, "", q, amqp.Publishing{Body: body})
	ds, err := ch.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := recv(t, ds)
	if string(d.Body) != string(body) {
		t.Fatalf("body mismatch through frame_max 8192 (len %d)", len(d.Body))
	}
}

func TestTuneServerDefaults(t *testing.T) {
	c := newTC(t)
	// Heartbeat below 1s means "use the server's"; ChannelMax/FrameSize 0
	// means "no client preference" (the library then picks its defaults
	// where the server proposes none).
	conn := c.connCfg(amqp.Config{Heartbeat: 500 * time.Millisecond, FrameSize: -1})
	// RabbitMQ 3.10 defaults: heartbeat 60s, frame_max 131072, channel_max 2047.
	if conn.Config.Heartbeat != 60*time.Second {
		t.Errorf("server heartbeat %v, want 60s", conn.Config.Heartbeat)
	}
	if conn.Config.FrameSize != 131072 {
		t.Errorf("server frame_max %d, want 131072", conn.Config.FrameSize)
	}
	if conn.Config.ChannelMax != 2047 {
		t.Errorf("server channel_max %d, want 2047", conn.Config.ChannelMax)
	}
}

func TestHeartbeatsKeepConnectionAlive(t *testing.T) {
	c := newTC(t)
	conn := c.connCfg(amqp.Config{Heartbeat: time.Second})
	if conn.Config.Heartbeat != time.Second {
		t.Fatalf("heartbeat %v, want 1s", conn.Config.Heartbeat)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	// Stay idle for several heartbeat intervals; the connection must survive
	// (the server must both send and accept heartbeats).
	select {
	case e := <-closed:
		t.Fatalf("connection closed while idle with 1s heartbeats: %v", e)
	case <-time.After(3500 * time.Millisecond):
	}
	ch := c.ch(conn)
	q := c.queue(ch, nil)
	publish(t, ch, "", q, "still alive")
	eventually(t, "message enqueued", func() bool { return inspect(t, ch, q).Messages == 1 })
}

func TestNotifyBlockedRegistration(t *testing.T) {
	c := newTC(t)
	conn := c.conn()
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	ch := c.ch(conn)
	q := c.queue(ch, nil)
	publish(t, ch, "", q, "x")
	eventually(t, "message enqueued", func() bool { return inspect(t, ch, q).Messages == 1 })
	// No assertion that it fires (the broker is not under memory pressure);
	// just drain anything that may have been queued.
	select {
	case b := <-blocked:
		t.Logf("connection.blocked notification: %+v", b)
	default:
	}
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	// The library closes the listener channel on shutdown.
	select {
	case _, ok := <-blocked:
		if ok {
			// a late notification; the next read must see the close
			<-blocked
		}
	case <-time.After(waitTimeout):
		t.Fatal("blocked listener not closed after connection close")
	}
}

func TestClientPropertiesAccepted(t *testing.T) {
	c := newTC(t)
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("go-interop-" + c.name("conn"))
	props["custom-int"] = int32(7)
	props["custom-table"] = amqp.Table{"nested": "yes"}
	conn := c.connCfg(amqp.Config{Properties: props})
	ch := c.ch(conn)
	c.queue(ch, nil)
}

func TestConnectionCloseIsClean(t *testing.T) {
	c := newTC(t)
	conn := c.conn()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch := c.ch(conn)
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}
	// A client-initiated close delivers no error: the listeners are just closed.
	for _, n := range []chan *amqp.Error{closed, chClosed} {
		select {
		case e, ok := <-n:
			if ok {
				t.Fatalf("unexpected close error after clean close: %v", e)
			}
		case <-time.After(waitTimeout):
			t.Fatal("close listener not closed")
		}
	}
	if _, err := conn.Channel(); err == nil {
		t.Fatal("Channel() on closed connection succeeded")
	} else if !strings.Contains(err.Error(), "closed") {
		t.Logf("Channel() on closed connection: %v", err)
	}
}
