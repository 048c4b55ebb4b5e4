// Package interop is an AMQP 0-9-1 compatibility suite for Warren, written
// against RabbitMQ 3.10 (the reference) with the rabbitmq/amqp091-go client.
//
// Broker selection:
//   - WARREN_BIN set: start `$WARREN_BIN server --amqp-port P --http-port H
//     --data-dir TMPDIR` on free loopback ports and test against it.
//   - WARREN_BIN and WARREN_CLUSTER=1 (cluster mode): start a 3-node cluster with
//     queue_master_locator = "min-masters" and ballast queues on node 2, and test through
//     node 2, every non-exclusive queue living on node 1 or 3 (cluster_mode_test.go).
//   - otherwise: AMQP_URL (default amqp://guest:guest@127.0.0.1:5673/).
package interop

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const defaultURL = "amqp://guest:guest@127.0.0.1:5673/"

// brokerURL is the URL of the broker under test (set in TestMain).
var brokerURL string

// brokerAddr is host:port of brokerURL.
var brokerAddr string

// mgmtURL is the management HTTP API of the broker under test (guest/guest): the started
// Warren's, or MGMT_URL (default: the reference RabbitMQ's, http://127.0.0.1:15673).
var mgmtURL = "http://127.0.0.1:15673"

// Per-test watchdog: a test still running after this long has its
// connections torn down (which unblocks any pending RPC) and is failed.
const testDeadline = 30 * time.Second

// Default bound for waiting on a single asynchronous event.
const waitTimeout = 10 * time.Second

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if clusterModeOn() && os.Getenv("WARREN_BIN") == "" {
		fmt.Fprintln(os.Stderr, "interop: WARREN_CLUSTER=1 (cluster mode) starts a Warren cluster: set WARREN_BIN too")
		return 2
	}
	if clusterModeOn() {
		cl, err := startSessionCluster()
		if err != nil {
			fmt.Fprintln(os.Stderr, "interop: cannot start the cluster of cluster mode:", err)
			return 1
		}
		sessionCluster = cl
		node := cl.nodes[sessionNode]
		brokerURL = node.url()
		mgmtURL = fmt.Sprintf("http://127.0.0.1:%d", node.httpPort)
		fmt.Fprintf(os.Stderr, "interop: cluster mode: through %s (AMQP %d, HTTP %d) of %v\n",
			node.name, node.amqpPort, node.httpPort, cl.names())
		defer func() {
			if failed {
				for _, n := range cl.nodes {
					fmt.Fprintf(os.Stderr, "--- %s (AMQP %d, HTTP %d, link %d) log tail ---\n%s\n", n.name,
						n.amqpPort, n.httpPort, n.linkPort, tail(n.logText(), 4000))
				}
			}
			cl.stop()
		}()
	} else if bin := os.Getenv("WARREN_BIN"); bin != "" {
		w, err := startWarren(bin)
		if err != nil {
			fmt.Fprintln(os.Stderr, "interop: cannot start warren:", err)
			return 1
		}
		defer w.stop()
		brokerURL = fmt.Sprintf("amqp://guest:guest@%s/", w.addr)
		mgmtURL = fmt.Sprintf("http://127.0.0.1:%d", w.httpPort)
		streamPort = w.streamPort
	} else if u := os.Getenv("AMQP_URL"); u != "" {
		brokerURL = u
	} else {
		brokerURL = defaultURL
	}
	if m := os.Getenv("MGMT_URL"); m != "" && os.Getenv("WARREN_BIN") == "" {
		mgmtURL = m
	}
	u, err := url.Parse(brokerURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "interop: bad broker URL:", err)
		return 1
	}
	brokerAddr = u.Host
	if u.Port() == "" {
		brokerAddr = net.JoinHostPort(u.Hostname(), "5672")
	}
	rc := m.Run()
	failed = rc != 0
	return rc
}

// failed: the run had a failure (cluster mode then prints the nodes' log tails).
var failed bool

// handedOut holds every port freePort returned: a port is free until the broker that was given
// it binds it, so two picks for one cluster (nine ports, started together) must never be equal.
var (
	handedOutMu sync.Mutex
	handedOut   = map[int]bool{}
)

