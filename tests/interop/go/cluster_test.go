package interop

// Clustering: three Warren nodes on loopback act as one broker, as a RabbitMQ 3.10 cluster
// does. Metadata is replicated; a queue lives on its home node (where it was declared) and is
// served through any node; a node's loss makes its queues unavailable until it is back with its
// persistent messages; without a majority a metadata change is refused, never left hanging.
//
// The reference RabbitMQ is a single node: these tests start their own nodes and run only with
// WARREN_BIN (`go test -run Cluster`). TestCluster shares one cluster among its subtests;
// TestClusterNodeLoss kills nodes in a cluster of its own. A failing test logs each node's log.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const clusterReadyTimeout = 30 * time.Second

// clusterNode is one node: its ports and data dir are kept across restarts.
type clusterNode struct {
	name                         string
	amqpPort, httpPort, linkPort int
	dataDir, logPath             string
	configPath                   string // --config, if set
	cookie                       string
	peers                        []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

func (n *clusterNode) linkAddr() string { return fmt.Sprintf("127.0.0.1:%d", n.linkPort) }
func (n *clusterNode) url() string {
	return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.amqpPort)
}

func (n *clusterNode) start(t *testing.T) {
	t.Helper()
	if err := n.launch(); err != nil {
		t.Fatal(err)
	}
}

// launch starts the node's process (with --config configPath if set), its output appended to
// its log.
func (n *clusterNode) launch() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		select {
		case <-n.exited:
		default:
			return fmt.Errorf("%s is already running", n.name)
		}
	}
	log, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(log, "=== %s starting %s\n", time.Now().Format("15:04:05.000"), n.name)
	args := []string{"server", "--node-name", n.name,
		"--data-dir", n.dataDir, "--amqp-port", fmt.Sprint(n.amqpPort), "--http-port", fmt.Sprint(n.httpPort),
		"--cluster-listen", n.linkAddr(), "--cluster-peers", strings.Join(n.peers, ",")}
	if n.configPath != "" {
		args = append(args, "--config", n.configPath)
	}
	cmd := exec.Command(os.Getenv("WARREN_BIN"), args...)
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WARREN_LOG=") && !strings.HasPrefix(kv, "WARREN_COOKIE=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "WARREN_COOKIE="+n.cookie)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %v", n.name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); log.Close(); close(exited) }()
	n.cmd, n.exited = cmd, exited
	return nil
}

func (n *clusterNode) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// signal sends sig and waits (bounded) for the exit; SIGKILL if SIGTERM is not enough.
func (n *clusterNode) signal(sig syscall.Signal) {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

func (n *clusterNode) kill9() { n.signal(syscall.SIGKILL) }
func (n *clusterNode) stop()  { n.signal(syscall.SIGTERM) }

func (n *clusterNode) logText() string {
	b, _ := os.ReadFile(n.logPath)
	return string(b)
}

// api calls the node's management API as guest: the status and the decoded JSON answer.
func (n *clusterNode) api(method, path string, body any, timeout time.Duration) (int, any, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, fmt.Sprintf("http://127.0.0.1:%d%s", n.httpPort, path), rd)
	if err != nil {
		return 0, nil, err
	}
	req.SetBasicAuth("guest", "guest")
	req.Header.Set("content-type", "application/json")
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out any
	if len(bytes.TrimSpace(raw)) > 0 {
		if json.Unmarshal(raw, &out) != nil {
			out = string(raw)
		}
	}
	return resp.StatusCode, out, nil
}

func (n *clusterNode) mustAPI(t *testing.T, method, path string, body any) (int, any) {
	t.Helper()
	st, out, err := n.api(method, path, body, 20*time.Second)
	if err != nil {
		t.Fatalf("%s %s on %s: %v", method, path, n.name, err)
	}
	return st, out
}

func (n *clusterNode) ready() bool {
	st, _, err := n.api("GET", "/api/overview", nil, 2*time.Second)
	if err != nil || st != 200 {
		return false
	}
	st, vhosts, err := n.api("GET", "/api/vhosts", nil, 2*time.Second)
	if err != nil || st != 200 {
		return false
	}
	list, _ := vhosts.([]any)
	for _, v := range list {
		if m, ok := v.(map[string]any); ok && m["name"] == "/" {
			return true
		}
	}
	return false
}