// freePort picks a free loopback port below the kernel's ephemeral range, never the same one
// twice in a run: a port from Listen(":0") is an ephemeral one, which a client socket can take
// as its source port before the broker binds it, and which a connect loop can connect to itself
// on.
func freePort() (int, error) {
	handedOutMu.Lock()
	defer handedOutMu.Unlock()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	for i := 0; low > 11000 && i < 1000; i++ {
		port := 10000 + mrand.Intn(low-10000)
		if handedOut[port] {
			continue
		}
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			l.Close()
			handedOut[port] = true
			return port, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lockedBuffer collects the broker's stderr safely from the exec goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// warren is a broker process the suite started.
type warren struct {
	stop     func()
	addr     string // plain AMQP, 127.0.0.1:port
	httpPort int
	// The stream protocol's port.
	streamPort int
	stderr     *lockedBuffer
}

// startWarren starts `bin server` on free loopback ports with its own data directory, extra
// arguments appended (e.g. --config FILE), and waits until its plain AMQP port accepts.
func startWarren(bin string, extra ...string) (*warren, error) {
	amqpPort, err := freePort()
	if err != nil {
		return nil, err
	}
	httpPort, err := freePort()
	for err == nil && httpPort == amqpPort {
		httpPort, err = freePort()
	}
	if err != nil {
		return nil, err
	}
	streamPort, err := freePort()
	if err != nil {
		return nil, err
	}
	dataDir, err := os.MkdirTemp("", "warren-interop-go-")
	if err != nil {
		return nil, err
	}
	args := append([]string{"server",
		"--amqp-port", fmt.Sprint(amqpPort),
		"--http-port", fmt.Sprint(httpPort),
		"--stream-port", fmt.Sprint(streamPort),
		"--data-dir", dataDir}, extra...)
	cmd := exec.Command(bin, args...)
	stderr := &lockedBuffer{}
	cmd.Stdout = os.Stdout
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dataDir)
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if s := stderr.String(); s != "" && os.Getenv("WARREN_LOG") != "" {
			fmt.Fprintln(os.Stderr, "--- warren stderr ---\n"+s)
		}
		os.RemoveAll(dataDir)
	}

	addr := fmt.Sprintf("127.0.0.1:%d", amqpPort)
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case werr := <-exited:
			os.RemoveAll(dataDir)
			return nil, fmt.Errorf("warren exited early (%v); stderr:\n%s", werr, stderr.String())
		default:
		}
		c, derr := net.DialTimeout("tcp", addr, time.Second)
		if derr == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("warren did not accept TCP on %s within 30s; stderr:\n%s", addr, stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return &warren{stop: stop, addr: addr, httpPort: httpPort, streamPort: streamPort, stderr: stderr}, nil
}

// ---------------------------------------------------------------------------
// Per-test harness

// tc is the per-test context: it tracks connections (closing them at the end
// or when the watchdog fires) and names of queues/exchanges to delete.
type tc struct {
	t *testing.T

	mu        sync.Mutex
	done      bool
	netConns  []net.Conn
	conns     []*amqp.Connection
	queues    []string
	exchanges []string
	timer     *time.Timer
}

func newTC(t *testing.T) *tc {
	t.Helper()
	c := &tc{t: t}
	c.timer = time.AfterFunc(testDeadline, c.watchdog)
	t.Cleanup(c.cleanup)
	return c
}

func (c *tc) watchdog() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return
	}
	c.t.Errorf("watchdog: test still running after %v; tearing down its connections", testDeadline)
	for _, nc := range c.netConns {
		nc.Close()
	}
}

func (c *tc) cleanup() {
	c.timer.Stop()
	c.mu.Lock()
	c.done = true
	conns := c.conns
	queues := c.queues
	exchanges := c.exchanges
	c.mu.Unlock()

	finished := make(chan struct{})
	go func() {
		defer close(finished)
		if len(queues)+len(exchanges) > 0 {
			// Use a fresh connection: the test's channels may be closed.
			if conn, err := c.dialRaw(amqp.Config{}); err == nil {
				if ch, err := conn.Channel(); err == nil {
					for _, q := range queues {
						if ch.IsClosed() {
							break
						}
						_, _ = ch.QueueDelete(q, false, false, false)
					}
					for _, x := range exchanges {
						if ch.IsClosed() {
							break
						}
						_ = ch.ExchangeDelete(x, false, false)
					}
				}
				_ = conn.CloseDeadline(time.Now().Add(5 * time.Second))
			}
		}
		for _, conn := range conns {
			if !conn.IsClosed() {
				_ = conn.CloseDeadline(time.Now().Add(5 * time.Second))
			}
		}
	}()
	select {
	case <-finished:
	case <-time.After(20 * time.Second):
		c.t.Logf("cleanup did not finish within 20s; dropping connections")
	}
	// Whatever is left (including a stuck cleanup) is cut off at TCP level.
	c.mu.Lock()
	for _, nc := range c.netConns {
		nc.Close()
	}
	c.mu.Unlock()
}

// dialer returns a Config.Dial that records the raw TCP connection so the
// watchdog can break it.
func (c *tc) dialer() func(network, addr string) (net.Conn, error) {
	return func(network, addr string) (net.Conn, error) {
		nc, err := net.DialTimeout(network, addr, 10*time.Second)
		if err != nil {
			return nil, err
		}
		// Handshake deadline; amqp091-go clears it after connection.open-ok.
		_ = nc.SetDeadline(time.Now().Add(15 * time.Second))
		c.mu.Lock()
		c.netConns = append(c.netConns, nc)
		c.mu.Unlock()
		return nc, nil
	}
}

// dialRaw dials brokerURL with cfg, without registering the connection for
// cleanup (the caller owns it).
func (c *tc) dialRaw(cfg amqp.Config) (*amqp.Connection, error) {
	return c.dialURL(brokerURL, cfg)
}

func (c *tc) dialURL(u string, cfg amqp.Config) (*amqp.Connection, error) {
	if cfg.Dial == nil {
		cfg.Dial = c.dialer()
	}
	return amqp.DialConfig(u, cfg)
}

// connCfg dials with cfg and registers the connection for cleanup.
func (c *tc) connCfg(cfg amqp.Config) *amqp.Connection {
	c.t.Helper()
	conn, err := c.dialRaw(cfg)
	if err != nil {
		c.t.Fatalf("dial %s: %v", brokerURL, err)
	}
	c.mu.Lock()
	c.conns = append(c.conns, conn)
	c.mu.Unlock()
	return conn
}

func (c *tc) conn() *amqp.Connection {
	c.t.Helper()
	return c.connCfg(amqp.Config{})
}

// ch opens a channel on conn.
func (c *tc) ch(conn *amqp.Connection) *amqp.Channel {
	c.t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		c.t.Fatalf("open channel: %v", err)
	}
	return ch
}

// connCh opens a new connection and one channel on it.
func (c *tc) connCh() (*amqp.Connection, *amqp.Channel) {
	c.t.Helper()
	conn := c.conn()
	return conn, c.ch(conn)
}

// name returns a unique name with the given prefix.
func (c *tc) name(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("go-interop-%s-%s", prefix, hex.EncodeToString(b[:]))
}

// trackQueue registers q for deletion at the end of the test.
func (c *tc) trackQueue(q string) {
	c.mu.Lock()
	c.queues = append(c.queues, q)
	c.mu.Unlock()
}

// trackExchange registers x for deletion at the end of the test.
func (c *tc) trackExchange(x string) {
	c.mu.Lock()
	c.exchanges = append(c.exchanges, x)
	c.mu.Unlock()
}

// queue declares a fresh non-durable queue (deleted at the end of the test).
func (c *tc) queue(ch *amqp.Channel, args amqp.Table) string {
	c.t.Helper()
	name := c.name("q")
	c.trackQueue(name)
	if _, err := ch.QueueDeclare(name, false, false, false, false, args); err != nil {
		c.t.Fatalf("queue.declare %s: %v", name, err)
	}
	return name
}

// exchange declares a fresh non-durable exchange of the given kind.
func (c *tc) exchange(ch *amqp.Channel, kind string) string {
	c.t.Helper()
	name := c.name("x-" + kind)
	c.trackExchange(name)
	if err := ch.ExchangeDeclare(name, kind, false, false, false, false, nil); err != nil {
		c.t.Fatalf("exchange.declare %s (%s): %v", name, kind, err)
	}
	return name
}

// ---------------------------------------------------------------------------
// Assertion helpers

// amqpErr extracts the *amqp.Error from err (nil if there is none).
func amqpErr(err error) *amqp.Error {
	var e *amqp.Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// expectCode asserts that err carries an AMQP error with the given reply code.
func expectCode(t *testing.T, err error, code int, what string) *amqp.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: expected AMQP error %d, got success", what, code)
	}
	e := amqpErr(err)
	if e == nil {
		t.Fatalf("%s: expected AMQP error %d, got non-AMQP error %T: %v", what, code, err, err)
	}
	if e.Code != code {
		t.Fatalf("%s: expected reply code %d, got %d (%s)", what, code, e.Code, e.Reason)
	}
	return e
}

// recv waits (bounded) for one delivery.
func recv(t *testing.T, ds <-chan amqp.Delivery) amqp.Delivery {
	t.Helper()
	select {
	case d, ok := <-ds:
		if !ok {
			t.Fatalf("delivery channel closed while waiting for a delivery")
		}
		return d
	case <-time.After(waitTimeout):
		t.Fatalf("timed out after %v waiting for a delivery", waitTimeout)
	}
	panic("unreachable")
}