func (n *clusterNode) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(clusterReadyTimeout)
	for !n.ready() {
		if !n.running() {
			t.Fatalf("%s exited before it was ready; log:\n%s", n.name, tail(n.logText(), 6000))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer /api/overview and list vhost '/' within %v; log:\n%s",
				n.name, clusterReadyTimeout, tail(n.logText(), 6000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodesRunning is /api/nodes on n: node name -> its "running" field.
func (n *clusterNode) nodesRunning(t *testing.T) map[string]any {
	t.Helper()
	st, out := n.mustAPI(t, "GET", "/api/nodes", nil)
	if st != 200 {
		t.Fatalf("/api/nodes on %s: %d %v", n.name, st, out)
	}
	rows, _ := out.([]any)
	got := map[string]any{}
	for _, r := range rows {
		if m, ok := r.(map[string]any); ok {
			got[fmt.Sprint(m["name"])] = m["running"]
		}
	}
	return got
}

type testCluster struct {
	dir    string
	cookie string
	nodes  []*clusterNode
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// startCluster starts three nodes (skipping without WARREN_BIN) and waits until each answers
// /api/overview and lists vhost '/'. They are stopped when t ends; if t failed, their logs are
// logged first.
func startCluster(t *testing.T) *testCluster {
	t.Helper()
	if os.Getenv("WARREN_BIN") == "" {
		t.Skip("starts its own 3-node Warren cluster (WARREN_BIN); the reference RabbitMQ is a single node")
	}
	dir, err := os.MkdirTemp("", "warren-cluster-go-")
	if err != nil {
		t.Fatal(err)
	}
	c := &testCluster{dir: dir, cookie: randomHex(16)}
	for i := 1; i <= 3; i++ {
		c.nodes = append(c.nodes, c.newNode(t, i, fmt.Sprintf("warren%d@localhost", i), c.cookie))
	}
	peers := []string{}
	for _, n := range c.nodes {
		peers = append(peers, n.linkAddr())
	}
	for _, n := range c.nodes {
		n.peers = peers
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.stop()
		}
		os.RemoveAll(dir)
	})
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.nodes {
				t.Logf("--- %s (AMQP %d, HTTP %d, link %d) log ---\n%s", n.name, n.amqpPort, n.httpPort,
					n.linkPort, tail(n.logText(), 8000))
			}
		}
	})
	for _, n := range c.nodes {
		n.start(t)
	}
	for _, n := range c.nodes {
		n.waitReady(t)
	}
	return c
}

func (c *testCluster) newNode(t *testing.T, i int, name, cookie string) *clusterNode {
	t.Helper()
	ports := make([]int, 3)
	for j := range ports {
		p, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[j] = p
	}
	dataDir := filepath.Join(c.dir, fmt.Sprintf("n%d", i))
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &clusterNode{name: name, amqpPort: ports[0], httpPort: ports[1], linkPort: ports[2],
		dataDir: dataDir, logPath: filepath.Join(c.dir, fmt.Sprintf("n%d.log", i)), cookie: cookie}
}

func (c *testCluster) names() []string {
	out := []string{}
	for _, n := range c.nodes {
		out = append(out, n.name)
	}
	sort.Strings(out)
	return out
}

// connTo dials node and registers the connection for cleanup (and the watchdog).
func (c *tc) connTo(n *clusterNode) *amqp.Connection {
	c.t.Helper()
	conn, err := c.dialURL(n.url(), amqp.Config{})
	if err != nil {
		c.t.Fatalf("dial %s: %v", n.name, err)
	}
	c.mu.Lock()
	c.conns = append(c.conns, conn)
	c.mu.Unlock()
	return conn
}

// chOn opens a fresh connection to node and a channel on it.
func (c *tc) chOn(n *clusterNode) *amqp.Channel {
	c.t.Helper()
	return c.ch(c.connTo(n))
}

// queueOn declares a fresh queue through node n (its home); deleted at the end of the test.
func (c *tc) queueOn(n *clusterNode, durable bool) string {
	c.t.Helper()
	name := c.name("q")
	c.trackQueue(name)
	if _, err := c.chOn(n).QueueDeclare(name, durable, false, false, false, nil); err != nil {
		c.t.Fatalf("queue.declare %s on %s: %v", name, n.name, err)
	}
	return name
}

// clusterTC is newTC for a test on cl: the queues and exchanges it tracks are deleted through
// a running node of cl (newTC's own cleanup would use the suite's single broker).
func clusterTC(t *testing.T, cl *testCluster) *tc {
	c := newTC(t)
	t.Cleanup(func() {
		for _, n := range cl.nodes {
			if n.running() {
				deleteThrough(n, c)
				return
			}
		}
	})
	return c
}

// deleteThrough deletes c's tracked queues and exchanges through node n (best effort).
func deleteThrough(n *clusterNode, c *tc) {
	c.mu.Lock()
	queues, exchanges := c.queues, c.exchanges
	c.queues, c.exchanges = nil, nil
	c.mu.Unlock()
	if len(queues)+len(exchanges) == 0 || !n.running() {
		return
	}
	conn, err := amqp.DialConfig(n.url(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return
	}
	defer conn.CloseDeadline(time.Now().Add(5 * time.Second))
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for _, q := range queues {
		if ch.IsClosed() {
			return
		}
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	for _, x := range exchanges {
		if ch.IsClosed() {
			return
		}
		_ = ch.ExchangeDelete(x, false, false)
	}
}

func persistent(body string) amqp.Publishing {
	return amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)}
}

// confirmAll publishes each body (persistent, mandatory) on a confirm-mode channel and fails
// on a nack, or on a basic.return (no queue took it: e.g. the publishing node does not know the
// queue).
func confirmAll(t *testing.T, ch *amqp.Channel, exchange, key string, bodies []string) {
	t.Helper()
	returns := ch.NotifyReturn(make(chan amqp.Return, len(bodies)))
	for _, b := range bodies {
		if !pubConfirm(t, ch, exchange, key, true, persistent(b)) {
			t.Fatalf("publish of %q to %q/%q nacked", b, exchange, key)
		}
		select {
		case r := <-returns:
			t.Fatalf("publish of %q to %q/%q returned: %d %s", r.Body, exchange, key, r.ReplyCode, r.ReplyText)
		default:
		}
	}
}

func seq(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

func bodiesOf(ds []amqp.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = string(d.Body)
	}
	return out
}

// ---------------------------------------------------------------------------------------------