// recvN waits (bounded) for n deliveries.
func recvN(t *testing.T, ds <-chan amqp.Delivery, n int) []amqp.Delivery {
	t.Helper()
	out := make([]amqp.Delivery, 0, n)
	timeout := time.NewTimer(20 * time.Second)
	defer timeout.Stop()
	for len(out) < n {
		select {
		case d, ok := <-ds:
			if !ok {
				t.Fatalf("delivery channel closed after %d of %d deliveries", len(out), n)
			}
			out = append(out, d)
		case <-timeout.C:
			t.Fatalf("timed out with %d of %d deliveries", len(out), n)
		}
	}
	return out
}

// expectNoDelivery asserts that nothing arrives within d (used only to check
// that the broker holds back deliveries, never to measure speed).
func expectNoDelivery(t *testing.T, ds <-chan amqp.Delivery, d time.Duration) {
	t.Helper()
	select {
	case m, ok := <-ds:
		if ok {
			t.Fatalf("unexpected delivery: tag=%d body=%q", m.DeliveryTag, m.Body)
		}
	case <-time.After(d):
	}
}

// waitErr waits (bounded) for a close notification.
func waitErr(t *testing.T, c <-chan *amqp.Error, what string) *amqp.Error {
	t.Helper()
	select {
	case e, ok := <-c:
		if !ok {
			t.Fatalf("%s: notify channel closed without an error", what)
		}
		return e
	case <-time.After(waitTimeout):
		t.Fatalf("%s: timed out waiting for close notification", what)
	}
	return nil
}

// publish publishes a plain text message to the default exchange.
func publish(t *testing.T, ch *amqp.Channel, exchange, key string, body string) {
	t.Helper()
	publishMsg(t, ch, exchange, key, amqp.Publishing{Body: []byte(body)})
}

func publishMsg(t *testing.T, ch *amqp.Channel, exchange, key string, msg amqp.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := ch.PublishWithContext(ctx, exchange, key, false, false, msg); err != nil {
		t.Fatalf("publish to %q/%q: %v", exchange, key, err)
	}
}

// inspect returns the queue's message count via a passive declare.
func inspect(t *testing.T, ch *amqp.Channel, q string) amqp.Queue {
	t.Helper()
	st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("passive declare %s: %v", q, err)
	}
	return st
}

// eventually polls cond (bounded) until it is true.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// messageCount waits until the queue holds want ready messages (the
// broker may account for acks/requeues asynchronously).
func waitMessageCount(t *testing.T, ch *amqp.Channel, q string, want int) {
	t.Helper()
	var last int
	deadline := time.Now().Add(waitTimeout)
	for {
		st := inspect(t, ch, q)
		last = st.Messages
		if last == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue %s: message count %d, want %d", q, last, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// confirmCh opens a channel in confirm mode.
func (c *tc) confirmCh(conn *amqp.Connection) *amqp.Channel {
	c.t.Helper()
	ch := c.ch(conn)
	if err := ch.Confirm(false); err != nil {
		c.t.Fatalf("confirm.select: %v", err)
	}
	return ch
}

// pubConfirm publishes on a confirm-mode channel and waits (bounded) for the
// broker's confirm; it returns whether the broker acked (true) or nacked.
// Once a publish is confirmed the routing decision has been made, so queue
// counts can be checked right after.
func pubConfirm(t *testing.T, ch *amqp.Channel, exchange, key string, mandatory bool, msg amqp.Publishing) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, mandatory, false, msg)
	if err != nil {
		t.Fatalf("publish to %q/%q: %v", exchange, key, err)
	}
	if dc == nil {
		t.Fatalf("publish to %q/%q: channel not in confirm mode", exchange, key)
	}
	ack, err := dc.WaitContext(ctx)
	if err != nil {
		t.Fatalf("waiting for confirm of publish to %q/%q: %v", exchange, key, err)
	}
	return ack
}

// routed publishes body with confirms and returns true if it was acked.
func routed(t *testing.T, ch *amqp.Channel, exchange, key string, headers amqp.Table) {
	t.Helper()
	if !pubConfirm(t, ch, exchange, key, false, amqp.Publishing{Headers: headers, Body: []byte(key)}) {
		t.Fatalf("publish to %q/%q nacked", exchange, key)
	}
}

// drainBodies gets every ready message from q (basic.get, auto-ack) and
// returns the bodies in order.
func drainBodies(t *testing.T, ch *amqp.Channel, q string) []string {
	t.Helper()
	var out []string
	for i := 0; i < 100000; i++ {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatalf("basic.get %s: %v", q, err)
		}
		if !ok {
			return out
		}
		out = append(out, string(d.Body))
	}
	t.Fatalf("queue %s does not drain", q)
	return nil
}

func timeAfter() <-chan time.Time { return time.After(waitTimeout) }