func TestCluster(t *testing.T) {
	cl := startCluster(t)
	a, b, c := cl.nodes[0], cl.nodes[1], cl.nodes[2]

	t.Run("NodesAPIListsEveryNodeRunning", func(t *testing.T) {
		for _, n := range cl.nodes {
			// Right after the cluster forms, a node that dialled a peer before it listened
			// waits out a short back-off before the next dial, and lists that peer as not
			// running meanwhile.
			got := n.nodesRunning(t)
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); got = n.nodesRunning(t) {
				all := len(got) == len(cl.nodes)
				for _, v := range got {
					all = all && v == true
				}
				if all {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			names := []string{}
			for k, v := range got {
				names = append(names, k)
				if v != true {
					t.Errorf("/api/nodes on %s: %s has running=%v", n.name, k, v)
				}
			}
			sort.Strings(names)
			if fmt.Sprint(names) != fmt.Sprint(cl.names()) {
				t.Errorf("/api/nodes on %s lists %v, want %v", n.name, names, cl.names())
			}
		}
	})

	t.Run("DeclaresVisibleOnEveryNodeAtOnce", func(t *testing.T) {
		x := clusterTC(t, cl)
		chs := []*amqp.Channel{x.chOn(a), x.chOn(b), x.chOn(c)}
		for i, src := range cl.nodes {
			for round := 0; round < 5; round++ {
				ex, qn := x.name("x"), x.name("q")
				x.trackExchange(ex)
				x.trackQueue(qn)
				if err := chs[i].ExchangeDeclare(ex, "topic", true, false, false, false, nil); err != nil {
					t.Fatal(err)
				}
				if _, err := chs[i].QueueDeclare(qn, true, false, false, false, nil); err != nil {
					t.Fatal(err)
				}
				if err := chs[i].QueueBind(qn, "a.*", ex, false, nil); err != nil {
					t.Fatal(err)
				}
				for j, other := range cl.nodes {
					if j == i {
						continue
					}
					where := fmt.Sprintf("round %d: declared on %s, checked on %s", round, src.name, other.name)
					if err := chs[j].ExchangeDeclarePassive(ex, "topic", true, false, false, false, nil); err != nil {
						t.Fatalf("%s: passive exchange.declare: %v", where, err)
					}
					if _, err := chs[j].QueueDeclarePassive(qn, true, false, false, false, nil); err != nil {
						t.Fatalf("%s: passive queue.declare: %v", where, err)
					}
					st, out := other.mustAPI(t, "GET", "/api/queues/%2F/"+esc(qn), nil)
					if st != 200 {
						t.Fatalf("%s: GET queue: %d %v", where, st, out)
					}
				}
			}
		}
	})

	t.Run("PublishOnANodeConsumeOnAnotherQueueOnAThird", func(t *testing.T) {
		// Every arrangement of (home, publisher's node, consumer's node), twice: 200 persistent
		// messages from one channel reach a single consumer complete and in publish order, and
		// the acks reach the home.
		x := clusterTC(t, cl)
		x.timer.Reset(60 * time.Second)
		want := seq("m", 200)
		for round := 0; round < 2; round++ {
			for _, arr := range [][3]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}} {
				home, via, at := cl.nodes[arr[0]], cl.nodes[arr[1]], cl.nodes[arr[2]]
				where := fmt.Sprintf("round %d: home %s, published through %s, consumed through %s", round, home.name, via.name, at.name)
				qn := x.queueOn(home, true)
				pubConn := x.connTo(via)
				confirmAll(t, x.confirmCh(pubConn), "", qn, want)
				consConn := x.connTo(at)
				cons := x.ch(consConn)
				ds, err := cons.Consume(qn, "", false, false, false, false, nil)
				if err != nil {
					t.Fatal(err)
				}
				got := recvN(t, ds, len(want))
				if fmt.Sprint(bodiesOf(got)) != fmt.Sprint(want) {
					t.Fatalf("%s: deliveries out of publish order: %v", where, bodiesOf(got))
				}
				for _, d := range got {
					if d.Redelivered || d.DeliveryMode != amqp.Persistent {
						t.Fatalf("%s: delivery %q: redelivered=%v delivery_mode=%d", where, d.Body, d.Redelivered, d.DeliveryMode)
					}
				}
				if err := got[len(got)-1].Ack(true); err != nil {
					t.Fatal(err)
				}
				eventually(t, "the home node to see every message acked ("+where+")", func() bool {
					_, q, _ := home.api("GET", "/api/queues/%2F/"+esc(qn), nil, 5*time.Second)
					m, _ := q.(map[string]any)
					return m != nil && m["messages_unacknowledged"] == float64(0) && m["messages"] == float64(0)
				})
				if st := inspect(t, x.chOn(home), qn); st.Messages != 0 || st.Consumers != 1 {
					t.Fatalf("%s: at the home: %d messages, %d consumers; want 0, 1", where, st.Messages, st.Consumers)
				}
				_ = pubConn.Close()
				_ = consConn.Close()
			}
		}
	})

	t.Run("EveryExchangeTypeAcrossNodes", func(t *testing.T) {
		x := clusterTC(t, cl)
		for _, kind := range []string{"direct", "fanout", "topic", "headers"} {
			ex := x.exchange(x.chOn(a), kind) // declared through a
			qb, qc := x.queueOn(b, false), x.queueOn(c, false)
			binder := x.chOn(c)
			bind := func(q, key string, args amqp.Table) {
				if err := binder.QueueBind(q, key, ex, false, args); err != nil {
					t.Fatalf("%s: bind %s %q: %v", kind, q, key, err)
				}
			}
			type pubCase struct {
				key     string
				headers amqp.Table
				to      []string
			}
			var cases []pubCase
			switch kind {
			case "direct":
				bind(qb, "k1", nil)
				bind(qc, "k2", nil)
				cases = []pubCase{{"k1", nil, []string{qb}}, {"k2", nil, []string{qc}}, {"k3", nil, nil}}
			case "fanout":
				bind(qb, "", nil)
				bind(qc, "x", nil)
				cases = []pubCase{{"any", nil, []string{qb, qc}}}
			case "topic":
				bind(qb, "a.*", nil)
				bind(qc, "#.z", nil)
				cases = []pubCase{{"a.b", nil, []string{qb}}, {"x.y.z", nil, []string{qc}},
					{"a.z", nil, []string{qb, qc}}, {"b.a", nil, nil}}
			case "headers":
				bind(qb, "", amqp.Table{"x-match": "all", "h": "1", "g": "2"})
				bind(qc, "", amqp.Table{"x-match": "any", "h": "1", "g": "3"})
				cases = []pubCase{{"r1", amqp.Table{"h": "1", "g": "2"}, []string{qb, qc}},
					{"r2", amqp.Table{"g": "3"}, []string{qc}}, {"r3", amqp.Table{"h": "2"}, nil}}
			}
			pub := x.confirmCh(x.connTo(a))
			returns := pub.NotifyReturn(make(chan amqp.Return, 10))
			want := map[string][]string{qb: nil, qc: nil}
			for i, pc := range cases {
				body := fmt.Sprintf("%s-%d", kind, i)
				if !pubConfirm(t, pub, ex, pc.key, true, amqp.Publishing{Headers: pc.headers, Body: []byte(body)}) {
					t.Fatalf("%s: publish %q nacked", kind, pc.key)
				}
				if len(pc.to) == 0 {
					select {
					case r := <-returns:
						if r.ReplyCode != 312 || string(r.Body) != body {
							t.Fatalf("%s: return %d %q for %q", kind, r.ReplyCode, r.Body, body)
						}
					case <-time.After(waitTimeout):
						t.Fatalf("%s: unroutable mandatory publish %q not returned", kind, pc.key)
					}
				}
				for _, q := range pc.to {
					want[q] = append(want[q], body)
				}
			}
			if got := drainBodies(t, x.chOn(c), qb); fmt.Sprint(got) != fmt.Sprint(want[qb]) {
				t.Fatalf("%s: queue on %s read through %s: %v, want %v", kind, b.name, c.name, got, want[qb])
			}
			if got := drainBodies(t, x.chOn(a), qc); fmt.Sprint(got) != fmt.Sprint(want[qc]) {
				t.Fatalf("%s: queue on %s read through %s: %v, want %v", kind, c.name, a.name, got, want[qc])
			}
			select {
			case r := <-returns:
				t.Fatalf("%s: unexpected return %d %q", kind, r.ReplyCode, r.Body)
			default:
			}
		}
	})

	t.Run("GetRejectRequeueAcrossNodes", func(t *testing.T) {
		x := clusterTC(t, cl)
		qn := x.queueOn(b, false)
		confirmAll(t, x.confirmCh(x.connTo(c)), "", qn, []string{"first"})
		ch := x.chOn(a)
		d, ok, err := ch.Get(qn, false)
		if err != nil || !ok || string(d.Body) != "first" || d.Redelivered {
			t.Fatalf("first get through %s: ok=%v err=%v body=%q redelivered=%v", a.name, ok, err, d.Body, d.Redelivered)
		}
		if err := d.Reject(true); err != nil {
			t.Fatal(err)
		}
		other := x.chOn(c)
		var again amqp.Delivery
		eventually(t, "the requeued message", func() bool {
			var err error
			again, ok, err = other.Get(qn, false)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		})
		if string(again.Body) != "first" || !again.Redelivered {
			t.Fatalf("second get through %s: body=%q redelivered=%v", c.name, again.Body, again.Redelivered)
		}
		if err := again.Ack(false); err != nil {
			t.Fatal(err)
		}
		waitMessageCount(t, x.chOn(b), qn, 0)
		if _, ok, _ := other.Get(qn, false); ok {
			t.Fatal("the acked message came back")
		}
	})

	t.Run("PrefetchAcrossNodes", func(t *testing.T) {
		x := clusterTC(t, cl)
		qn := x.queueOn(b, false)
		confirmAll(t, x.confirmCh(x.connTo(a)), "", qn, seq("m", 10))
		cons := x.chOn(c)
		if err := cons.Qos(3, 0, false); err != nil {
			t.Fatal(err)
		}
		ds, err := cons.Consume(qn, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := recvN(t, ds, 3)
		expectNoDelivery(t, ds, 500*time.Millisecond)
		if err := got[0].Ack(false); err != nil {
			t.Fatal(err)
		}
		got = append(got, recv(t, ds))
		expectNoDelivery(t, ds, 500*time.Millisecond)
		if err := got[3].Ack(true); err != nil {
			t.Fatal(err)
		}
		got = append(got, recvN(t, ds, 3)...)
		expectNoDelivery(t, ds, 500*time.Millisecond)
		if err := got[6].Ack(true); err != nil {
			t.Fatal(err)
		}
		got = append(got, recvN(t, ds, 3)...)
		if fmt.Sprint(bodiesOf(got)) != fmt.Sprint(seq("m", 10)) {
			t.Fatalf("deliveries: %v", bodiesOf(got))
		}
	})

	t.Run("ClosingAChannelRequeuesItsUnacked", func(t *testing.T) {
		x := clusterTC(t, cl)
		qn := x.queueOn(b, false)
		confirmAll(t, x.confirmCh(x.connTo(a)), "", qn, seq("m", 3))
		cons := x.chOn(c)
		ds, err := cons.Consume(qn, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		recvN(t, ds, 3)
		if err := cons.Close(); err != nil {
			t.Fatal(err)
		}
		ch := x.chOn(a)
		var got []amqp.Delivery
		eventually(t, "the 3 requeued messages", func() bool {
			d, ok, err := ch.Get(qn, true)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				got = append(got, d)
			}
			return len(got) == 3
		})
		for i, d := range got {
			if string(d.Body) != fmt.Sprintf("m-%d", i) || !d.Redelivered {
				t.Fatalf("after the close, get %d: %q redelivered=%v", i, d.Body, d.Redelivered)
			}
		}
	})

	t.Run("DeclareOkCountsPurgeDeleteAcrossNodes", func(t *testing.T) {
		x := clusterTC(t, cl)
		qn := x.queueOn(b, true)
		confirmAll(t, x.confirmCh(x.connTo(c)), "", qn, seq("m", 5))
		q, err := x.chOn(a).QueueDeclare(qn, true, false, false, false, nil)
		if err != nil || q.Messages != 5 || q.Consumers != 0 {
			t.Fatalf("declare-ok through %s: %+v %v; want 5 messages, 0 consumers", a.name, q, err)
		}
		for i := 0; i < 2; i++ {
			ch := x.chOn(a)
			if err := ch.Qos(1, 0, false); err != nil {
				t.Fatal(err)
			}
			ds, err := ch.Consume(qn, "", false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			recv(t, ds)
		}
		if q := inspect(t, x.chOn(c), qn); q.Messages != 3 || q.Consumers != 2 {
			t.Fatalf("passive declare-ok through %s: %+v; want 3 messages, 2 consumers", c.name, q)
		}
		n, err := x.chOn(c).QueuePurge(qn, false)
		if err != nil || n != 3 {
			t.Fatalf("purge through %s: %d %v; want 3", c.name, n, err)
		}
		n, err = x.chOn(c).QueueDelete(qn, false, false, false)
		if err != nil {
			t.Fatalf("delete through %s: %v", c.name, err)
		}
		for _, nd := range cl.nodes {
			_, err := x.chOn(nd).QueueDeclarePassive(qn, true, false, false, false, nil)
			if e := expectCode(t, err, 404, "passive declare after delete on "+nd.name); !strings.Contains(e.Reason, "no queue") {
				t.Fatalf("on %s: %s", nd.name, e.Reason)
			}
		}
	})

	t.Run("MandatoryToUnboundExchangeIsReturned", func(t *testing.T) {
		x := clusterTC(t, cl)
		ex := x.exchange(x.chOn(a), "direct")
		pub := x.chOn(c)
		returns := pub.NotifyReturn(make(chan amqp.Return, 1))
		closed := pub.NotifyClose(make(chan *amqp.Error, 1))
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := pub.PublishWithContext(ctx, ex, "nowhere", true, false, amqp.Publishing{Body: []byte("lost")}); err != nil {
			t.Fatal(err)
		}
		select {
		case e := <-closed:
			t.Fatalf("the publishing channel on %s was closed instead: %v", c.name, e)
		case r, ok := <-returns:
			if !ok {
				t.Fatalf("the publishing channel on %s was closed instead: %v", c.name, <-closed)
			}
			if r.ReplyCode != 312 || r.ReplyText != "NO_ROUTE" || r.Exchange != ex || r.RoutingKey != "nowhere" || string(r.Body) != "lost" {
				t.Fatalf("return: %d %q %q %q %q", r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey, r.Body)
			}
		case <-timeAfter():
			t.Fatal("no basic.return for a mandatory publish to an unbound exchange")
		}
	})

	t.Run("ExclusiveQueueLockedOnOtherNodesAndRPC", func(t *testing.T) {
		x := clusterTC(t, cl)
		owner := x.connTo(a)
		och := x.ch(owner)
		qn := x.name("excl")
		if _, err := och.QueueDeclare(qn, false, false, true, false, nil); err != nil {
			t.Fatal(err)
		}
		for _, n := range []*clusterNode{b, c} {
			_, err := x.chOn(n).QueueDeclare(qn, false, false, true, false, nil)
			e := expectCode(t, err, 405, "exclusive declare through "+n.name)
			if !strings.HasPrefix(e.Reason, "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '"+qn+"'") {
				t.Fatalf("declare through %s: %q", n.name, e.Reason)
			}
			_, err = x.chOn(n).Consume(qn, "", false, false, false, false, nil)
			expectCode(t, err, 405, "consume through "+n.name)
		}

		// RPC: client on a with an exclusive reply queue, request queue homed on c, server on b.
		rq := x.queueOn(c, false)
		server := x.chOn(b)
		reqs, err := server.Consume(rq, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		defer close(done)
		go func() {
			for {
				select {
				case d, ok := <-reqs:
					if !ok {
						return
					}
					ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
					_ = server.PublishWithContext(ctx, "", d.ReplyTo, false, false, amqp.Publishing{
						CorrelationId: d.CorrelationId, Body: bytes.ToUpper(d.Body)})
					cancel()
					_ = d.Ack(false)
				case <-done:
					return
				}
			}
		}()
		replyQ, err := och.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		replies, err := och.Consume(replyQ.Name, "", true, true, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 5; i++ {
			corr := randomHex(8)
			publishMsg(t, och, "", rq, amqp.Publishing{ReplyTo: replyQ.Name, CorrelationId: corr,
				Body: []byte(fmt.Sprintf("request %d", i))})
			r := recv(t, replies)
			if r.CorrelationId != corr || string(r.Body) != fmt.Sprintf("REQUEST %d", i) {
				t.Fatalf("reply %d: %q %q", i, r.CorrelationId, r.Body)
			}
		}
	})

	t.Run("NodeWithAnotherCookieIsRefused", func(t *testing.T) {
		outsider := cl.newNode(t, 9, "warren9@localhost", "not-"+cl.cookie)
		minPeer := a.linkAddr()
		for _, n := range cl.nodes {
			if n.linkAddr() < minPeer {
				minPeer = n.linkAddr()
			}
		}
		// Its link address must not sort first, or it would start a cluster of its own.
		for outsider.linkAddr() < minPeer {
			p, err := freePort()
			if err != nil {
				t.Fatal(err)
			}
			outsider.linkPort = p
		}
		outsider.peers = append(append([]string{}, a.peers...), outsider.linkAddr())
		marks := map[string]int{}
		for _, n := range cl.nodes {
			marks[n.name] = len(n.logText())
		}
		outsider.start(t)
		defer outsider.kill9()
		deadline := time.Now().Add(10 * time.Second)
		for {
			refusedHere := false
			for _, n := range cl.nodes {
				if strings.Contains(n.logText()[marks[n.name]:], "inter-node connection refused") {
					refusedHere = true
				}
			}
			if refusedHere && strings.Contains(outsider.logText(), "does not hold this cluster's cookie") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no refusal logged within 10s; outsider's log:\n%s", tail(outsider.logText(), 4000))
			}
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(time.Second)
		if strings.Contains(outsider.logText(), "joined the cluster") || strings.Contains(outsider.logText(), "cluster started on this node") {
			t.Fatalf("the outsider joined or started a cluster:\n%s", tail(outsider.logText(), 4000))
		}
		for _, n := range cl.nodes {
			if strings.Contains(n.logText(), "peer="+outsider.name) {
				t.Fatalf("%s opened a link to the outsider", n.name)
			}
			if _, listed := n.nodesRunning(t)[outsider.name]; listed {
				t.Fatalf("/api/nodes on %s lists the outsider", n.name)
			}
		}
	})
}

// declareExchangeRetry declares exchange ex (fanout, durable) through n on a fresh connection
// each try until it succeeds (a new Raft leader may take a few seconds).
func declareExchangeRetry(t *testing.T, n *clusterNode, ex string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		conn, err := amqp.DialConfig(n.url(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err == nil {
			ch, cerr := conn.Channel()
			if cerr == nil {
				last = ch.ExchangeDeclare(ex, "fanout", true, false, false, false, nil)
			} else {
				last = cerr
			}
			_ = conn.CloseDeadline(time.Now().Add(2 * time.Second))
			if last == nil {
				return
			}
		} else {
			last = err
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("exchange.declare through %s still failing after %v: %v", n.name, within, last)
}

func waitRunning(t *testing.T, nodes []*clusterNode, want map[string]bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ok := true
		seen := map[string]map[string]any{}
		for _, n := range nodes {
			got := n.nodesRunning(t)
			seen[n.name] = got
			for name, w := range want {
				if got[name] != w {
					ok = false
				}
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/api/nodes did not report %v within 15s: %v", want, seen)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestClusterNodeLoss kills the home node of a queue, then two nodes of three, in a cluster of
// its own; each step brings the killed nodes back.
func TestClusterNodeLoss(t *testing.T) {
	cl := startCluster(t)
	a, b, victim := cl.nodes[0], cl.nodes[1], cl.nodes[2]

	t.Run("HomeNodeKilledAndRestarted", func(t *testing.T) {
		defer func() {
			if !victim.running() {
				victim.start(t)
				victim.waitReady(t)
			}
		}()
		x := newTC(t)
		x.timer.Reset(80 * time.Second)
		qn, rn := x.name("homed-on-victim"), x.name("homed-on-a")
		vconn := x.connTo(victim)
		vclosed := vconn.NotifyClose(make(chan *amqp.Error, 1))
		if _, err := x.ch(vconn).QueueDeclare(qn, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := x.chOn(a).QueueDeclare(rn, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		want := seq("keep", 20)
		confirmAll(t, x.confirmCh(x.connTo(a)), "", qn, want)

		victim.kill9()

		downText := fmt.Sprintf("NOT_FOUND - home node '%s' of durable queue '%s' in vhost '/' is down or inaccessible", victim.name, qn)
		for _, n := range []*clusterNode{a, b} {
			var last error
			deadline := time.Now().Add(10 * time.Second)
			for {
				_, last = x.chOn(n).QueueDeclarePassive(qn, true, false, false, false, nil)
				if e := amqpErr(last); e != nil && e.Code == 404 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("passive declare of %s through %s after its home was killed: %v", qn, n.name, last)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if e := amqpErr(last); e.Reason != downText {
				t.Fatalf("through %s: %q, want %q", n.name, e.Reason, downText)
			}
		}
		if pubConfirm(t, x.confirmCh(x.connTo(b)), "", qn, false, persistent("to-a-dead-home")) {
			t.Fatal("a publish to a queue whose home is down was acked")
		}
		// Queues homed on the survivors keep working.
		confirmAll(t, x.confirmCh(x.connTo(b)), "", rn, []string{"alive"})
		if got := drainBodies(t, x.chOn(a), rn); fmt.Sprint(got) != "[alive]" {
			t.Fatalf("queue on a survivor: %v", got)
		}
		// Metadata changes go on with 2 of 3 (after an election if the victim led).
		ex := x.name("after-kill")
		declareExchangeRetry(t, b, ex, 20*time.Second)
		waitRunning(t, []*clusterNode{a, b}, map[string]bool{a.name: true, b.name: true, victim.name: false})

		// The victim's client notices and carries on through another node.
		if e := waitErr(t, vclosed, "the killed node's connection"); e == nil {
			t.Fatal("no error for the killed node's connection")
		}
		again := x.connTo(a)
		ch := x.confirmCh(again)
		confirmAll(t, ch, "", rn, []string{"after-reconnect"})
		if got := drainBodies(t, ch, rn); fmt.Sprint(got) != "[after-reconnect]" {
			t.Fatalf("after reconnecting: %v", got)
		}

		victim.start(t)
		victim.waitReady(t)
		var q amqp.Queue
		var err error
		deadline := time.Now().Add(15 * time.Second)
		for {
			q, err = x.chOn(a).QueueDeclarePassive(qn, true, false, false, false, nil)
			if err == nil && q.Messages == 20 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after the restart, passive declare through %s: %+v %v; want 20 messages", a.name, q, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		ds, err := x.chOn(b).Consume(qn, "", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := bodiesOf(recvN(t, ds, 20)); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("after the restart: %v", got)
		}
		waitRunning(t, cl.nodes, map[string]bool{a.name: true, b.name: true, victim.name: true})
	})

	t.Run("MajorityDownRefusesThenRecovers", func(t *testing.T) {
		survivor, d1, d2 := a, b, victim
		defer func() {
			for _, n := range []*clusterNode{d1, d2} {
				if !n.running() {
					n.start(t)
				}
			}
			for _, n := range []*clusterNode{d1, d2} {
				n.waitReady(t)
			}
		}()
		d1.kill9()
		d2.kill9()
		ex := "go-interop-no-majority-" + randomHex(6)
		type outcome struct {
			err     error
			elapsed time.Duration
		}
		res := make(chan outcome, 1)
		go func() {
			t0 := time.Now()
			conn, err := amqp.DialConfig(survivor.url(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
			if err != nil {
				res <- outcome{err, time.Since(t0)}
				return
			}
			defer conn.CloseDeadline(time.Now().Add(2 * time.Second))
			ch, err := conn.Channel()
			if err == nil {
				err = ch.ExchangeDeclare(ex, "direct", false, false, false, false, nil)
			}
			res <- outcome{err, time.Since(t0)}
		}()
		var o outcome
		select {
		case o = <-res:
		case <-time.After(25 * time.Second):
			t.Fatal("exchange.declare without a majority got no answer within 25s")
		}
		if o.err == nil {
			t.Fatal("exchange.declare without a majority succeeded")
		}
		var e *amqp.Error
		if !errors.As(o.err, &e) || !strings.Contains(e.Reason, "no majority") {
			t.Fatalf("exchange.declare without a majority: %v (want an AMQP close saying the cluster has no majority)", o.err)
		}
		d1.start(t)
		d2.start(t)
		d1.waitReady(t)
		d2.waitReady(t)
		declareExchangeRetry(t, survivor, "go-interop-after-majority-"+randomHex(6), 20*time.Second)
		waitRunning(t, cl.nodes, map[string]bool{a.name: true, b.name: true, victim.name: true})
	})
}
